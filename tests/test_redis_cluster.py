"""REDIS_MODE=cluster: the worker, the CLI and the operator's pool on a real 6-node Valkey cluster (3 primaries,
3 replicas; tests/fixtures/valkey_cluster.py) with one partition per stage, through a resharding (a slot
migrated while traffic runs) and a primary SIGKILLed mid-run (its replica takes over)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from phoenix.keys import StageKeys, input_stream
from phoenix.operator.redis.ops import Destroyed, destroy
from phoenix.operator.redis.pool import RedisPool
from phoenix.producer import Producer, Record
from phoenix.redis_spec import RedisSpec, connect, is_cluster
from phoenix.tools import dlq
from phoenix.worker_runtime import ownership
from tests.fixtures.chain import A_IN, B_IN, END, arrived, enqueue
from tests.fixtures.cli import phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.replies import stream_entries
from tests.fixtures.valkey_cluster import HOST, ValkeyCluster, valkey_cluster
from tests.fixtures.workers import WorkerPool
from tests.processors import OutcomeProcessor

pytestmark = pytest.mark.cluster

KEYS = StageKeys.for_stage("s")
OUTCOMES = "tests.processors:OutcomeProcessor"  # no side effects: ScriptedProcessor's transaction spans two slots
OUT = "phoenix:{default}:s:output"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    with valkey_cluster() as started:
        yield started


@pytest.fixture
def fresh_cluster() -> Iterator[ValkeyCluster]:
    """A cluster of its own, for a test that SIGKILLs a primary (the shared one would be left without a replica)."""
    with valkey_cluster() as started:
        yield started


@contextlib.asynccontextmanager
async def _client_of(cluster: ValkeyCluster) -> AsyncIterator[aioredis.Redis]:
    """The runtime's own cluster client (decoded), every primary flushed first."""
    found = connect(RedisSpec.from_url(cluster.url, mode="cluster"), decode_responses=True)
    await found.initialize()
    await found.flushdb(target_nodes="primaries")
    try:
        yield found
    finally:
        await found.aclose()


@pytest.fixture
async def client(cluster: ValkeyCluster) -> AsyncIterator[aioredis.Redis]:
    async with _client_of(cluster) as found:
        yield found


@pytest.fixture
async def fresh_client(fresh_cluster: ValkeyCluster) -> AsyncIterator[aioredis.Redis]:
    async with _client_of(fresh_cluster) as found:
        yield found


async def _add(client: aioredis.Redis, ids: list[str], **data: str) -> None:
    for record_id in ids:
        await client.xadd(KEYS.input, {"record_id": record_id, "user_id": "u", "data": json.dumps(data)})


async def test_the_cluster_client_is_seeded_by_every_host(cluster: ValkeyCluster, client: aioredis.Redis) -> None:
    assert is_cluster(client)
    primaries = [node for node in client.get_primaries()]  # type: ignore[attr-defined]
    assert len(primaries) == 3


@pytest.mark.timeout(90)
async def test_a_worker_commits_on_the_cluster(cluster: ValkeyCluster, client: aioredis.Redis) -> None:
    await _add(client, [f"r{i}" for i in range(200)])
    async with running_worker(cluster.url, processor=OutcomeProcessor, redis_mode="cluster", output_queue=OUT):
        await wait_until(lambda: client.xlen(OUT), "the outputs", 60)
        await wait_until(lambda: _count_is(client, OUT, 200), "200 outputs", 60)
    assert sorted(f["record_id"] for _, f in await stream_entries(client, OUT)) == sorted(f"r{i}" for i in range(200))


async def _count_is(client: aioredis.Redis, stream: str, count: int) -> bool:
    return int(await client.xlen(stream)) >= count


# --- the CLI and the operator's pool -------------------------------------------------------------------------


def _cli(cluster: ValkeyCluster, *args: str) -> str:
    return phoenix(cluster.url, *args, "--redis-mode", "cluster")


@pytest.mark.timeout(120)
async def test_the_cli_enqueues_shows_inspects_and_handles_the_dlq_on_the_cluster(
    cluster: ValkeyCluster, client: aioredis.Redis
) -> None:
    for record in ("bad-1", "bad-2", "bad-3"):
        _cli(cluster, "enqueue", "--service", "c", "--record-id", record, "--data", json.dumps({"action": "invalid"}))
    keys = StageKeys.for_stage("c")
    async with running_worker(cluster.url, "c", OutcomeProcessor, redis_mode="cluster"):
        await wait_until(lambda: _count_is(client, keys.dlq, 3), "three dead letters", 60)
    status = json.loads(_cli(cluster, "status", "--json"))
    assert [(s["stage"], s["dlqLength"]) for s in status if s["stage"] == "c"] == [("c", 3)], status
    report = json.loads(_cli(cluster, "inspect", "--service", "c", "bad-2", "--json"))
    assert "bad-2" in json.dumps(report)
    assert len(_cli(cluster, "dlq", "list", "--service", "c").strip().splitlines()) >= 3
    assert "moved 3 entries back" in _cli(cluster, "dlq", "replay", "--service", "c", "--yes")
    assert await client.xlen(keys.input) == 6 and await client.xlen(keys.dlq) == 0
    await client.xadd(keys.dlq, {"record_id": "x"})
    assert "deleted 1 entries" in _cli(cluster, "dlq", "purge", "--service", "c", "--all", "--yes")


