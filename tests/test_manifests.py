"""The static manifests: install kustomization, RBAC, operator Deployment and the sample pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from phoenix.crds import PhoenixStage
from phoenix.operator.builders import resolve_streams
from phoenix.operator.builders.security import container_security_context, pod_security_context

MANIFESTS = Path(__file__).resolve().parents[1] / "manifests"


def load(relative: str) -> dict[str, Any]:
    return yaml.safe_load((MANIFESTS / relative).read_text())


def kustomization_documents(directory: Path) -> list[dict[str, Any]]:
    resources = yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]
    return [doc for name in resources for doc in yaml.safe_load_all((directory / name).read_text())]


def by_kind(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents if doc["kind"] == kind]


def test_install_kustomization_covers_every_manifest_outside_samples() -> None:
    listed = set(yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"])
    on_disk = {
        str(path.relative_to(MANIFESTS))
        for path in MANIFESTS.rglob("*.yaml")
        if path.parent.name not in ("samples", "dev") and path.name != "kustomization.yaml"
    }
    assert listed == on_disk


def test_samples_kustomization_covers_every_sample() -> None:
    samples = MANIFESTS / "samples"
    listed = set(yaml.safe_load((samples / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in samples.glob("*.yaml") if p.name != "kustomization.yaml"}


def test_install_creates_namespace_rbac_operator_and_crd() -> None:
    kinds = sorted(doc["kind"] for doc in kustomization_documents(MANIFESTS))
    assert kinds == sorted(
        ["CustomResourceDefinition", "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"]
    )


@pytest.fixture(scope="module")
def sample_stages() -> dict[str, PhoenixStage]:
    documents = kustomization_documents(MANIFESTS / "samples")
    stages = [PhoenixStage.model_validate(doc) for doc in by_kind(documents, "PhoenixStage")]
    return {stage.metadata.name: stage for stage in stages}


def test_samples_form_the_router_parser_grouper_pipeline(sample_stages: dict[str, PhoenixStage]) -> None:
    streams = {name: resolve_streams(name, stage.spec) for name, stage in sample_stages.items()}
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


def test_operator_deployment_runs_kopf_hardened_and_alone() -> None:
    deployment = load("operator/deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    (operator,) = pod["containers"]
    assert deployment["metadata"]["namespace"] == "phoenix-system"
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert operator["command"] == ["phoenix", "operator"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in operator["args"]
    assert operator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in operator["ports"]
    assert pod["securityContext"] == pod_security_context()
    assert operator["securityContext"] == container_security_context()
    assert pod["serviceAccountName"] == load("rbac/service-account.yaml")["metadata"]["name"]


def rbac_rules() -> dict[tuple[str, str], set[str]]:
    verbs: dict[tuple[str, str], set[str]] = {}
    for rule in load("rbac/cluster-role.yaml")["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                verbs.setdefault((group, resource), set()).update(rule["verbs"])
    return verbs


def test_cluster_role_is_least_privilege() -> None:
    rules = rbac_rules()
    assert all("*" not in group + resource and "*" not in verbs for (group, resource), verbs in rules.items())
    assert rules[("", "secrets")] == {"get"}
    assert "create" not in rules[("phoenix.io", "phoenixstages")]
    assert "delete" not in rules[("phoenix.io", "phoenixstages")]
    assert ("", "pods") not in rules
    assert rules[("", "namespaces")] == {"list", "watch"}


def test_cluster_role_lets_the_operator_manage_what_the_builders_build() -> None:
    rules = rbac_rules()
    manage = {"get", "list", "watch", "create", "update", "patch", "delete"}
    for child in (("apps", "deployments"), ("keda.sh", "scaledobjects"), ("keda.sh", "triggerauthentications")):
        assert rules[child] == manage
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
