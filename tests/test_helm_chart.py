"""charts/phoenix: `helm lint` and `helm template` with every documented values set (charts/phoenix/ci/), a
server-side dry-run of what they render, values.schema.json refusing typos, and the chart rendering with its
defaults exactly the objects of manifests/ (kustomize), so the two cannot drift apart.

helm comes from hack/build-helm.sh (`make helm`, part of `make test`; tests/fixtures/helm.py)."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from phoenix.crds import PhoenixStage
from phoenix.kube_names import MANAGED_BY, MANAGED_BY_LABEL, NAME_LABEL, WORKER_APP_NAME
from phoenix.operator.builders import HEALTH_PORT, Owner, build_deployment
from tests.fixtures.cluster_objects import ensure_namespace
from tests.fixtures.control_plane import REPO_ROOT, ControlPlane, kube_bin_dir
from tests.fixtures.docs import DOCS, marked_block
from tests.fixtures.helm import helm_binary

pytestmark = pytest.mark.helm

CHART = REPO_ROOT / "charts" / "phoenix"
MANIFESTS = REPO_ROOT / "manifests"
NAMESPACE = "phoenix-system"
# The namespace the namespaced and network-policy overlays of manifests/ serve.
PIPELINES = "phoenix-pipelines"
VALUES_SETS = sorted((CHART / "ci").glob("*-values.yaml"))
# (file or None for the defaults) of every documented values set.
ALL_SETS: list[Path | None] = [None, *VALUES_SETS]
# What Helm adds to the objects of manifests/: its two labels and, on the CRD, the policy that keeps it.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by"}
HELM_ANNOTATIONS = {"helm.sh/resource-policy"}
# The chart's copies of manifests/ files it cannot read from outside its directory (`make manifests` copies them).
CHART_FILES = {
    "phoenix.io_phoenixstages.yaml": MANIFESTS / "crds" / "phoenix.io_phoenixstages.yaml",
    "phoenix.io_phoenixpipelines.yaml": MANIFESTS / "crds" / "phoenix.io_phoenixpipelines.yaml",
    "phoenix-dashboard.json": MANIFESTS / "grafana" / "phoenix-dashboard.json",
    "prometheus-rule.yaml": MANIFESTS / "monitoring" / "prometheus-rule.yaml",
    "example-pipeline.yaml": MANIFESTS / "samples" / "pipeline" / "pipeline.yaml",
}


# The users' rights on stages (manifests/rbac/stage-roles.yaml) and the default roles each is aggregated into.
STAGE_ROLES = {"phoenix-stage-edit": ("admin", "edit"), "phoenix-stage-view": ("view",)}
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


def set_id(values: Path | None) -> str:
    return values.name.removesuffix("-values.yaml") if values else "default"


@pytest.fixture(scope="session")
def helm_path() -> Path:
    path = helm_binary()
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"missing {path}: build it with `make helm` (hack/build-helm.sh)")
    return path


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's cache, config and data in a directory of the session's: nothing read from or written to $HOME."""
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")},
    }


