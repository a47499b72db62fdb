"""REDIS_MODE=cluster: the worker, the CLI and the operator's pool on a real 6-node Valkey cluster (3 primaries,
3 replicas; tests/fixtures/valkey_cluster.py) with one partition per stage, through a resharding (a slot
migrated while traffic runs) and a primary SIGKILLed mid-run (its replica takes over)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from phoenix.keys import StageKeys
from phoenix.redis_spec import RedisSpec, connect, is_cluster
from tests.fixtures.chain import A_IN, B_IN, END, arrived, enqueue
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.valkey_cluster import HOST, ValkeyCluster, valkey_cluster
from tests.fixtures.workers import WorkerPool
from tests.processors import ClusterScriptedProcessor

pytestmark = pytest.mark.cluster

KEYS = StageKeys.for_stage("s")
OUT = "phoenix:{default}:s:output"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    with valkey_cluster() as started:
        yield started


@pytest.fixture
async def client(cluster: ValkeyCluster) -> AsyncIterator[aioredis.Redis]:
    """The runtime's own cluster client (decoded), every primary flushed before the test."""
    spec = RedisSpec.from_url(cluster.url, mode="cluster")
    found = connect(spec, decode_responses=True)
    await found.initialize()  # type: ignore[attr-defined]
    await found.flushdb(target_nodes="primaries")  # type: ignore[call-arg]
    yield found
    await found.aclose()


async def _add(client: aioredis.Redis, ids: list[str], **data: str) -> None:
    for record_id in ids:
        await client.xadd(KEYS.input, {"record_id": record_id, "user_id": "u", "data": json.dumps(data)})


async def test_the_cluster_client_is_seeded_by_every_host(cluster: ValkeyCluster, client: aioredis.Redis) -> None:
    assert is_cluster(client)
    primaries = [node for node in client.get_primaries()]  # type: ignore[attr-defined]
    assert len(primaries) == 3


async def test_a_worker_commits_on_the_cluster(cluster: ValkeyCluster, client: aioredis.Redis) -> None:
    await _add(client, [f"r{i}" for i in range(200)])
    async with running_worker(cluster.url, processor=ClusterScriptedProcessor, redis_mode="cluster", output_queue=OUT):
        await wait_until(lambda: client.xlen(OUT), "the outputs", 60)
        await wait_until(lambda: _count_is(client, OUT, 200), "200 outputs", 60)
    assert sorted(f["record_id"] for _, f in await client.xrange(OUT)) == sorted(f"r{i}" for i in range(200))


async def _count_is(client: aioredis.Redis, stream: str, count: int) -> bool:
    return int(await client.xlen(stream)) >= count


# --- through a resharding and a failover, real `phoenix worker` processes -------------------------------------

RECORDS = 3000
STAGES = {"a": (A_IN, B_IN), "b": (B_IN, END)}


def _cluster_env(stage: str) -> dict[str, str]:
    return {
        "REDIS_MODE": "cluster",
        "OUTPUT_QUEUE": STAGES[stage][1],
        "CONCURRENCY": "8",
        # WAIT after each commit, on the slot's primary (redis_client.script_then_wait). Short: once the killed
        # primary's replica has taken over it has no replica, and each WAIT times out (the commit stands).
        "MIN_REPLICAS_ACK": "1",
        "MIN_REPLICAS_TIMEOUT_MS": "200",
    }


async def _drained(client: aioredis.Redis, records: int) -> bool | None:
    try:
        if await client.xlen(END) < records:
            return False
        for stage, (stream, _) in STAGES.items():
            keys = StageKeys.for_stage(stage)
            [group] = await client.xinfo_groups(stream)
            if group["lag"] or group["pending"] or await client.zcard(keys.retry):
                return False
        return True
    except RedisError:
        return None  # the failover under way


async def _at_least(client: aioredis.Redis, stream: str, count: int) -> bool | None:
    try:
        return int(await client.xlen(stream)) >= count
    except RedisError:
        return None


async def test_resharding_and_a_failover_mid_run_lose_and_repeat_nothing(
    cluster: ValkeyCluster, client: aioredis.Redis, tmp_path: Path
) -> None:
    """Two stages, three workers each, one partition (every key of the namespace in the slot of {default}): mid-run
    that busy slot is migrated to another primary, then that primary is SIGKILLed and its replica takes over. Every
    record arrives once, nothing is pending, retried or dead-lettered, and no worker exits."""
    slot = client.keyslot(A_IN)  # type: ignore[attr-defined]
    ids = [f"r{i}" for i in range(RECORDS)]
    # The producer's side: on the slot's primary, and on its replica before anything runs.
    source = cluster.primary_of_slot(slot)
    producer = aioredis.Redis(host=HOST, port=source, decode_responses=True)
    try:
        for start in range(0, RECORDS, 500):
            await enqueue(producer, A_IN, ids[start : start + 500], action="sleep:0.005")
        assert await producer.wait(1, 30_000) == 1
    finally:
        await producer.aclose()
    pool = WorkerPool(cluster.url, tmp_path / "logs")
    processor = f"{ClusterScriptedProcessor.__module__}:{ClusterScriptedProcessor.__qualname__}"
    try:
        for stage in STAGES:
            for _ in range(3):
                pool.start(stage, processor=processor, **_cluster_env(stage))
        await wait_until(lambda: _at_least(client, END, RECORDS // 5), "the pipeline under way", 180)
        target = next(port for port in cluster.primaries() if port != source)
        await asyncio.to_thread(cluster.migrate_slot, slot, target)
        await wait_until(lambda: _at_least(client, END, RECORDS // 2), "commits on the new primary", 180)
        cluster.kill(target)
        await asyncio.to_thread(cluster.wait_failed_over, target)
        await wait_until(lambda: _drained(client, RECORDS), "every record at the end, nothing left over", 300)
        assert await arrived(client) == Counter(ids)
        for stage in STAGES:
            assert await client.xlen(StageKeys.for_stage(stage).dlq) == 0
        assert [w.process.name for w in pool.workers if not w.alive] == []
        assert all("worker_started" in w.event_names() for w in pool.workers)  # and every line is JSON
    finally:
        pool.stop_all()
