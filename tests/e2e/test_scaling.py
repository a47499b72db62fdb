"""KEDA scales a stage on its backlog, from zero up and back down after the cooldown; `kubectl get phx` shows the
backlog rising and falling and READY/REPLICAS as the pods are; `paused: true` holds the stage at zero pods; work
that is no backlog (an entry left pending by a gone worker, a record waiting to retry) wakes a stage at zero."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client

from phoenix.keys import StageKeys
from phoenix.record_format import committed_by
from tests.e2e.kubectl import (
    apply_documents,
    delete_stage,
    is_ready,
    kubectl,
    kubectl_json,
    printed_columns,
    stage_pods,
)
from tests.e2e.pipeline import DOCUMENTS_URL, NAMESPACE, Pipeline, enqueue_documents, stage_document
from tests.fixtures.replies import add_entry_now, get_text_now, read_group_now

pytestmark = pytest.mark.e2e

STAGE = "scaler"
MAX_REPLICAS = 4


def scaler_stage(image: str, paused: bool = False) -> dict[str, Any]:
    """The router's processor as a final stage, CPU-limited so that a backlog builds up and lasts, with KEDA's
    polling, cooldown and the HPA's scale-down window shortened so that the test sees a whole cycle in a few
    minutes, and a gone worker's entries claimed after 3 s instead of 5 min."""
    return stage_document(
        STAGE,
        "router",
        image,
        cpu=("50m", "150m"),
        replicas={"min": 0, "max": MAX_REPLICAS},
        autoscaling={"lagCount": 10, "pollingInterval": 2, "cooldownPeriod": 15, "scaleDownStabilizationSeconds": 10},
        worker={"claimIdleMs": 3000},
        paused=paused,
    )


@dataclass
class Sample:
    at: float
    desired: int
    ready: int
    printed: dict[str, str]

    def line(self) -> str:
        p = self.printed
        return (
            f"{self.at:6.1f}s  deployment {self.ready}/{self.desired}  kubectl get phx: READY={p['READY']} "
            f"REPLICAS={p['REPLICAS']} BACKLOG={p['BACKLOG']} PENDING={p['PENDING']}"
        )


class Timeline:
    def __init__(self) -> None:
        self.start = time.monotonic()
        self.samples: list[Sample] = []

    def sample(self) -> Sample:
        deployment = kubectl_json("get", "deployment", "-n", NAMESPACE, STAGE)
        ready = sum(is_ready(pod) for pod in stage_pods(NAMESPACE, STAGE))
        printed = printed_columns("phoenixstage", "-n", NAMESPACE, STAGE)
        sample = Sample(time.monotonic() - self.start, deployment["spec"].get("replicas", 0), ready, printed)
        self.samples.append(sample)
        return sample

    def until(self, condition: Any, what: str, timeout: float) -> Sample:
        deadline = time.monotonic() + timeout
        while not condition(sample := self.sample()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(s.line() for s in self.samples))
            time.sleep(1)
        return sample

    def backlogs(self) -> list[int]:
        return [int(s.printed["BACKLOG"]) for s in self.samples if s.printed["BACKLOG"].isdigit()]


@pytest.fixture(scope="module")
def scaler(pipeline: Pipeline, phoenix_image: str) -> Iterator[None]:
    apply_documents([scaler_stage(phoenix_image)], NAMESPACE)
    kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=120s", f"phoenixstage/{STAGE}")
    yield
    delete_stage(NAMESPACE, STAGE)


def stage_keys() -> StageKeys:
    """The stage's streams as the operator reports them."""
    streams = kubectl_json("get", "phoenixstage", "-n", NAMESPACE, STAGE)["status"]["streams"]
    return StageKeys.for_stage(STAGE, NAMESPACE, input=streams["input"], group=streams["consumerGroup"])


def input_stream() -> str:
    return stage_keys().input


def test_keda_scales_up_on_backlog_and_down_after_cooldown(
    scaler: None, pipeline: Pipeline, redis: redis_client.Redis, report_dir: Path
) -> None:
    timeline = Timeline()
    timeline.until(lambda s: s.desired == 0 and s.printed["BACKLOG"] == "0", "the idle stage at zero pods", 120)
    enqueue_documents(redis, input_stream(), pipeline.documents, copies=300)  # 1500 records
    top = timeline.until(lambda s: s.desired >= 2, "KEDA's HPA to scale beyond one pod", 180)
    # KEDA gave its HPA the stage's scale-down window (spec.autoscaling.scaleDownStabilizationSeconds).
    hpa = kubectl_json("get", "hpa", "-n", NAMESPACE, f"keda-hpa-{STAGE}")
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 10
    peak = timeline.until(
        lambda s: s.ready == s.desired == MAX_REPLICAS or s.printed["BACKLOG"] == "0", "all pods ready", 180
    )
    # The operator's status refresh (every 10 s) catches up with the pods it reports.
    if peak.ready == MAX_REPLICAS:
        timeline.until(
            lambda s: s.printed["REPLICAS"] == f"{s.ready}/{s.desired}" == f"{MAX_REPLICAS}/{MAX_REPLICAS}",
            "kubectl get phx to show every pod ready",
            60,
        )
    timeline.until(lambda s: s.printed["BACKLOG"] == "0", "the backlog to drain", 400)
    timeline.until(
        lambda s: s.desired == 0 and s.ready == 0 and s.printed["REPLICAS"] == "0/0",
        "KEDA to scale back to zero after the cooldown",
        180,
    )
    (report_dir / "scaling-timeline.txt").write_text("\n".join(s.line() for s in timeline.samples) + "\n")

    backlogs = timeline.backlogs()
    assert backlogs[0] == 0 and max(backlogs) > 0 and backlogs[-1] == 0
    rise = backlogs.index(max(backlogs))
    assert any(b < max(backlogs) for b in backlogs[rise:]), "the backlog never fell"
    assert top.desired >= 2
    assert max(s.desired for s in timeline.samples) <= MAX_REPLICAS


