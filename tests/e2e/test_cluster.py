"""A partitioned stage (4 partitions) on an in-cluster Valkey Cluster of three primaries
(tests/e2e/valkey_cluster.py): the workers and the operator run with REDIS_MODE=cluster, the real KEDA scales the
stage 0 -> N -> 0 through its redis-cluster-streams / redis-cluster triggers per partition (its outbox's too) summed
by its formula, and every record is forwarded exactly once (relayed from each partition's slot to the output
stream's)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client

from phoenix.keys import StageKeys
from tests.e2e.kubectl import apply_documents, kubectl, kubectl_json
from tests.e2e.pipeline import Pipeline, record_counts
from tests.e2e.redis_set import DOCUMENTS, StageReplicas, fresh_namespace, router_stage
from tests.e2e.valkey_cluster import NAMESPACE, cluster_set, form_cluster, node_clients, node_of, wait_set_ready

pytestmark = pytest.mark.e2e

STAGE, OUTPUT = "cluster-router", "cluster:routed"
PARTITIONS = 4
MAX_REPLICAS = 3
# 1500 records: at about 20 a second on the CPU-limited pod the backlog lasts over a minute, so the HPA (its sync
# every 15 s, after KEDA's 0 -> 1) sees the summed lag ask for more pods; 100 were done in 5 s, before any sync.
COPIES = 300


def lag_count(records: int) -> int:
    """A target per pod that no single partition's share of `records` reaches (so the HPA's maximum over the
    triggers would ask for one pod) while their sum asks for at least two: only the formula scales out."""
    return records // 2


def cluster_stage(image: str, lag: int) -> dict[str, Any]:
    """The router's processor on the cluster, partitioned (acknowledged entries kept, to count them)."""
    return router_stage(
        STAGE,
        image,
        OUTPUT,
        MAX_REPLICAS,
        {"mode": "cluster"},
        lag_count=lag,
        partitions=PARTITIONS,
        env=[{"name": "TRIM_INTERVAL", "value": "86400"}],
    )


@pytest.fixture(scope="module")
def formed(pipeline: Pipeline, valkey_image: str) -> Iterator[None]:
    """The Valkey Cluster up and formed; the stage is applied by the test (its lagCount follows the records)."""
    with fresh_namespace(NAMESPACE):
        apply_documents(cluster_set(valkey_image), NAMESPACE)
        wait_set_ready()
        form_cluster()
        yield


def test_keda_scales_a_partitioned_stage_on_a_valkey_cluster_by_its_summed_lag(
    formed: None, pipeline: Pipeline, phoenix_image: str, report_dir: Path
) -> None:
    keys = StageKeys.for_stage(STAGE, NAMESPACE, output=OUTPUT, partitions=PARTITIONS)
    replicas = StageReplicas(NAMESPACE, STAGE)
    records = COPIES * len(pipeline.documents)
    lag = lag_count(records)
    apply_documents([cluster_stage(phoenix_image, lag)], NAMESPACE)
    kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=180s", f"phoenixstage/{STAGE}", timeout=210)
    scaled_object = kubectl_json("get", "scaledobject", "-n", NAMESPACE, STAGE)["spec"]
    triggers = scaled_object["triggers"]
    types = Counter(t["type"] for t in triggers)
    # Lag, pending and outbox (every lane relays: OUTPUT is in another slot) on streams, the retry set on a set.
    assert types == {"redis-cluster-streams": 3 * PARTITIONS, "redis-cluster": PARTITIONS}
    assert {t["metadata"].get("stream") or t["metadata"]["listName"] for t in triggers} == {
        name for lane in keys.lanes for name in (lane.input, lane.retry, lane.outbox)
    }
    formula = scaled_object["advanced"]["scalingModifiers"]["formula"]
    assert "sum([lag0, lag1, lag2, lag3])" in formula and "sum([outbox0, outbox1, outbox2, outbox3])" in formula
    authentication = kubectl_json("get", "triggerauthentication", "-n", NAMESPACE, f"{STAGE}-redis")
    assert {ref["parameter"] for ref in authentication["spec"]["secretTargetRef"]} == {"password"}
    replicas.until(lambda: replicas.now() == (0, 0), "the idle stage at zero pods", 180)

    started = time.monotonic()
    with node_clients() as nodes:
        ids = _enqueue(nodes, keys, pipeline.documents)
        shares = Counter(keys.lane_of(record_id).partition for record_id in ids)
        assert len(shares) == PARTITIONS and max(shares.values()) <= lag, f"a partition alone above lagCount: {shares}"
        replicas.until(lambda: replicas.now()[1] >= 1, "KEDA to wake the stage through the cluster triggers", 180)
        woke_after = time.monotonic() - started
        replicas.until(lambda: replicas.now()[0] >= 2, "the summed lag to ask for more than one pod", 180)
        output = nodes[node_of(OUTPUT)]

        def done() -> bool:
            return len(record_counts(output, OUTPUT, ids)) == len(ids)

        replicas.until(done, f"all {len(ids)} records routed", 900)
        counts = record_counts(output, OUTPUT, ids)
        assert {record_id: n for record_id, n in counts.items() if n != 1} == {}, "records forwarded twice"
        for lane in keys.lanes:
            node = nodes[node_of(lane.input)]
            assert record_counts(node, lane.dlq, ids) == Counter(), f"partition {lane.partition} dead-lettered"
            replicas.until(
                lambda node=node, lane=lane: node.xpending(lane.input, lane.consumer_group)["pending"] == 0,
                f"nothing pending in partition {lane.partition}",
                120,
            )
    replicas.until(lambda: replicas.now() == (0, 0), "KEDA to scale back to zero after the cooldown", 300)
    peak = replicas.peak
    assert 2 <= peak <= MAX_REPLICAS
    (report_dir / "cluster.txt").write_text(
        f"{len(ids)} records over {PARTITIONS} partitions ({dict(sorted(shares.items()))}) on 3 primaries, exactly "
        f"once; lagCount {lag}: a pod ready {woke_after:.0f} s after the first enqueue (from 0), at most {peak} "
        "pods by the summed lag, back to 0\n"
    )


def _enqueue(nodes: list[redis_client.Redis], keys: StageKeys, documents: list[str]) -> list[str]:
    """The router's records, each written to its partition's input on the primary holding that slot (what the
    producer API does through a cluster client; from outside the cluster only the port-forwards reach the nodes)."""
    batch = uuid.uuid4().hex[:8]
    ids = []
    for copy in range(COPIES):
        for number, document in enumerate(documents):
            record_id = f"{batch}-{copy}-{number}"
            lane = keys.lane_of(record_id)
            nodes[node_of(lane.input)].xadd(
                lane.input, {"record_id": record_id, "document_url": f"{DOCUMENTS}/{document}"}
            )
            ids.append(record_id)
    return ids
