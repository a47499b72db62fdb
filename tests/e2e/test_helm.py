"""The operator installed with Helm (charts/phoenix), not kustomize, as docs/kubernetes.md ("Run it on your cluster")
and docs/operations.md ("Moving a kustomize install to Helm") say: the kustomize install's objects but the CRDs are
deleted (the stages stay), the CRDs are handed to the release, `helm install` runs the operator that serves the
pipeline, `helm upgrade` with a changed value rolls it, and `helm uninstall` leaves only the CRDs with their stages.
The module's end puts the kustomize install back for the rest of the suite."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
import yaml

from phoenix.crds.definition import CRD_NAME
from phoenix.crds.pipeline import PIPELINE_CRD_NAME
from phoenix.kube_names import HANDLED_RESTART_ANNOTATION, RESTART_ANNOTATION
from phoenix.operator.options import DEFAULT_LEASE_NAME
from tests.e2e.helm import CHART, helm
from tests.e2e.kubectl import (
    MANIFESTS,
    OPERATOR_NAMESPACE,
    OPERATOR_PODS,
    install_operator_with_kustomize,
    is_ready,
    kubectl,
    kubectl_json,
    pods,
    wait_rollout,
)
from tests.e2e.pipeline import NAMESPACE, Pipeline, assert_exactly_once, enqueue_documents, streams, wait_all_grouped
from tests.fixtures.eventually import eventually

pytestmark = pytest.mark.e2e

RELEASE = "phoenix"
# The project's CRDs: the stages' and the pipelines'.
CRDS = [f"customresourcedefinition/{name}" for name in (CRD_NAME, PIPELINE_CRD_NAME)]
STAGES = {"router", "parser", "grouper"}


def image_values(image: str) -> list[str]:
    repository, _, tag = image.rpartition(":")
    return [f"--set=image.repository={repository}", f"--set=image.tag={tag}"]


def kustomize_objects(path: Path) -> list[dict[str, Any]]:
    """The objects of `kubectl apply -k manifests/` but the Namespace and the CRD, written to `path`."""
    documents = yaml.safe_load_all(kubectl("kustomize", str(MANIFESTS)))
    kept = [doc for doc in documents if doc and doc["kind"] not in ("Namespace", "CustomResourceDefinition")]
    path.write_text(yaml.safe_dump_all(kept))
    return kept


def operator_pod_names() -> set[str]:
    return {pod["metadata"]["name"] for pod in pods(OPERATOR_NAMESPACE, OPERATOR_PODS)}


def rolled_out_pods(count: int) -> list[dict[str, Any]]:
    wait_rollout(OPERATOR_NAMESPACE, "phoenix-operator")

    def ready() -> list[dict[str, Any]]:
        found = pods(OPERATOR_NAMESPACE, OPERATOR_PODS)
        return found if len(found) == count and all(is_ready(pod) for pod in found) else []

    return eventually(ready, f"{count} ready operator pods and no other", timeout=180, interval=2)


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="module")
def helm_release(
    pipeline: Pipeline, phoenix_image: str, helm_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[set[str]]:
    """The kustomize install swapped for a Helm release; yields the names of the release's first operator pods."""
    kustomized = tmp_path_factory.mktemp("kustomized") / "objects.yaml"
    kustomize_objects(kustomized)
    kubectl("delete", "--ignore-not-found", "--wait=true", "-f", str(kustomized), timeout=300)
    eventually(lambda: not operator_pod_names(), "the kustomize install's operator pods to go", timeout=180, interval=2)
    # The CRDs (and so the stages and pipelines) stay; the release takes them over (Helm adopts an object with these
    # marks).
    kubectl("label", "--overwrite", *CRDS, "app.kubernetes.io/managed-by=Helm")
    kubectl(
        "annotate",
        "--overwrite",
        *CRDS,
        f"meta.helm.sh/release-name={RELEASE}",
        f"meta.helm.sh/release-namespace={OPERATOR_NAMESPACE}",
    )
    helm(
        "install",
        RELEASE,
        str(CHART),
        f"--namespace={OPERATOR_NAMESPACE}",
        *image_values(phoenix_image),
        "--wait",
        "--timeout=5m",
        home=helm_home,
    )
    yield {pod["metadata"]["name"] for pod in rolled_out_pods(2)}
    helm("uninstall", RELEASE, f"--namespace={OPERATOR_NAMESPACE}", "--wait", "--ignore-not-found", home=helm_home)
    install_operator_with_kustomize(phoenix_image, tmp_path_factory.mktemp("operator-overlay"))


