"""The probes are what mark worker pods Ready: a worker whose Redis becomes unreachable keeps running but is taken
out of Ready (and `kubectl get phx` says so), and is Ready again once Redis is back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.kubectl import (
    apply_documents,
    delete_stage,
    is_ready,
    kubectl,
    printed_columns,
    stage_pods,
    wait_rollout,
)
from tests.e2e.pipeline import NAMESPACE, RESTRICTED, Pipeline
from tests.fixtures.eventually import eventually

pytestmark = pytest.mark.e2e

STAGE = "probed"
REDIS = "probe-redis"  # a Valkey of the test's own, so that stopping it leaves the pipeline's alone


def valkey(image: str) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": REDIS}
    container = {
        "name": "valkey",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["valkey-server"],
        "args": ["--save", "", "--appendonly", "no", "--protected-mode", "no"],
        "ports": [{"name": "redis", "containerPort": 6379}],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 2},
        # The namespace enforces the restricted Pod Security Standard (conftest.py); no persistence, nothing written.
        "securityContext": {**RESTRICTED, "runAsUser": 65532, "runAsGroup": 65532},
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": REDIS, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": REDIS},
            "spec": {"selector": labels, "ports": [{"port": 6379, "targetPort": "redis"}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": REDIS},
            "stringData": {"url": f"redis://{REDIS}/0"},
        },
    ]


@pytest.fixture
def probed_stage(pipeline: Pipeline, phoenix_image: str, valkey_image: str) -> Iterator[None]:
    stage = {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": STAGE},
        "spec": {
            "processor": "grouper",
            "image": phoenix_image,
            "redis": {"urlSecretRef": {"name": REDIS, "key": "url"}},
            "replicas": {"min": 1, "max": 1},
            "autoscaling": {"enabled": False},
        },
    }
    apply_documents(valkey(valkey_image), NAMESPACE)
    wait_rollout(NAMESPACE, REDIS)
    apply_documents([stage], NAMESPACE)
    yield
    delete_stage(NAMESPACE, STAGE)
    kubectl("delete", "-n", NAMESPACE, "deployment,service,secret", REDIS, "--wait=false")


def worker() -> dict[str, Any] | None:
    found = stage_pods(NAMESPACE, STAGE)
    return found[0] if len(found) == 1 else None


def restarts(pod: dict[str, Any]) -> int:
    return sum(status.get("restartCount", 0) for status in pod["status"].get("containerStatuses") or [])


def replicas_column() -> str:
    return printed_columns("phoenixstage", "-n", NAMESPACE, STAGE)["REPLICAS"]


def test_readiness_follows_redis_reachability(probed_stage: None) -> None:
    eventually(lambda: (pod := worker()) and is_ready(pod), "the worker to become Ready", timeout=180, interval=1)
    eventually(lambda: replicas_column() == "1/1", "kubectl get phx to show 1/1", timeout=60, interval=1)

    kubectl("scale", "-n", NAMESPACE, f"deployment/{REDIS}", "--replicas=0")
    pod = eventually(
        lambda: p if (p := worker()) and not is_ready(p) else None, "the worker to leave Ready", timeout=90, interval=1
    )
    assert pod["status"]["phase"] == "Running"
    eventually(lambda: replicas_column() == "0/1", "kubectl get phx to show 0/1", timeout=60, interval=1)

    kubectl("scale", "-n", NAMESPACE, f"deployment/{REDIS}", "--replicas=1")
    eventually(lambda: (p := worker()) and is_ready(p), "the worker to be Ready again", timeout=120, interval=1)
    # The readiness probe did this, not a restart by the liveness probe.
    ready = worker()
    assert ready is not None and ready["metadata"]["uid"] == pod["metadata"]["uid"] and restarts(ready) == 0