async def test_the_operators_pool_replays_and_destroys_on_the_cluster(
    cluster: ValkeyCluster, client: aioredis.Redis
) -> None:
    pool = RedisPool()
    try:
        operator = pool.client(RedisSpec.from_url(cluster.url, mode="cluster"))
        keys = StageKeys.for_stage("o")
        claimed = await ownership.claim(operator, keys, "uid-1", adopt=False)
        assert claimed.group
        for i in range(3):
            await client.xadd(keys.dlq, {"record_id": f"d{i}", "user_id": "u", "data": "{}"})
            await client.set(keys.record_prefix + f"d{i}", "done")
        assert await dlq.replay(operator, keys.dlq, keys.input, None, ledger=keys.replay_ledger("req-1")) == 3
        assert await client.xlen(keys.input) == 3
        destroyed = await destroy(operator, keys, "uid-1")
        assert isinstance(destroyed, Destroyed) and destroyed.keys >= 3
        assert not await client.exists(keys.owner, keys.input, *(keys.record_prefix + f"d{i}" for i in range(3)))
    finally:
        await pool.close()


# Fresh clients, and concurrent script calls on each: below the 100 connections a cluster node's pool allows, so
# a failure is the race, not MaxConnectionsError.
FRESH_CLIENTS, CONCURRENT_SCRIPTS = 25, 90


async def test_concurrent_scripts_on_a_fresh_pool_client_all_succeed(
    cluster: ValkeyCluster, client: aioredis.Redis
) -> None:
    """redis-py #3935: scripts run together on a cluster client that has not read its slot map yet fail now and
    then (NoScriptError, RedisClusterException, IndexError, AttributeError on a connection closed under it), as
    concurrent reconciles of stages on one cluster do on the operator's pool's new client. Every cluster client
    connect() builds reads its map once, before its first command runs. The race does not fail every fresh client,
    so the test takes several: before the fix each of 5 runs here failed (1 to 28 of the 2250 calls)."""
    spec = RedisSpec.from_url(cluster.url, mode="cluster")
    failures: list[str] = []

    async def one(operator: aioredis.Redis, key: str) -> None:
        try:
            assert await operator.register_script("return KEYS[1]")([key]) == key
        except Exception as exc:  # each failure collected, to show them all
            failures.append(f"{type(exc).__name__}: {exc}")

    for round_ in range(FRESH_CLIENTS):
        await client.script_flush()  # on every primary: each fresh client starts with no script loaded
        pool = RedisPool()
        try:
            operator = pool.client(spec)
            await asyncio.gather(*(one(operator, f"k{round_}-{i}") for i in range(CONCURRENT_SCRIPTS)))
        finally:
            await pool.close()
    assert failures == []


# --- through a resharding and a failover, real `phoenix worker` processes -------------------------------------

RECORDS = 3000
STAGES = {"a": (A_IN, B_IN), "b": (B_IN, END)}