def test_helm_installed_operator_serves_the_pipeline(
    helm_release: set[str], pipeline: Pipeline, redis: redis_client.Redis
) -> None:
    deployment = kubectl_json("get", "deployment", "-n", OPERATOR_NAMESPACE, "phoenix-operator")
    assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # Only the release's operator can answer a restart asked for now: the kustomize one is gone.
    asked = uuid.uuid4().hex
    kubectl("annotate", "--overwrite", "phoenixstage", "-n", NAMESPACE, "router", f"{RESTART_ANNOTATION}={asked}")

    def restart_handled() -> bool:
        router = kubectl_json("get", "deployment", "-n", NAMESPACE, "router")
        return router["metadata"].get("annotations", {}).get(HANDLED_RESTART_ANNOTATION) == asked

    eventually(restart_handled, "the Helm-installed operator to roll the router", timeout=120, interval=2)
    wait_rollout(NAMESPACE, "router")
    ids = enqueue_documents(redis, streams("router")["input"], pipeline.documents, copies=1)
    wait_all_grouped(redis, ids, timeout=300)
    assert_exactly_once(redis, ids)


def test_helm_upgrade_with_a_changed_value_rolls_the_operator(
    helm_release: set[str], phoenix_image: str, helm_home: Path
) -> None:
    before = operator_pod_names()
    marker = uuid.uuid4().hex
    helm(
        "upgrade",
        RELEASE,
        str(CHART),
        f"--namespace={OPERATOR_NAMESPACE}",
        "--reuse-values",
        f"--set-string=operator.podAnnotations.phoenix\\.io/e2e-upgrade={marker}",
        "--wait",
        "--timeout=5m",
        home=helm_home,
    )
    after = rolled_out_pods(2)
    assert not {pod["metadata"]["name"] for pod in after} & before, "the upgrade did not replace the operator pods"
    assert all(pod["metadata"]["annotations"]["phoenix.io/e2e-upgrade"] == marker for pod in after)
    status = json.loads(helm("status", RELEASE, f"--namespace={OPERATOR_NAMESPACE}", "--output=json", home=helm_home))
    assert (status["version"], status["info"]["status"]) == (2, "deployed")


def test_helm_uninstall_leaves_only_the_crd_and_its_stages(helm_release: set[str], helm_home: Path) -> None:
    """What docs/operations.md says `helm uninstall` leaves: of the objects the release rendered only the CRD (with
    the stages and their workers), no release record, and what the operator wrote itself: its Lease, free."""
    release = [f"--namespace={OPERATOR_NAMESPACE}"]
    rendered = [doc for doc in yaml.safe_load_all(helm("get", "manifest", RELEASE, *release, home=helm_home)) if doc]
    kept = [doc for doc in rendered if doc["kind"] == "CustomResourceDefinition"]
    assert sorted(doc["metadata"]["name"] for doc in kept) == sorted(crd.split("/")[1] for crd in CRDS)
    helm("uninstall", RELEASE, *release, "--wait", home=helm_home)
    for doc in rendered:
        if doc in kept:
            continue
        kind, name = doc["kind"].lower(), doc["metadata"]["name"]
        # A cluster-scoped object ignores the namespace.
        namespace = doc["metadata"].get("namespace", OPERATOR_NAMESPACE)
        left = kubectl("get", kind, name, f"--namespace={namespace}", "--ignore-not-found", "-o", "name")
        assert left == "", f"helm uninstall left {left.strip()}"
    kubectl("get", *CRDS)
    assert kubectl("get", "secrets", *release, "-l", f"owner=helm,name={RELEASE}", "-o", "name") == ""
    eventually(lambda: not operator_pod_names(), "the operator pods to go", timeout=180, interval=2)

    def lease_free() -> bool:
        spec = kubectl_json("get", "lease", *release, DEFAULT_LEASE_NAME)["spec"]
        if not spec.get("holderIdentity"):
            return True
        renewed = datetime.fromisoformat(spec["renewTime"])
        return renewed + timedelta(seconds=spec["leaseDurationSeconds"]) < datetime.now(UTC)

    # Kept, and held by no one: released, or (the leader's RBAC gone before its SIGTERM) expired.
    eventually(lease_free, "the operator's Lease to be free", timeout=60, interval=2)
    names = {item["metadata"]["name"] for item in kubectl_json("get", "phoenixstage", "-n", NAMESPACE)["items"]}
    assert names == STAGES
    # The stages' workers are theirs, not the release's: still there.
    for stage in STAGES:
        kubectl("get", "deployment", "-n", NAMESPACE, stage)