def test_paused_stage_holds_zero_pods_and_resumes(scaler: None, pipeline: Pipeline, redis: redis_client.Redis) -> None:
    timeline = Timeline()
    timeline.until(lambda s: s.desired == 0, "the stage at zero pods", 240)
    kubectl("patch", "phoenixstage", "-n", NAMESPACE, STAGE, "--type=merge", "-p", '{"spec": {"paused": true}}')
    scaled_object = timeline_wait_paused()
    assert scaled_object["metadata"]["annotations"]["autoscaling.keda.sh/paused"] == "true"
    enqueue_documents(redis, input_stream(), pipeline.documents, copies=4)
    held = time.monotonic() + 15
    while time.monotonic() < held:
        sample = timeline.sample()
        assert sample.desired == 0 and sample.ready == 0, sample.line()
        time.sleep(1)
    timeline.until(lambda s: s.printed["BACKLOG"] == "20", "kubectl get phx to show the held backlog", 60)
    kubectl("patch", "phoenixstage", "-n", NAMESPACE, STAGE, "--type=merge", "-p", '{"spec": {"paused": false}}')
    timeline.until(lambda s: s.ready >= 1, "pods back after unpausing", 180)
    timeline.until(lambda s: s.printed["BACKLOG"] == "0", "the held backlog to drain", 240)


def timeline_wait_paused() -> dict[str, Any]:
    """The ScaledObject once KEDA has carried out the pause, not only once the operator asked for it: KEDA marks it
    Paused before it stops its scale loop and deletes the HPA after, so until the HPA is gone a poll of the old
    loop can still wake the stage."""
    deadline = time.monotonic() + 60
    while True:
        scaled_object = kubectl_json("get", "scaledobject", "-n", NAMESPACE, STAGE)
        asked = (scaled_object["metadata"].get("annotations") or {}).get("autoscaling.keda.sh/paused") == "true"
        conditions = (scaled_object.get("status") or {}).get("conditions") or []
        paused = any(c["type"] == "Paused" and c["status"] == "True" for c in conditions)
        hpa = (scaled_object.get("status") or {}).get("hpaName") or f"keda-hpa-{STAGE}"
        if asked and paused and not kubectl("get", "hpa", "-n", NAMESPACE, hpa, "--ignore-not-found").strip():
            return scaled_object
        if time.monotonic() > deadline:
            raise AssertionError(f"KEDA did not pause the ScaledObject: {scaled_object['metadata']}, {conditions}")
        time.sleep(1)


def test_entries_of_a_gone_worker_and_waiting_retries_wake_a_stage_at_zero(
    scaler: None, pipeline: Pipeline, redis: redis_client.Redis
) -> None:
    """Neither is lag, the backlog KEDA wakes a stage on: one record is delivered to a consumer that never
    acknowledges it (as a pod that died after reading), another waits in the retry set. Each must wake the stage,
    be finished by its worker (reclaimed, promoted when due) and let the stage go back to zero."""
    timeline = Timeline()
    timeline.until(lambda s: s.desired == 0 and s.ready == 0, "the stage at zero pods", 240)
    keys = stage_keys()
    orphan, retried = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("orphan", "retry"))
    document = f"{DOCUMENTS_URL}/{pipeline.documents[0]}"
    entry_id = add_entry_now(redis, keys.input, {"record_id": orphan, "document_url": document})
    delivered = read_group_now(redis, keys.consumer_group, "gone-pod", keys.input, 10)
    assert [entry for entry, _ in delivered] == [entry_id], "the stage had undelivered entries"
    seconds, micros = redis.time()
    member = json.dumps(["record_id", retried, "document_url", document])
    redis.zadd(keys.retry, {member: seconds * 1000 + micros // 1000})
    assert redis.xpending(keys.input, keys.consumer_group)["pending"] == 1

    timeline.until(lambda s: s.desired >= 1, "KEDA to wake the stage for the pending entry and the retry", 120)
    deadline = time.monotonic() + 180
    while not all(committed_by(get_text_now(redis, keys.record_prefix + record)) for record in (orphan, retried)):
        if time.monotonic() > deadline:
            states = {record: redis.get(keys.record_prefix + record) for record in (orphan, retried)}
            raise AssertionError(
                f"not committed within 180 s: {states}, pending {redis.xpending(keys.input, keys.consumer_group)}, "
                f"retry set {redis.zrange(keys.retry, 0, -1)}\n" + "\n".join(s.line() for s in timeline.samples)
            )
        timeline.sample()
        time.sleep(1)
    assert redis.xpending(keys.input, keys.consumer_group)["pending"] == 0
    assert redis.zcard(keys.retry) == 0
    timeline.until(lambda s: s.desired == 0 and s.ready == 0, "KEDA to scale back to zero once both are done", 180)
