"""Session fixtures of the e2e suite, against the cluster KUBECONFIG names (`make e2e` brings up a local one; any
cluster with KEDA installed and the images loaded works, e.g. kind):

- `operator_installed`: `kubectl apply -k` of manifests/ with the image overridden by kustomize, rolled out.
- `pipeline`: manifests/dev (the samples and a Valkey) in namespace phoenix-e2e, plus a web server the router fetches
  the sample PDFs from; the test's overlay shortens KEDA's polling and cooldown and the reclaim timings.
- `redis`: a client for that Valkey through `kubectl port-forward`.

Evidence: a failed test (or fixture) leaves the cluster's state at that moment under the run's directory
(tests/e2e/evidence.py: PHOENIX_E2E_REPORT_DIR, which hack/e2e.sh sets per run, else .cache/e2e/runs/<start>).

Images: PHOENIX_E2E_IMAGE (default ghcr.io/phoenix/phoenix:0.1.0), PHOENIX_E2E_VALKEY_IMAGE (default the
manifests' valkey/valkey:8.1) and, for test_sentinel.py, PHOENIX_E2E_REDIS_TLS_IMAGE (a TLS-enabled redis-server).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
import redis as redis_client
from pluggy import Result

from phoenix.stages.samples import ensure_samples
from tests.e2e import evidence
from tests.e2e.kubectl import (
    MANIFESTS,
    PHOENIX_IMAGE,
    VALKEY_IMAGE,
    apply_documents,
    image_override,
    install_operator_with_kustomize,
    kubectl,
    kubectl_json,
    port_forward,
    wait_rollout,
    write_overlay,
)
from tests.e2e.pipeline import NAMESPACE, Pipeline, documents_server, stage_patch
from tests.e2e.redis_set import until_answering

OPERATOR_NAMESPACE = evidence.OPERATOR_NAMESPACE


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Result[pytest.TestReport], None]:
    """A failure's evidence is collected at once, while the cluster still shows what went wrong."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.failed and "KUBECONFIG" in os.environ:
        directory = evidence.record_failure(report.nodeid, report.when, report.longreprtext)
        report.sections.append(("e2e evidence", f"the cluster at the failure: {directory}"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """At the end of a run with failures: which tests failed, why, and where their evidence is."""
    summary = evidence.run_path() / "summary.txt"
    if summary.exists():
        terminalreporter.section("e2e evidence")
        terminalreporter.write(summary.read_text())


@pytest.fixture(scope="session")
def phoenix_image() -> str:
    return os.environ.get("PHOENIX_E2E_IMAGE", f"{PHOENIX_IMAGE}:0.1.0")


@pytest.fixture(scope="session")
def valkey_image() -> str:
    return os.environ.get("PHOENIX_E2E_VALKEY_IMAGE", f"{VALKEY_IMAGE}:8.1")


@pytest.fixture(scope="session")
def cluster() -> None:
    if "KUBECONFIG" not in os.environ:
        pytest.fail("the e2e suite needs a cluster: set KUBECONFIG (with KEDA installed), or run `make e2e`")
    kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io")


@pytest.fixture(scope="session")
def operator_installed(cluster: None, phoenix_image: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    install_operator_with_kustomize(phoenix_image, tmp_path_factory.mktemp("operator-overlay"))


@pytest.fixture(scope="session")
def pipeline(
    operator_installed: None, phoenix_image: str, valkey_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    image = phoenix_image
    # A fresh namespace, also where an earlier run's is still there.
    kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=300)
    kubectl("create", "namespace", NAMESPACE)
    # Every pod of the pipeline (workers, Valkey, the documents server) must meet the restricted standard.
    kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    samples = ensure_samples(tmp_path_factory.mktemp("samples"))
    apply_documents(
        documents_server(image, {path.name: base64.b64encode(path.read_bytes()).decode() for path in samples}),
        NAMESPACE,
    )
    overlay = write_overlay(
        tmp_path_factory.mktemp("pipeline-overlay"),
        MANIFESTS / "dev",
        {
            "namespace": NAMESPACE,
            "images": [image_override(PHOENIX_IMAGE, image), image_override(VALKEY_IMAGE, valkey_image)],
            # kustomize's image override reaches PhoenixStage spec.image through this field spec.
            "configurations": ["phoenixstage-images.yaml"],
            "patches": [stage_patch(name) for name in ("router", "parser", "grouper")],
        },
    )
    (overlay / "phoenixstage-images.yaml").write_text("images:\n  - path: spec/image\n    kind: PhoenixStage\n")
    kubectl("apply", "--server-side", "-k", str(overlay))
    wait_rollout(NAMESPACE, "redis")
    wait_rollout(NAMESPACE, "documents")
    kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=180s", "phoenixstage", "--all", timeout=210)
    yield Pipeline([path.name for path in samples])
    kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture(scope="session")
def redis(pipeline: Pipeline) -> Iterator[redis_client.Redis]:
    secret = kubectl_json("get", "secret", "-n", NAMESPACE, "phoenix-redis")
    password = base64.b64decode(secret["data"]["password"]).decode()
    with port_forward(NAMESPACE, "service/redis", 6379) as port:
        client = redis_client.Redis(port=port, password=password, decode_responses=True)
        until_answering([client])
        yield client
        client.close()


@pytest.fixture(scope="session")
def report_dir() -> Path:
    """Where tests write what they observed (the scaling timeline): the run's evidence directory."""
    return evidence.run_dir()
