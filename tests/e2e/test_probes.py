"""The probes are what mark worker pods Ready: a worker whose Redis is unreachable runs but is not Ready."""

from __future__ import annotations

import time

import pytest

from tests.e2e.kube import apply_documents, is_ready, kubectl, pods, printed_columns
from tests.e2e.pipeline import NAMESPACE, Pipeline
from tests.fixtures.eventually import eventually

pytestmark = pytest.mark.e2e

STAGE = "no-redis"


def test_worker_with_unreachable_redis_is_running_but_not_ready(pipeline: Pipeline, phoenix_image: str) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "unreachable-redis"},
        # A Service name that does not exist: DNS cannot resolve it.
        "stringData": {"url": "redis://:nothing@no-such-redis:6379/0", "password": "nothing"},
    }
    stage = {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": STAGE},
        "spec": {
            "processor": "grouper",
            "image": phoenix_image,
            "redis": {"urlSecretRef": {"name": "unreachable-redis", "key": "url"}},
            "replicas": {"min": 1, "max": 1},
            "autoscaling": {"enabled": False},
        },
    }
    apply_documents([secret, stage], NAMESPACE)
    try:
        deadline = time.monotonic() + 180
        while not _running(pods(NAMESPACE, f"phoenix.io/stage={STAGE}")):
            assert time.monotonic() < deadline, "the worker pod never started"
            time.sleep(1)
        # Several readiness periods (5 s): the container runs, the probe keeps it out of the Service.
        held = time.monotonic() + 20
        while time.monotonic() < held:
            (pod,) = pods(NAMESPACE, f"phoenix.io/stage={STAGE}")
            assert not is_ready(pod), "a worker without Redis was marked Ready"
            time.sleep(2)
        eventually(lambda: printed_columns("phoenixstage", "-n", NAMESPACE, STAGE)["REPLICAS"] == "0/1",
                   "kubectl get phx to show 0 of 1 pods ready", timeout=60)  # fmt: skip
    finally:
        kubectl("delete", "-n", NAMESPACE, "phoenixstage", STAGE, "--wait=false")
        kubectl("delete", "-n", NAMESPACE, "secret", "unreachable-redis", "--wait=false")


def _running(found: list[dict]) -> bool:
    return any(
        status.get("state", {}).get("running")
        for pod in found
        for status in pod.get("status", {}).get("containerStatuses") or []
    )
