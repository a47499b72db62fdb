"""The static manifests: install kustomization, RBAC, operator Deployment and the sample pipeline."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from phoenix.crds import PhoenixStage
from phoenix.crds.pipeline import PhoenixPipeline
from phoenix.operator.builders import resolve_streams
from phoenix.operator.builders.security import container_security_context, pod_security_context
from phoenix.operator.options import DEFAULT_LEASE_NAME
from tests.fixtures.control_plane import kube_bin_dir

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"


def load(relative: str) -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / relative).read_text())


def kustomization_documents(directory: Path) -> list[dict[str, Any]]:
    """The documents a kustomization lists, those of the kustomizations it lists included (patches not applied)."""
    documents = []
    for name in yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]:
        path = directory / name
        if path.is_dir():
            documents += kustomization_documents(path)
        else:
            documents += yaml.safe_load_all(path.read_text())
    return documents


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents if doc["kind"] == kind]


KUSTOMIZATIONS = sorted(path.parent for path in MANIFESTS.rglob("kustomization.yaml"))


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda path: str(path.relative_to(MANIFESTS.parent)))
def test_every_manifest_is_in_the_kustomization_of_its_directory(directory: Path) -> None:
    listed = set(yaml.safe_load((directory / "kustomization.yaml").read_text()).get("resources", []))
    files = {path.name for path in directory.glob("*.yaml") if path.name != "kustomization.yaml"}
    assert files <= listed
    assert all((directory / name).exists() for name in listed)


def test_install_is_the_crd_the_operator_and_its_rbac() -> None:
    assert yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"] == ["crds", "operator", "rbac"]


def test_install_creates_namespace_rbac_operator_and_crd() -> None:
    kinds = sorted(doc["kind"] for doc in kustomization_documents(MANIFESTS))
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
            "PodDisruptionBudget",
        ]
    )


@pytest.fixture(scope="module")
def sample_stages() -> dict[str, PhoenixStage]:
    documents = kustomization_documents(MANIFESTS / "samples")
    stages = [PhoenixStage.model_validate(doc) for doc in by_kind(documents, "PhoenixStage")]
    return {stage.metadata.name: stage for stage in stages}


def test_samples_form_the_router_parser_grouper_pipeline(sample_stages: dict[str, PhoenixStage]) -> None:
    streams = {name: resolve_streams(name, stage.namespace, stage.spec) for name, stage in sample_stages.items()}
    assert streams["router"].output == streams["parser"].input
    assert streams["parser"].output == streams["grouper"].input
    assert streams["grouper"].output is None
    assert {stage.spec.processor for stage in sample_stages.values()} == {"router", "parser", "grouper"}


def test_samples_reference_the_sample_secret_keys(sample_stages: dict[str, PhoenixStage]) -> None:
    (secret,) = by_kind(kustomization_documents(MANIFESTS / "samples"), "Secret")
    for stage in sample_stages.values():
        for ref in (stage.spec.redis.url_secret_ref, stage.spec.redis.password_secret_ref):
            assert ref is not None and ref.name == secret["metadata"]["name"]
            assert ref.key in secret["stringData"]
    url, password = secret["stringData"]["url"], secret["stringData"]["password"]
    assert f":{password}@" in url  # the two keys describe the same credentials


def test_dev_overlay_adds_the_redis_the_samples_point_at() -> None:
    dev = MANIFESTS / "dev"
    assert yaml.safe_load((dev / "kustomization.yaml").read_text())["resources"] == ["../samples", "valkey.yaml"]
    (secret,) = by_kind(kustomization_documents(MANIFESTS / "samples"), "Secret")
    documents = list(yaml.safe_load_all((dev / "valkey.yaml").read_text()))
    (service,) = by_kind(documents, "Service")
    (deployment,) = by_kind(documents, "Deployment")
    assert f"@{service['metadata']['name']}:{service['spec']['ports'][0]['port']}/" in secret["stringData"]["url"]
    (valkey,) = deployment["spec"]["template"]["spec"]["containers"]
    (password,) = valkey["env"]
    assert password["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "password"}
    assert valkey["args"][:2] == ["--requirepass", f"$({password['name']})"]
    assert valkey["securityContext"]["readOnlyRootFilesystem"] is True


def test_operator_deployment_runs_two_hardened_replicas_with_leader_election() -> None:
    deployment = load("operator/deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (operator,) = pod["containers"]
    assert deployment["metadata"]["namespace"] == "phoenix-system"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert operator["command"] == ["phoenix", "operator"]
    assert {"--metrics-port=8080", "--leader-election"} <= set(operator["args"])
    # The Lease's namespace: the operator's own.
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in operator["env"]
    # Liveness: the loop answers; readiness: the API server answers this replica (main.ApiReachability).
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert operator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in operator["ports"]
    assert pod["securityContext"] == pod_security_context()
    assert operator["securityContext"] == container_security_context()
    assert pod["serviceAccountName"] == load("rbac/service-account.yaml")["metadata"]["name"]
    budget = load("operator/pod-disruption-budget.yaml")
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_leader_election_role_grants_only_the_lease_in_the_operator_namespace() -> None:
    role, binding = load("rbac/leader-election-role.yaml"), load("rbac/leader-election-role-binding.yaml")
    account = load("rbac/service-account.yaml")["metadata"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == account["namespace"]
    grants = {(verb, tuple(rule.get("resourceNames", ()))) for rule in role["rules"] for verb in rule["verbs"]}
    assert grants == {("create", ()), ("get", (DEFAULT_LEASE_NAME,)), ("update", (DEFAULT_LEASE_NAME,))}
    assert {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]} == {
        ("coordination.k8s.io", "leases")
    }
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


def rbac_rules(relative: str = "rbac/cluster-role.yaml") -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in load(relative)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


def test_cluster_role_is_least_privilege() -> None:
    rules = rbac_rules()
    assert all("*" not in group + resource and "*" not in verbs for (group, resource), verbs in rules.items())
    assert rules[("", "secrets")] == {"get"}
    # create and delete: a PhoenixPipeline's stages (the operator creates and deletes those it owns only).
    assert rules[("phoenix.io", "phoenixstages")] == {"get", "list", "watch", "create", "patch", "update", "delete"}
    # A pipeline is its user's: watched, its replay annotation removed once passed on, its status written.
    assert rules[("phoenix.io", "phoenixpipelines")] == {"get", "list", "watch", "patch"}
    assert rules[("phoenix.io", "phoenixpipelines/status")] == {"patch"}
    assert rules[("phoenix.io", "phoenixpipelines/finalizers")] == {"update"}
    assert ("", "pods") not in rules
    assert rules[("", "namespaces")] == {"list", "watch", "get"}
    # get: of kube-system alone (the cluster's identity, its uid).
    [get] = [
        r for r in load("rbac/cluster-role.yaml")["rules"] if r["resources"] == ["namespaces"] and "get" in r["verbs"]
    ]
    assert get["resourceNames"] == ["kube-system"] and get["verbs"] == ["get"]


def test_cluster_role_lets_the_operator_manage_what_the_builders_build() -> None:
    rules = rbac_rules()
    manage = {"get", "list", "watch", "create", "update", "patch", "delete"}
    for child in (("apps", "deployments"), ("keda.sh", "scaledobjects"), ("keda.sh", "triggerauthentications")):
        assert rules[child] == manage
    # The PodDisruptionBudget is only merge-patched, never replaced: no update.
    assert rules[("policy", "poddisruptionbudgets")] == manage - {"update"}
    assert {"patch", "update"} <= rules[("phoenix.io", "phoenixstages/status")]
    assert {"get", "list", "watch", "patch"} <= rules[("phoenix.io", "phoenixstages")]
    assert {"create", "patch"} <= rules[("", "events")]
    assert {"create", "patch"} <= rules[("events.k8s.io", "events")]
    assert {"list", "watch"} <= rules[("apiextensions.k8s.io", "customresourcedefinitions")]


def test_binding_grants_the_role_to_the_operator_service_account() -> None:
    binding = load("rbac/cluster-role-binding.yaml")
    account = load("rbac/service-account.yaml")["metadata"]
    assert binding["roleRef"]["name"] == load("rbac/cluster-role.yaml")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


# Cluster-scoped resources the cluster-wide operator reads, which the namespaced one goes without.
CLUSTER_ONLY = {("apiextensions.k8s.io", "customresourcedefinitions"), ("", "namespaces")}


def test_redis_acl_install_adds_only_the_user_secrets_rights_and_the_admin_secret_option() -> None:
    kustomization = load("redis-acl/kustomization.yaml")
    assert kustomization["resources"] == [
        "../crds",
        "../operator",
        "../rbac",
        "cluster-role.yaml",
        "cluster-role-binding.yaml",
    ]
    (arg_patch,) = kustomization["patches"]
    assert yaml.safe_load(arg_patch["patch"])[0]["value"] == "--redis-acl-admin-secret=phoenix-redis-admin"
    rules = load("redis-acl/cluster-role.yaml")["rules"]
    assert rules == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["phoenix-redis-user"],
            "verbs": ["update", "delete"],
        },
    ]
    binding, account = load("redis-acl/cluster-role-binding.yaml"), load("rbac/service-account.yaml")["metadata"]
    assert binding["roleRef"]["name"] == "phoenix-operator-redis-acl"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]
    # Without it, the operator writes no Secret.
    assert rbac_rules()[("", "secrets")] == {"get"}


def test_namespaced_role_is_the_cluster_role_without_cluster_scoped_rights() -> None:
    rules = rbac_rules("namespaced/role.yaml")
    cluster = rbac_rules()
    assert rules == {key: verbs for key, verbs in cluster.items() if key not in CLUSTER_ONLY}
    assert rules[("", "secrets")] == {"get"}


def test_namespaced_install_swaps_cluster_rights_for_roles_in_the_served_namespace() -> None:
    kustomization = load("namespaced/kustomization.yaml")
    role, binding = load("namespaced/role.yaml"), load("namespaced/role-binding.yaml")
    account = load("rbac/service-account.yaml")["metadata"]
    assert kustomization["resources"] == ["../crds", "../operator", "../rbac", "role.yaml", "role-binding.yaml"]
    deletions = [yaml.safe_load(p["patch"]) for p in kustomization["patches"] if "target" not in p]
    assert {(d["$patch"], d["kind"]) for d in deletions} == {
        ("delete", "ClusterRole"),
        ("delete", "ClusterRoleBinding"),
    }
    (arg_patch,) = [p for p in kustomization["patches"] if "target" in p]
    (operation,) = yaml.safe_load(arg_patch["patch"])
    served = role["metadata"]["namespace"]
    assert operation["value"] == f"--namespace={served}"
    assert binding["metadata"]["namespace"] == served
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "phoenix-operator"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
    ]


# -- manifests/network-policy ---------------------------------------------------------------------------------------

NETWORK_POLICY = MANIFESTS / "network-policy"


def network_policy_overlay() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in kustomization_documents(NETWORK_POLICY)}


def test_every_rule_of_the_network_policies_names_its_peers() -> None:
    """No rule opens a port to any address or admits any source: each names its peers."""
    for policy in network_policy_overlay().values():
        assert all(rule.get("from") for rule in policy["spec"]["ingress"])
        assert all(rule.get("to") for rule in policy["spec"]["egress"])


def test_the_network_policies_redis_peer_selects_the_dev_overlays_redis() -> None:
    """The overlay's Redis peer is manifests/dev/'s Valkey, in the namespace where the samples and it run."""
    (redis,) = by_kind(list(yaml.safe_load_all((MANIFESTS / "dev" / "valkey.yaml").read_text())), "Deployment")
    labels = redis["spec"]["template"]["metadata"]["labels"]
    policies = network_policy_overlay()
    namespace = policies["phoenix-workers"]["metadata"]["namespace"]
    for name, index in (("phoenix-workers", 0), ("phoenix-operator", 1)):
        rule = policies[name]["spec"]["egress"][index]
        assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
        [peer] = rule["to"]
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        assert peer["podSelector"]["matchLabels"].items() <= labels.items()


def documented_patches() -> str:
    """The `patches:` the overlay's kustomization.yaml shows in its header comment, uncommented."""
    lines = (NETWORK_POLICY / "kustomization.yaml").read_text().splitlines()
    start = lines.index("#     patches:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#     "):
            break
        block.append(line.removeprefix("#     "))
    return "\n".join(block) + "\n"


