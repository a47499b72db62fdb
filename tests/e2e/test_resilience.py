"""Losing pods mid-run loses and duplicates nothing: a worker pod force-deleted, the operator pod deleted; the
one-off annotations (restart, replay-dlq) carried out on real pods."""

from __future__ import annotations

import base64
import time
import uuid

import pytest
import redis as redis_client

from phoenix.stages.data_keys import grouped_key
from phoenix.stages.samples import ensure_samples
from tests.e2e.kubectl import is_ready, kubectl, kubectl_json, stage_pods, wait_rollout
from tests.e2e.pipeline import (
    DOCUMENTS_URL,
    NAMESPACE,
    Pipeline,
    assert_exactly_once,
    enqueue_documents,
    record_counts,
    stage,
    streams,
    wait_all_grouped,
)
from tests.fixtures.eventually import eventually

pytestmark = pytest.mark.e2e

OPERATOR = ("-n", "phoenix-system", "-l", "app.kubernetes.io/name=phoenix-operator")


def ready_pods(name: str) -> list[str]:
    return [pod["metadata"]["name"] for pod in stage_pods(NAMESPACE, name) if is_ready(pod)]


def test_force_deleted_worker_and_deleted_operator_lose_and_duplicate_nothing(
    pipeline: Pipeline, redis: redis_client.Redis
) -> None:
    ids = enqueue_documents(redis, streams("router")["input"], pipeline.documents, copies=20)
    # Mid-run: a parser pod holding unacknowledged entries, which another worker must claim once it is gone.
    parser = streams("parser")
    consumer = eventually(
        lambda: _busy_consumer(redis, parser), "a parser pod with entries in flight", timeout=180, interval=0.05
    )
    # Each pod is its own consumer, by the pod's name (the operator sets CONSUMER_NAME from it).
    kubectl("delete", "pod", "-n", NAMESPACE, consumer, "--grace-period=0", "--force")
    # Both operator replicas (the leader and its standby) go: the ones that come back must elect and converge.
    operators = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl_json("get", "pods", *OPERATOR)["items"]}
    kubectl("delete", "pod", "-n", "phoenix-system", *operators, "--wait=false")

    wait_all_grouped(redis, ids, timeout=360)
    assert_exactly_once(redis, ids)
    wait_rollout("phoenix-system", "phoenix-operator")
    ready = [p["metadata"]["uid"] for p in kubectl_json("get", "pods", *OPERATOR)["items"] if is_ready(p)]
    assert ready and not set(ready) & set(operators.values())
    # The new operator converges: a spec change made now is carried out.
    kubectl(
        "patch",
        "phoenixstage",
        "-n",
        NAMESPACE,
        "grouper",
        "--type=merge",
        "-p",
        '{"spec": {"worker": {"concurrency": 3}}}',
    )
    eventually(lambda: _concurrency_env("grouper") == "3", "the new operator to roll out the change", timeout=120)


def _busy_consumer(redis: redis_client.Redis, names: dict[str, str]) -> str | None:
    """A consumer of the stage's group with entries delivered and not yet acknowledged."""
    consumers = redis.xpending(names["input"], names["consumerGroup"])["consumers"]
    return next((c["name"] for c in consumers if int(c["pending"]) > 0), None)


def _concurrency_env(name: str) -> str | None:
    deployment = kubectl_json("get", "deployment", "-n", NAMESPACE, name)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return next((env.get("value") for env in container["env"] if env["name"] == "CONCURRENCY"), None)


def _replica_sets(name: str) -> dict[str, int]:
    items = kubectl_json("get", "replicasets", "-n", NAMESPACE, "-l", f"phoenix.io/stage={name}")["items"]
    return {rs["metadata"]["name"]: rs["status"].get("readyReplicas", 0) for rs in items}


def test_restart_annotation_replaces_the_pods_with_a_new_replica_set(
    pipeline: Pipeline, redis: redis_client.Redis
) -> None:
    before = _replica_sets("router")
    old_pods = set(ready_pods("router"))
    kubectl(
        "annotate", "phoenixstage", "-n", NAMESPACE, "router", f"phoenix.io/restart={time.time():.0f}", "--overwrite"
    )
    ids = enqueue_documents(redis, streams("router")["input"], pipeline.documents, copies=2)
    eventually(
        lambda: any(n not in before and ready for n, ready in _replica_sets("router").items()),
        "a new ReplicaSet with a ready pod",
        timeout=180,
    )
    eventually(
        lambda: not old_pods & {p["metadata"]["name"] for p in stage_pods(NAMESPACE, "router")},
        "the old pods to be gone",
        timeout=180,
    )
    wait_all_grouped(redis, ids, timeout=300)
    assert_exactly_once(redis, ids)
    assert stage("router")["status"].get("lastRestart")


def test_replay_dlq_brings_a_record_through_once_its_cause_is_fixed(redis: redis_client.Redis, tmp_path) -> None:
    document = f"late-{uuid.uuid4().hex[:8]}.pdf"
    record_id = f"replay-{document}"
    router = streams("router")
    redis.xadd(router["input"], {"record_id": record_id, "document_url": f"{DOCUMENTS_URL}/{document}"})
    # 404: no retry can help, so the record is dead-lettered at once.
    eventually(lambda: record_counts(redis, router["dlq"], [record_id])[record_id] == 1, "the DLQ entry", timeout=120)

    (sample, *_) = ensure_samples(tmp_path)
    kubectl(
        "exec",
        "-i",
        "-n",
        NAMESPACE,
        "deployment/documents",
        "--",
        "sh",
        "-c",
        f"base64 -d > /docs/{document}",
        input=base64.b64encode(sample.read_bytes()).decode(),
    )
    kubectl("annotate", "phoenixstage", "-n", NAMESPACE, "router", "phoenix.io/replay-dlq=all", "--overwrite")

    eventually(
        lambda: redis.exists(grouped_key(NAMESPACE, record_id)), "the replayed record to be grouped", timeout=240
    )
    assert record_counts(redis, router["dlq"], [record_id])[record_id] == 0
    assert record_counts(redis, streams("parser")["input"], [record_id])[record_id] == 1
    # The operator removes the annotation and then writes status.lastReplay (phoenix/operator/actions.replay): wait
    # for the later of the two, so that the earlier is settled too.
    last = eventually(lambda: stage("router")["status"].get("lastReplay"), "status.lastReplay", timeout=60)
    assert last["moved"] >= 1
    assert "phoenix.io/replay-dlq" not in (stage("router")["metadata"].get("annotations") or {})