class Helm:
    def __init__(self, binary: Path, env: dict[str, str]) -> None:
        self.binary, self.env = binary, env

    def run(
        self, *args: str, kubeconfig: Path | None = None, values: dict[str, Any] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """helm ARGS; `values` go in on stdin (`--values=-`)."""
        env = {**self.env, "KUBECONFIG": str(kubeconfig)} if kubeconfig else self.env
        stdin = None if values is None else yaml.safe_dump(values)
        argv = [str(self.binary), *args, *([] if values is None else ["--values=-"])]
        return subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=180)

    def template(self, *args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("template", "phoenix", str(CHART), f"--namespace={NAMESPACE}", *args, values=values)

    def render(self, *args: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        result = self.template(*args, values=values)
        assert result.returncode == 0, result.stderr
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="session")
def helm(helm_path: Path, helm_env: dict[str, str]) -> Helm:
    return Helm(helm_path, helm_env)


def values_args(values: Path | None) -> list[str]:
    return [f"--values={values}"] if values else []


def key(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]


def by_key(documents: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    keyed = {key(doc): doc for doc in documents}
    assert len(keyed) == len(documents), "two objects with the same kind, namespace and name"
    return keyed


def one(documents: list[dict[str, Any]], kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    [doc] = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    assert doc["metadata"].get("namespace", namespace) == namespace
    return doc


def operator_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = one(documents, "Deployment", "phoenix-operator")["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("values", ALL_SETS, ids=set_id)
def test_helm_lint_passes_with_every_values_set(helm: Helm, values: Path | None) -> None:
    result = helm.run("lint", "--strict", str(CHART), *values_args(values))
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_values_install_the_crd_rbac_and_two_operator_replicas(helm: Helm) -> None:
    documents = helm.render()
    assert sorted(doc["kind"] for doc in documents) == sorted(
        [
            "CustomResourceDefinition",
            "CustomResourceDefinition",
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
    # Kept by `helm uninstall`, and with them every PhoenixStage and PhoenixPipeline.
    for name in ("phoenixstages.phoenix.io", "phoenixpipelines.phoenix.io"):
        crd = one(documents, "CustomResourceDefinition", name)
        assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    container = operator_container(documents)
    assert container["image"] == "ghcr.io/phoenix/phoenix:0.1.0"
    assert container["args"] == ["--metrics-port=8080", "--leader-election"]


def test_namespaced_mode_swaps_the_cluster_role_for_roles_in_the_served_namespaces(helm: Helm) -> None:
    documents = helm.render("--set=watchNamespaces={team-a,team-b}")
    operators = [doc for doc in documents if doc["metadata"]["name"] not in STAGE_ROLES]
    assert not [doc for doc in operators if doc["kind"].startswith("Cluster")]
    roles = {(doc["metadata"]["namespace"], doc["metadata"]["name"]) for doc in documents if doc["kind"] == "Role"}
    assert roles == {
        ("team-a", "phoenix-operator"),
        ("team-b", "phoenix-operator"),
        (NAMESPACE, "phoenix-operator-leader-election"),
    }
    assert operator_container(documents)["args"][-2:] == ["--namespace=team-a", "--namespace=team-b"]


@pytest.mark.parametrize("values", ALL_SETS, ids=set_id)
def test_every_install_ships_the_stage_roles_aggregated_into_edit_and_view(helm: Helm, values: Path | None) -> None:
    """Whoever holds `edit` (or `admin`) in a namespace may make stages there, whoever holds `view` may read them;
    the operator's own mode (cluster-wide or namespaced) does not change who may make stages."""
    documents = helm.render(*values_args(values))
    roles = {
        doc["metadata"]["name"]: doc
        for doc in documents
        if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] in STAGE_ROLES
    }
    assert sorted(roles) == sorted(STAGE_ROLES)
    for name, aggregated_into in STAGE_ROLES.items():
        labels = roles[name]["metadata"]["labels"]
        assert {key for key, value in labels.items() if key.startswith(AGGREGATE) and value == "true"} == {
            f"{AGGREGATE}{role}" for role in aggregated_into
        }
    [edit] = roles["phoenix-stage-edit"]["rules"]
    # No status: the operator's.
    assert (edit["apiGroups"], edit["resources"]) == (["phoenix.io"], ["phoenixstages", "phoenixpipelines"])
    assert {"create", "update", "patch", "delete"} <= set(edit["verbs"])
    [view] = roles["phoenix-stage-view"]["rules"]
    assert view["resources"] == ["phoenixstages", "phoenixstages/status", "phoenixpipelines", "phoenixpipelines/status"]
    assert view["verbs"] == ["get", "list", "watch"]


def test_monitoring_values_add_the_pod_monitors_rule_and_dashboard_with_their_selector_label(helm: Helm) -> None:
    documents = helm.render(f"--values={CHART / 'ci' / 'monitoring-values.yaml'}")
    monitoring = [doc for doc in documents if doc["apiVersion"] == "monitoring.coreos.com/v1"]
    assert sorted(key(doc)[1:] for doc in monitoring) == [
        ("PodMonitor", NAMESPACE, "phoenix-operator"),
        ("PodMonitor", NAMESPACE, "phoenix-workers"),
        ("PrometheusRule", NAMESPACE, "phoenix"),
    ]
    assert all(doc["metadata"]["labels"]["release"] == "monitoring" for doc in monitoring)
    dashboard = one(documents, "ConfigMap", "phoenix-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["phoenix-dashboard.json"] == CHART_FILES["phoenix-dashboard.json"].read_text()


def test_image_by_digest_wins_over_the_tag(helm: Helm) -> None:
    documents = helm.render(f"--values={CHART / 'ci' / 'digest-values.yaml'}", "--set=image.tag=9.9.9")
    digest = "sha256:" + "0123456789abcdef" * 4
    assert operator_container(documents)["image"] == f"registry.example.com/platform/phoenix@{digest}"


def test_pull_secrets_and_placement_reach_the_operator_pods(helm: Helm) -> None:
    documents = helm.render(f"--values={CHART / 'ci' / 'pull-secrets-values.yaml'}")
    pod = one(documents, "Deployment", "phoenix-operator")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}
    ]
    assert operator_container(documents)["image"] == "registry.example.com/platform/phoenix:0.1.0"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set=operator.replica=3"], "replica"),  # unknown key
        (["--set-string=operator.replicas=two"], "replicas"),  # wrong type
        (["--set=monitoring.podMonitor=true"], "podMonitor"),
        (["--set=image.digest=latest"], "digest"),
        (["--set=networkPolicy.apiServer.ports={https}"], "ports"),
        (["--set-json=networkPolicy.metricsFrom=[]"], "metricsFrom"),
        (['--set-json=networkPolicy.redis=[{"ports": [6379], "to": []}]'], "redis"),
    ],
    ids=[
        "unknown-key",
        "wrong-type",
        "unknown-nested-key",
        "bad-digest",
        "port-not-a-number",
        "scrapes-from-anyone",
        "redis-at-any-address",
    ],
)
def test_a_values_typo_fails_template(helm: Helm, args: list[str], message: str) -> None:
    result = helm.template(*args)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def test_several_replicas_without_leader_election_are_refused(helm: Helm) -> None:
    result = helm.template("--set=operator.leaderElection=false")
    assert result.returncode != 0
    assert "operator.replicas > 1 needs operator.leaderElection: true" in result.stderr
    single = helm.render("--set=operator.leaderElection=false", "--set=operator.replicas=1")
    assert "--leader-election" not in operator_container(single)["args"]
    assert not [doc for doc in single if doc["metadata"]["name"] == "phoenix-operator-leader-election"]
    assert not [doc for doc in single if doc["kind"] == "PodDisruptionBudget"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"podLabels": {"app.kubernetes.io/name": "mine"}}, "operator.podLabels must not set app.kubernetes.io/name"),
        (
            {"podLabels": {"app.kubernetes.io/part-of": "x"}},
            "operator.podLabels must not set app.kubernetes.io/part-of",
        ),
        ({"podAnnotations": {"prometheus.io/port": "9999"}}, "operator.podAnnotations must not set prometheus.io/port"),
    ],
    ids=["selector-label", "part-of-label", "scrape-annotation"],
)
def test_pod_labels_and_annotations_cannot_replace_the_charts_own(
    helm: Helm, values: dict[str, Any], message: str
) -> None:
    """Rendered twice in the pod template they would be duplicate keys, the selector's label possibly replaced (a
    Deployment the API server refuses): refused at render, saying which."""
    result = helm.template(values={"operator": values})
    assert result.returncode != 0
    assert message in result.stderr
    extra = helm.render(values={"operator": {"podLabels": {"team": "platform"}, "podAnnotations": {"a/b": "c"}}})
    template = one(extra, "Deployment", "phoenix-operator")["spec"]["template"]["metadata"]
    assert template["labels"]["team"] == "platform" and template["annotations"]["a/b"] == "c"