@pytest.mark.kube
def test_the_documented_patches_of_the_network_policies_set_what_they_say(tmp_path: Path) -> None:
    """kustomize with the header's patches: the operator's API server, the workers' Redis with Sentinel's port and a
    processor's API, as the comment describes them."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    resources = f"resources: [{os.path.relpath(NETWORK_POLICY, overlay)}]\n"
    (overlay / "kustomization.yaml").write_text(resources + documented_patches())
    kubectl = kube_bin_dir() / "kubectl"
    result = subprocess.run([str(kubectl), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    policies = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(result.stdout)}
    operator, workers = policies["phoenix-operator"]["spec"], policies["phoenix-workers"]["spec"]
    assert operator["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}]
    redis_namespace = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "redis"}}}
    assert workers["egress"][0] == {
        "to": [redis_namespace],
        "ports": [{"port": 6379, "protocol": "TCP"}, {"port": 26379, "protocol": "TCP"}],
    }
    assert workers["egress"][-1] == {
        "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
        "ports": [{"port": 443, "protocol": "TCP"}],
    }


def test_the_sample_pipeline_runs_the_sample_stages_specs(sample_stages: dict[str, PhoenixStage]) -> None:
    """manifests/samples/pipeline is the same pipeline as the three stage manifests beside it, as one object."""
    (document,) = kustomization_documents(MANIFESTS / "samples" / "pipeline")
    pipeline = PhoenixPipeline.model_validate(document)
    assert [entry.name for entry in pipeline.spec.stages] == ["router", "parser", "grouper"]
    assert {entry.name: entry.spec for entry in pipeline.spec.stages} == {
        name: stage.spec for name, stage in sample_stages.items()
    }
