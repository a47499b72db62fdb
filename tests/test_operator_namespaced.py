"""The namespaced install (manifests/namespaced/) against the real API server: the operator's identity gets a
Secret of its namespace by name and nothing more, and the operator still serves a stage there."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.fixtures.cluster_objects import (
    MANIFESTS,
    ensure_namespace,
    kubectl_checked,
    service_account_kubeconfig,
)
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.operator_process import existing_stage, get_stage, kubectl_apply, sample_documents, serving_operator

pytestmark = pytest.mark.kube
OPERATOR_ACCOUNT = "phoenix-operator"


def rendered(plane: ControlPlane) -> list[dict[str, Any]]:
    """`kubectl kustomize manifests/namespaced`: what `kubectl apply -k` would install."""
    return list(yaml.safe_load_all(kubectl_checked(plane, "kustomize", str(MANIFESTS / "namespaced"))))


def aggregated(role: dict[str, Any]) -> bool:
    """A ClusterRole the controller manager folds into the default user roles (admin, edit, view)."""
    return any(label.startswith("rbac.authorization.k8s.io/aggregate-to-") for label in role["metadata"]["labels"])


def one(documents: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


@pytest.fixture
def extra_namespaces(
    kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str
) -> Iterator[Callable[[str], str]]:
    made: list[str] = []

    def make(suffix: str) -> str:
        name = f"{kube_namespace}-{suffix}"
        ensure_namespace(kube_cluster, name)
        made.append(name)
        return name

    yield make
    for name in made:
        client.CoreV1Api(kube_api).delete_namespace(name)


@pytest.mark.timeout(240)
def test_the_namespaced_operator_reads_only_named_secrets_of_its_namespaces_and_still_reconciles(
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_url: str,
    extra_namespaces: Callable[[str], str],
    tmp_path: Path,
) -> None:
    documents = rendered(kube_cluster)
    # Cluster-wide only the users' aggregated roles (phoenix-stage-edit/view), which grant the operator nothing.
    cluster_wide = [d for d in documents if d["kind"] in {"ClusterRole", "ClusterRoleBinding"}]
    assert {d["metadata"]["name"] for d in cluster_wide} == {"phoenix-stage-edit", "phoenix-stage-view"}
    assert all(aggregated(d) for d in cluster_wide)
    role, binding = one(documents, "Role", OPERATOR_ACCOUNT), one(documents, "RoleBinding", OPERATOR_ACCOUNT)
    (container,) = one(documents, "Deployment", "phoenix-operator")["spec"]["template"]["spec"]["containers"]
    assert f"--namespace={role['metadata']['namespace']}" in container["args"]

    # The shipped Role and RoleBinding, installed for the test's namespace as the docs say (metadata.namespace),
    # bound to an operator account of its own: the session's phoenix-system account is bound cluster-wide.
    served, operator_ns, other = kube_namespace, extra_namespaces("op"), extra_namespaces("other")
    kubectl_checked(kube_cluster, "create", "serviceaccount", OPERATOR_ACCOUNT, "-n", operator_ns)
    role["metadata"]["namespace"] = binding["metadata"]["namespace"] = served
    binding["subjects"][0]["namespace"] = operator_ns
    kubectl_apply(kube_cluster, [role, binding])
    kubeconfig = service_account_kubeconfig(kube_cluster, operator_ns, OPERATOR_ACCOUNT, tmp_path / "ns.kubeconfig")

    url = f"{redis_url.rsplit('/', 1)[0]}/12"
    secret, stage = sample_documents(url, served)[:2]
    stage["metadata"]["name"] = "scoped"
    elsewhere = json.loads(json.dumps([secret, stage]))
    for document in elsewhere:
        document["metadata"]["namespace"] = other
    kubectl_apply(kube_cluster, [secret, *elsewhere])
    name = secret["metadata"]["name"]

    with kube_cluster.api_client(kubeconfig) as api:
        core = client.CoreV1Api(api)
        assert (core.read_namespaced_secret(name, served).data or {})["url"]  # by name, in a served namespace
        forbidden = {
            "get in another namespace": lambda: core.read_namespaced_secret(name, other),
            "list in its namespace": lambda: core.list_namespaced_secret(served),
            "watch in its namespace": lambda: core.list_namespaced_secret(served, watch=True, timeout_seconds=1),
            "list cluster-wide": lambda: core.list_secret_for_all_namespaces(),
        }
        for what, call in forbidden.items():
            with pytest.raises(client.ApiException) as refused:
                call()
            assert refused.value.status == 403, what

    with serving_operator(
        kube_cluster, kubeconfig, [f"--namespace={served}"], log_name="operator-namespaced"
    ) as operator:
        kubectl_apply(kube_cluster, [stage])
        eventually(
            lambda: ((get_stage(kube_cluster, served, "scoped") or {}).get("status") or {}).get("streams"),
            "the stage in the served namespace reconciled",
            timeout=60,
        )
        client.AppsV1Api(kube_api).read_namespaced_deployment("scoped", served)
        assert "status" not in existing_stage(kube_cluster, other, "scoped")  # not served, not touched
        assert operator.process.alive
        log = operator.process.log_path.read_text()
        assert "Forbidden" not in log and "permissions" not in log, operator.process.log_tail()