def test_redis_acl_users_add_only_the_user_secrets_rights_and_their_options(helm: Helm) -> None:
    """Off: none of it. On: the option naming the admin Secret, and writing the Secret phoenix-redis-user, where
    the operator serves (cluster-wide, or each served namespace with the admin Secret's read in the release's)."""
    assert not [doc for doc in helm.render() if "redis" in doc["metadata"]["name"]]
    assert not [arg for arg in operator_container(helm.render())["args"] if "redis-acl" in arg]
    wide = helm.render(values={"redisAcl": {"enabled": True, "rotationSeconds": 3600}, "clusterId": "east"})
    assert operator_container(wide)["args"][-3:] == [
        "--cluster-id=east",
        "--redis-acl-admin-secret=phoenix-redis-admin",
        "--redis-acl-rotation-seconds=3600",
    ]
    user_rules = [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["phoenix-redis-user"],
            "verbs": ["update", "delete"],
        },
    ]
    assert one(wide, "ClusterRole", "phoenix-operator-redis-acl")["rules"] == user_rules
    served = helm.render(values={"redisAcl": {"enabled": True}, "watchNamespaces": [PIPELINES]})
    assert {doc["metadata"]["name"] for doc in served if doc["kind"].startswith("Cluster")} == set(STAGE_ROLES)
    assert one(served, "Role", "phoenix-operator-redis-acl", PIPELINES)["rules"] == user_rules
    assert one(served, "Role", "phoenix-operator-redis-admin")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["phoenix-redis-admin"], "verbs": ["get"]}
    ]