def _cluster_env(output: str) -> dict[str, str]:
    return {
        "REDIS_MODE": "cluster",
        "OUTPUT_QUEUE": output,
        "CONCURRENCY": "8",
        # WAIT after each commit, on the slot's primary (replica_wait.run_then_wait). Short: once the killed
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


@pytest.mark.timeout(330)
async def test_resharding_and_a_failover_mid_run_lose_and_repeat_nothing(
    fresh_cluster: ValkeyCluster, fresh_client: aioredis.Redis, tmp_path: Path
) -> None:
    """Two stages, three workers each, one partition (every key of the namespace in the slot of {default}): mid-run
    that busy slot is migrated to another primary, then that primary is SIGKILLed and its replica takes over. Every
    record arrives once, nothing is pending, retried or dead-lettered, and no worker exits."""
    cluster, client = fresh_cluster, fresh_client
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
    try:
        for stage in STAGES:
            for _ in range(3):
                pool.start(stage, processor=OUTCOMES, **_cluster_env(STAGES[stage][1]))
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


# --- the done-when: a partitioned pipeline through a resharding and a failover -------------------------

PARTITIONED_RECORDS = 20_000
K = 8


@pytest.mark.timeout(930)
async def test_a_partitioned_pipeline_on_six_nodes_delivers_exactly_once_through_failover_and_migration(
    fresh_cluster: ValkeyCluster, fresh_client: aioredis.Redis, tmp_path: Path
) -> None:
    """Two stages of 8 partitions, 3 real `phoenix worker` processes each, 20,000 records: mid-run one busy slot is
    migrated to another primary and a primary is SIGKILLed (its replica takes over). Every record arrives exactly
    once, nothing is pending, retried or dead-lettered, and no worker exits."""
    cluster, client = fresh_cluster, fresh_client
    # pa -> pb -> the inputs of pc (no worker reads them): every hop keeps the record's partition, so each commit
    # (marker + forward + ack) is one script in one slot; the results are counted on pc's eight lane inputs.
    stages = {
        "pa": {"PARTITIONS": str(K), "OUTPUT_QUEUE": input_stream("pb"), "OUTPUT_PARTITIONS": str(K)},
        "pb": {"PARTITIONS": str(K), "OUTPUT_QUEUE": input_stream("pc"), "OUTPUT_PARTITIONS": str(K)},
    }
    keys = {stage: StageKeys.for_stage(stage, partitions=K) for stage in (*stages, "pc")}
    results = [lane.input for lane in keys["pc"].lanes]
    records = [Record(f"r{i}", {"n": i}) for i in range(PARTITIONED_RECORDS)]
    # The producer API, each batch on a replica before it returns: a SIGKILLed primary loses no record.
    await Producer(client, "pa", partitions=K, min_replicas_ack=1, min_replicas_timeout_ms=5000).send_many(records)
    pool = WorkerPool(cluster.url, tmp_path / "logs")
    # Above the default 10: each read of a worker's own pending entries counts a delivery of each, and the SIGKILL
    # makes many. Until the killed primary's replica serves (node timeout 3 s, then the election), each intake read
    # broken on it sets every lane to read its own pending entries again (worker.py, _reread_own_pending), while the
    # settler, committing lane after lane, retries the dead lanes' batches and holds back all commits: the entries
    # stay pending through each re-read, and reclaims after CLAIM_IDLE_MS add theirs. A healthy record must not be
    # dead-lettered as poison for that (the test counts the DLQ as a loss).
    env = {"MAX_DELIVERIES": "50"}
    try:
        for stage, settings in stages.items():
            for _ in range(3):
                pool.start(stage, processor=OUTCOMES, **{**_cluster_env(settings["OUTPUT_QUEUE"]), **env, **settings})
        busy = client.keyslot(keys["pa"].lanes[0].input)  # type: ignore[attr-defined]
        await wait_until(lambda: _total_at_least(client, results, PARTITIONED_RECORDS // 5), "under way", 600)
        source = cluster.primary_of_slot(busy)
        target = next(port for port in cluster.primaries() if port != source)
        await asyncio.to_thread(cluster.migrate_slot, busy, target)
        await wait_until(lambda: _total_at_least(client, results, PARTITIONED_RECORDS // 2), "half through", 600)
        victim = next(port for port in cluster.primaries() if port != target)
        cluster.kill(victim)
        await asyncio.to_thread(cluster.wait_failed_over, victim)
        await wait_until(lambda: _partitioned_drained(client, keys, results), "the pipeline drained", 900)
        assert [w.process.name for w in pool.workers if not w.alive] == []
    finally:
        pool.stop_all()
    arrived_ids: Counter[str] = Counter()
    for stream in results:
        arrived_ids.update(fields["record_id"] for _, fields in await stream_entries(client, stream))
    assert arrived_ids == Counter(r.record_id for r in records)  # exactly once
    for stage in stages:
        for lane in keys[stage].lanes:
            assert await client.xlen(lane.dlq) == 0


async def _total_at_least(client: aioredis.Redis, streams: list[str], count: int) -> bool | None:
    try:
        return sum([int(await client.xlen(stream)) for stream in streams]) >= count
    except RedisError:
        return None  # the failover under way


async def _partitioned_drained(client: aioredis.Redis, keys: dict[str, StageKeys], results: list[str]) -> bool | None:
    try:
        if not await _total_at_least(client, results, PARTITIONED_RECORDS):
            return False
        for stage in ("pa", "pb"):
            for lane in keys[stage].lanes:
                pending = await client.xpending(lane.input, keys[stage].consumer_group)
                if pending["pending"] or await client.zcard(lane.retry) or await client.xlen(lane.outbox):
                    return False
        return True
    except RedisError:
        return None