def test_ingest_values_add_phoenix_ingest_in_the_served_namespace_with_its_token_from_a_secret(helm: Helm) -> None:
    """ci/ingest-values.yaml: a ServiceAccount, a Role reading stages and Secrets only, its binding, the Deployment
    running `phoenix ingest` with the token as a mounted file, and its Service: all in the served namespace."""
    documents = helm.render("--values", str(CHART / "ci" / "ingest-values.yaml"))
    ingest = [doc for doc in documents if doc["metadata"]["name"] == "phoenix-ingest"]
    assert sorted(doc["kind"] for doc in ingest) == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
    assert {doc["metadata"]["namespace"] for doc in ingest} == {PIPELINES}
    role = one(documents, "Role", "phoenix-ingest", PIPELINES)
    assert role["rules"] == [
        {"apiGroups": ["phoenix.io"], "resources": ["phoenixstages"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    ]
    pod = one(documents, "Deployment", "phoenix-ingest", PIPELINES)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["phoenix", "ingest"]
    assert container["args"] == [
        "--host=0.0.0.0",
        "--port=8000",
        f"--namespace={PIPELINES}",
        "--token-file=/var/run/phoenix-ingest/token",
        "--high-water=50000",
        "--dedup-seconds=3600",
    ]
    assert "env" not in container  # the token is a file, never a variable
    assert pod["volumes"] == [
        {"name": "token", "secret": {"secretName": "ingest-token", "items": [{"key": "token", "path": "token"}]}}
    ]
    assert pod["serviceAccountName"] == "phoenix-ingest"
    service = one(documents, "Service", "phoenix-ingest", PIPELINES)
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "phoenix-ingest"}
    # Off by default; on without a namespace: the release's.
    assert not [doc for doc in helm.render() if doc["metadata"]["name"] == "phoenix-ingest"]
    alone = helm.render("--set=ingest.enabled=true")
    assert {doc["metadata"]["namespace"] for doc in alone if doc["metadata"]["name"] == "phoenix-ingest"} == {NAMESPACE}


def test_crds_install_false_leaves_the_crd_out(helm: Helm) -> None:
    assert not [doc for doc in helm.render("--set=crds.install=false") if doc["kind"] == "CustomResourceDefinition"]


def test_the_chart_and_its_default_image_are_the_packages_version() -> None:
    """Chart.yaml's comment: version and appVersion (the image tag when image.tag is empty) follow pyproject.toml,
    as manifests/ pins the image of that version (which the drift test compares with the chart's default)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert (chart["version"], chart["appVersion"]) == (package, package)


def test_the_example_pipeline_is_the_samples_pipeline_in_the_release_namespace(helm: Helm) -> None:
    assert not [doc for doc in helm.render() if doc["kind"] == "PhoenixPipeline"]  # off by default
    [pipeline] = [doc for doc in helm.render("--set=examplePipeline.enabled=true") if doc["kind"] == "PhoenixPipeline"]
    # manifests/samples/pipeline's kustomization is that one file (tests/test_manifests.py checks it lists them all).
    sample = yaml.safe_load((MANIFESTS / "samples" / "pipeline" / "pipeline.yaml").read_text())
    assert without_helm_metadata(pipeline) == {**sample, "metadata": {**sample["metadata"], "namespace": NAMESPACE}}
    assert set(pipeline["metadata"]["labels"]) == HELM_LABELS


def ui_objects(helm: Helm, *args: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in helm.render("--set=ui.enabled=true", *args) if "ui" in doc["metadata"]["name"]}


def test_the_ui_serves_phoenix_ui_with_its_token_from_a_secret_and_reads_only_stages_and_secrets(helm: Helm) -> None:
    assert not [doc for doc in helm.render() if doc["metadata"]["name"] == "phoenix-ui"]  # off by default
    objects = ui_objects(helm, "--set=ui.tokenSecret=view-token")
    assert sorted(objects) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"]
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == ["phoenix", "ui"]
    assert container["args"] == ["--host=0.0.0.0", "--port=8088", "--token-file=/var/run/secrets/phoenix-ui/token"]
    assert container["image"] == operator_container(helm.render())["image"]
    [volume] = pod["volumes"]
    assert volume["secret"] == {"secretName": "view-token", "items": [{"key": "token", "path": "token"}]}
    assert container["volumeMounts"] == [
        {"name": "token", "mountPath": "/var/run/secrets/phoenix-ui", "readOnly": True}
    ]
    assert pod["serviceAccountName"] == "phoenix-ui"
    assert objects["Service"]["spec"]["ports"] == [{"name": "http", "port": 8088, "targetPort": "http"}]
    assert objects["Service"]["spec"]["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    # What `phoenix ui` reads and nothing more: the stages (list, get) and the Secrets their spec.redis names (get).
    assert objects["ClusterRole"]["rules"] == [
        {"apiGroups": ["phoenix.io"], "resources": ["phoenixstages"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    ]
    binding = objects["ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "phoenix-ui", "namespace": NAMESPACE}]

    # One namespace: a Role there, and the page shows that namespace's stages only.
    scoped = ui_objects(helm, "--set=ui.namespace=team-a", "--set=ui.port=9000")
    assert (scoped["Role"]["metadata"]["namespace"], scoped["RoleBinding"]["roleRef"]["kind"]) == ("team-a", "Role")
    assert "ClusterRole" not in scoped
    [container] = scoped["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][1:] == [
        "--port=9000",
        "--token-file=/var/run/secrets/phoenix-ui/token",
        "--namespace=team-a",
    ]


@pytest.mark.parametrize("name", sorted(CHART_FILES))
def test_the_chart_files_are_copies_of_manifests(name: str) -> None:
    assert (CHART / "files" / name).read_text() == CHART_FILES[name].read_text(), "run `make manifests`"


# -- NetworkPolicies ------------------------------------------------------------------------------------------------


def sample_worker_pod() -> dict[str, Any]:
    """The pod template the operator builds for the sample router stage."""
    stage = PhoenixStage.model_validate(yaml.safe_load((MANIFESTS / "samples" / "router.yaml").read_text()))
    owner = Owner(
        api_version=stage.api_version, kind="PhoenixStage", name=stage.metadata.name, namespace=PIPELINES, uid="u"
    )
    return build_deployment(owner, stage.spec)["spec"]["template"]


def network_policies(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in documents if doc["kind"] == "NetworkPolicy"}


def overlay_policies() -> dict[str, dict[str, Any]]:
    directory = MANIFESTS / "network-policy"
    names = yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]
    return network_policies([yaml.safe_load((directory / name).read_text()) for name in names])


NETWORK_POLICY_VALUES = CHART / "ci" / "network-policy-values.yaml"
MONITORING = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
KUBE_DNS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
    }
]
# The Redis of manifests/dev/, which the overlay and the documented values set name.
DEV_REDIS = [
    {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PIPELINES}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "redis"}},
    }
]


def tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"port": port, "protocol": "TCP"} for port in ports]


DNS_RULE = {"ports": [{"port": 53, "protocol": "UDP"}, *tcp(53)], "to": KUBE_DNS}


def chart_policies(helm: Helm) -> dict[str, dict[str, Any]]:
    return network_policies(helm.render(f"--values={NETWORK_POLICY_VALUES}"))


def policies_of(source: str, helm: Helm) -> dict[str, dict[str, Any]]:
    return overlay_policies() if source == "overlay" else chart_policies(helm)


@pytest.mark.parametrize("source", ["overlay", "chart"])
def test_worker_policy_selects_the_pods_the_operator_builds_and_admits_only_scrapes_from_monitoring(
    helm: Helm, source: str
) -> None:
    policy = policies_of(source, helm)["phoenix-workers"]
    assert policy["metadata"]["namespace"] == PIPELINES
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector == {NAME_LABEL: WORKER_APP_NAME, MANAGED_BY_LABEL: MANAGED_BY}
    pod = sample_worker_pod()
    assert selector.items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    assert [port["containerPort"] for port in container["ports"]] == [HEALTH_PORT]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["ingress"] == [{"ports": tcp(HEALTH_PORT), "from": MONITORING}]


@pytest.mark.parametrize("source", ["overlay", "chart"])
def test_worker_policy_reaches_only_its_redis_and_the_cluster_dns(helm: Helm, source: str) -> None:
    egress = policies_of(source, helm)["phoenix-workers"]["spec"]["egress"]
    extra = [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": tcp(443)}] if source == "chart" else []
    assert egress == [{"ports": tcp(6379), "to": DEV_REDIS}, DNS_RULE, *extra]


@pytest.mark.parametrize("source", ["overlay", "chart"])
def test_operator_policy_admits_only_scrapes_and_reaches_only_the_api_server_redis_and_dns(
    helm: Helm, source: str
) -> None:
    policy = policies_of(source, helm)["phoenix-operator"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"] == {"matchLabels": {NAME_LABEL: "phoenix-operator"}}
    assert policy["spec"]["ingress"] == [{"ports": tcp(8080), "from": MONITORING}]
    api_server = {"ports": tcp(443, 6443), "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}]}
    assert policy["spec"]["egress"] == [api_server, {"ports": tcp(6379), "to": DEV_REDIS}, DNS_RULE]


def test_the_documented_egress_of_one_stage_selects_that_stages_pods_only() -> None:
    """docs/operations.md's policy for one stage's egress: the pods of the stage it names, no other stage's."""
    _, code = marked_block("stage-egress-policy", DOCS / "operations.md")
    policy = yaml.safe_load(code)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Egress"] and "ingress" not in policy["spec"]
    pod_labels = sample_worker_pod()["metadata"]["labels"]  # the sample router's pods
    assert not selector.items() <= pod_labels.items()
    assert selector.items() <= {**pod_labels, "app.kubernetes.io/instance": "parser"}.items()
    assert selector[NAME_LABEL] == WORKER_APP_NAME


def test_network_policy_values_name_the_peers_and_ports(helm: Helm) -> None:
    """Sentinels and TLS data nodes as two Redis rules, a NodeLocal DNSCache, Prometheus's pods alone: every rule as
    the values give it, in both policies."""
    redis: list[dict[str, Any]] = [
        {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [6380]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "redis"}}}], "ports": [26379]},
    ]
    dns = {"ports": [53], "to": [*KUBE_DNS, {"ipBlock": {"cidr": "169.254.20.10/32"}}]}
    prometheus = [{**MONITORING[0], "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]
    api_server = {"ports": [6443], "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]}
    values = {
        "watchNamespaces": ["team-a"],
        "operator": {"metricsPort": 9090},
        "networkPolicy": {
            "enabled": True,
            "metricsFrom": prometheus,
            "redis": redis,
            "dns": dns,
            "apiServer": api_server,
        },
    }
    policies = network_policies(helm.render(values=values))
    assert policies["phoenix-workers"]["metadata"]["namespace"] == "team-a"
    redis_rules = [{"ports": tcp(*rule["ports"]), "to": rule["to"]} for rule in redis]
    dns_rule = {"ports": [{"port": 53, "protocol": "UDP"}, *tcp(53)], "to": dns["to"]}
    for name, port in (("phoenix-operator", 9090), ("phoenix-workers", HEALTH_PORT)):
        spec = policies[name]["spec"]
        assert spec["ingress"] == [{"ports": tcp(port), "from": prometheus}]
        api = [{"ports": tcp(6443), "to": api_server["to"]}] if name == "phoenix-operator" else []
        assert spec["egress"] == [*api, *redis_rules, dns_rule]


def test_the_documented_network_policy_values_render_what_they_say(helm: Helm) -> None:
    """docs/operations.md's values: Sentinels and data nodes in namespace redis, the API server, Prometheus's pods."""
    _, code = marked_block("network-policy-values", DOCS / "operations.md")
    values = yaml.safe_load(code)
    policies = network_policies(helm.render(values=values))
    workers, operator = policies["phoenix-workers"], policies["phoenix-operator"]
    assert workers["metadata"]["namespace"] == "team-a"
    redis = {"ports": tcp(6379, 26379), "to": values["networkPolicy"]["redis"][0]["to"]}
    assert workers["spec"]["egress"] == [redis, DNS_RULE]
    assert operator["spec"]["egress"][0] == {"ports": tcp(443, 6443), "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]}
    assert workers["spec"]["ingress"][0]["from"] == values["networkPolicy"]["metricsFrom"]


@pytest.mark.parametrize(
    ("network_policy", "message"),
    [
        ({"apiServer": {"ports": [6443], "to": [{"ipBlock": {"cidr": "10.0.0.10/32"}}]}}, "networkPolicy.redis: name"),
        ({"redis": [{"to": DEV_REDIS, "ports": [6379]}]}, "networkPolicy.apiServer.to: name"),
    ],
    ids=["no-redis", "no-api-server"],
)
def test_enabled_policies_need_their_redis_and_api_server_peers(
    helm: Helm, network_policy: dict[str, Any], message: str
) -> None:
    """No default opens a port to every address: without the peers the chart refuses to render, saying which."""
    result = helm.template(values={"networkPolicy": {"enabled": True, **network_policy}})
    assert result.returncode != 0
    assert message in result.stderr


# -- Against the real API server, and manifests/ through kustomize ----------------------------------------------------


@pytest.mark.kube
@pytest.mark.parametrize("values", ALL_SETS, ids=set_id)
def test_every_values_set_passes_a_server_side_dry_run(
    helm: Helm, kube_cluster: ControlPlane, values: Path | None
) -> None:
    rendered = helm.template(*values_args(values))
    assert rendered.returncode == 0, rendered.stderr
    documents = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    # A dry run creates nothing, so the namespaces the objects live in must exist for real.
    for namespace in {doc["metadata"]["namespace"] for doc in documents if "namespace" in doc["metadata"]}:
        ensure_namespace(kube_cluster, namespace)
    result = kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered.stdout)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(documents)


@pytest.mark.kube
def test_a_values_typo_fails_helm_install_and_installs_nothing(helm: Helm, kube_cluster: ControlPlane) -> None:
    ensure_namespace(kube_cluster, "t-helm-typo")
    args = ("install", "phoenix", str(CHART), "--namespace=t-helm-typo", "--set=operator.replicass=3")
    result = helm.run(*args, kubeconfig=kube_cluster.kubeconfig)
    assert result.returncode != 0
    assert "additional properties 'replicass' not allowed" in result.stderr
    assert helm.run("list", "--namespace=t-helm-typo", "--short", kubeconfig=kube_cluster.kubeconfig).stdout == ""
    left = kube_cluster.kubectl("get", "deployments,serviceaccounts", "--namespace=t-helm-typo", "-o", "name")
    assert "phoenix-operator" not in left.stdout


def kustomize(*directories: str) -> list[dict[str, Any]]:
    documents = []
    for directory in directories:
        result = subprocess.run(
            [str(kube_bin_dir() / "kubectl"), "kustomize", str(MANIFESTS / directory)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        documents += [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return documents


def without_helm_metadata(doc: dict[str, Any]) -> dict[str, Any]:
    meta = dict(doc["metadata"])
    for field, helm_keys in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
        kept = {k: v for k, v in meta.get(field, {}).items() if k not in helm_keys}
        if kept:
            meta[field] = kept
        else:
            meta.pop(field, None)
    return {**doc, "metadata": meta}


def in_namespace(documents: list[dict[str, Any]], namespace: str) -> list[dict[str, Any]]:
    """kustomizations without a namespace, applied with `kubectl apply -n NAMESPACE`."""
    return [{**doc, "metadata": {"namespace": namespace, **doc["metadata"]}} for doc in documents]


def drift_case(case: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(chart values, the objects of the equivalent kustomizations) of one install."""
    base = [doc for doc in kustomize("") if doc["kind"] != "Namespace"]
    if case == "default":
        return {}, base
    if case == "namespaced":
        return {"watchNamespaces": [PIPELINES]}, [doc for doc in kustomize("namespaced") if doc["kind"] != "Namespace"]
    if case == "monitoring":
        values = {"monitoring": {"podMonitors": True, "prometheusRule": True, "grafanaDashboard": {"enabled": True}}}
        return values, base + kustomize("monitoring") + in_namespace(kustomize("grafana"), NAMESPACE)
    if case == "redis-acl":
        return {"redisAcl": {"enabled": True}}, [doc for doc in kustomize("redis-acl") if doc["kind"] != "Namespace"]
    assert case == "network-policy"
    values = yaml.safe_load(NETWORK_POLICY_VALUES.read_text())
    del values["networkPolicy"]["workerExtraEgress"]  # the overlay's is a patch of your own
    return values, base + kustomize("network-policy")


@pytest.mark.kube
@pytest.mark.parametrize("case", ["default", "namespaced", "monitoring", "network-policy", "redis-acl"])
def test_the_chart_renders_exactly_the_objects_of_manifests(helm: Helm, case: str) -> None:
    """The Namespace aside (Helm installs into an existing one, `--create-namespace`), the chart and manifests/
    install the same objects, field for field, once Helm's own labels and the CRD's keep policy are set aside."""
    values, manifests = drift_case(case)
    chart = by_key([without_helm_metadata(doc) for doc in helm.render(values=values)])
    expected = by_key(manifests)
    assert sorted(chart) == sorted(expected)
    for object_key, doc in expected.items():
        assert chart[object_key] == doc, f"{object_key} differs between charts/phoenix and manifests/"
