"""Dying workers, slow work and shutdown: nothing is lost, nothing is forwarded twice."""

from __future__ import annotations

import asyncio
import json
import signal

import pytest
import redis.asyncio as aioredis

from tests.fixtures.eventually import wait_until
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.records import committed, locked, locked_records, record_key
from tests.fixtures.sample_stage import DLQ, IN, OUT, add, idle, outputs
from tests.fixtures.workers import WorkerPool


@pytest.mark.timeout(60)
async def test_sigkill_after_taking_the_lock(redis: aioredis.Redis, workers: WorkerPool) -> None:
    """Crash scenario 1: the lock outlives its holder; another worker waits it out, then processes once."""
    await add(redis, "r1", action="crash-before")
    # A lock that outlives the second worker's start however slow the machine; the test then lets it expire.
    stage = {"OUTPUT_QUEUE": OUT, "LOCK_TIMEOUT": "120"}
    first = workers.start("s", **stage, CONSUMER_NAME="pod-a")
    await wait_until(first.exited, "the worker killed itself holding the lock")
    assert await locked(redis, "s", "r1")
    assert (await redis.xpending(IN, "s-group"))["pending"] == 1
    second = workers.start("s", **stage, CONSUMER_NAME="pod-b")
    await wait_until(lambda: second.logged("record_locked_elsewhere"), "the dead worker's lock respected")
    assert not await committed(redis, "s", "r1")
    await redis.pexpire(record_key("s", "r1"), 1)  # LOCK_TIMEOUT passes
    await wait_until(lambda: committed(redis, "s", "r1"), "processed after the lock expired", timeout=20)
    await wait_until(lambda: idle(redis), "queue drained")
    assert [o["record_id"] for o in await outputs(redis)] == ["r1"]
    assert await redis.hget("effects:s", "r1") == "1"  # killed before the side effect: it happened once
    events = second.event_names()
    assert "stale_messages_claimed" in events


@pytest.mark.timeout(90)
async def test_sigkill_after_processing_before_the_acknowledgement(redis: aioredis.Redis, workers: WorkerPool) -> None:
    """Crash scenario 2: the work is redone, but the next stage receives the record exactly once."""
    await add(redis, "r1", action="crash-after")
    first = workers.start("s", OUTPUT_QUEUE=OUT, CONSUMER_NAME="pod-a")
    await wait_until(first.exited, "the worker killed itself after processing")
    assert await redis.hget("effects:s", "r1") == "1"
    assert await redis.xlen(OUT) == 0 and not await committed(redis, "s", "r1")
    workers.start("s", OUTPUT_QUEUE=OUT, CONSUMER_NAME="pod-b")
    await wait_until(lambda: committed(redis, "s", "r1"), "processed again", timeout=20)
    await wait_until(lambda: idle(redis), "queue drained")
    assert [o["record_id"] for o in await outputs(redis)] == ["r1"]
    assert await redis.hget("effects:s", "r1") == "2"  # the side effect repeats: the crash was mid-process


@pytest.mark.timeout(90)
async def test_restarted_pod_finishes_its_own_pending_entries_first(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await add(redis, "r1", action="crash-after")
    first = workers.start("s", OUTPUT_QUEUE=OUT, CONSUMER_NAME="pod-a", CLAIM_IDLE_MS="600000")
    await wait_until(first.exited, "crash")
    await wait_until(lambda: _lock_gone(redis), "lock expiry")
    # Same consumer name, reclaim disabled in practice: only the id-0 read can find the entry.
    workers.start("s", OUTPUT_QUEUE=OUT, CONSUMER_NAME="pod-a", CLAIM_IDLE_MS="600000")
    await wait_until(lambda: committed(redis, "s", "r1"), "own pending entry processed")
    assert [o["record_id"] for o in await outputs(redis)] == ["r1"]


@pytest.mark.timeout(60)
async def test_slow_processor_keeps_its_lock_and_its_entry(redis: aioredis.Redis, workers: WorkerPool) -> None:
    """Lock renewal: a live worker's long job is neither lost nor reclaimed by an eager neighbour."""
    await add(redis, "slow", action="sleep:4")
    env = {"OUTPUT_QUEUE": OUT, "LOCK_TIMEOUT": "1", "CLAIM_IDLE_MS": "1000", "CLAIM_INTERVAL": "0.2"}
    workers.start("s", CONSUMER_NAME="pod-a", **env)
    await wait_until(lambda: locked(redis, "s", "slow"), "lock taken")
    neighbour = workers.start("s", CONSUMER_NAME="pod-b", **env)
    for _ in range(6):  # 3 s, three lock lifetimes
        await asyncio.sleep(0.5)
        assert await redis.pttl(record_key("s", "slow")) > 0
        [entry] = await redis.xpending_range(IN, "s-group", "-", "+", 1)
        assert entry["consumer"] == "pod-a" and int(entry["time_since_delivered"]) < 1000
    await wait_until(lambda: committed(redis, "s", "slow"), "slow job done")
    assert await redis.hget("effects:s", "slow") == "1"
    assert "stale_messages_claimed" not in neighbour.event_names()
    assert [o["record_id"] for o in await outputs(redis)] == ["slow"]


@pytest.mark.timeout(60)
async def test_processing_timeout_is_a_transient_error(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await add(redis, "stuck", action="sleep:30")
    w = workers.start("s", OUTPUT_QUEUE=OUT, PROCESSING_TIMEOUT="0.5", RETRY_BASE_SECONDS="60", RETRY_MAX_SECONDS="60")
    await wait_until(lambda: redis.zcard("phoenix:{default}:s:retry"), "timed-out message scheduled for retry")
    [failure] = [e for e in w.events() if e["event"] == "processing_failed_will_retry"]
    assert failure["error"] == "processing exceeded PROCESSING_TIMEOUT=0.5s"
    assert failure["error_type"] == "TimeoutError"
    assert not await locked(redis, "s", "stuck")


@pytest.mark.timeout(60)
async def test_sigterm_finishes_in_flight_work_and_exits_zero(redis: aioredis.Redis, workers: WorkerPool) -> None:
    for i in range(3):
        await add(redis, f"r{i}", action="sleep:1")
    w = workers.start("s", OUTPUT_QUEUE=OUT, CONCURRENCY="3", SHUTDOWN_GRACE="10")
    await wait_until(lambda: _locks(redis, 3), "three messages in flight")
    assert await asyncio.to_thread(w.terminate) == 0
    assert sorted(o["record_id"] for o in await outputs(redis)) == ["r0", "r1", "r2"]
    assert (await redis.xpending(IN, "s-group"))["pending"] == 0


@pytest.mark.timeout(60)
async def test_sigterm_past_grace_leaves_work_pending_for_the_next_worker(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await add(redis, "long", action="sleep:30")
    w = workers.start("s", OUTPUT_QUEUE=OUT, SHUTDOWN_GRACE="0.5", CONSUMER_NAME="pod-a")
    await wait_until(lambda: locked(redis, "s", "long"), "in flight")
    assert await asyncio.to_thread(w.terminate) == 0
    assert "shutdown_left_pending" in w.event_names()
    [entry] = await redis.xpending_range(IN, "s-group", "-", "+", 1)  # never acknowledged
    assert entry["consumer"] == "pod-a"
    assert not await locked(redis, "s", "long")  # released, so the next worker need not wait LOCK_TIMEOUT
    assert await redis.xlen(OUT) == 0 and await redis.xlen(DLQ) == 0


async def test_entries_trimmed_while_pending_are_counted_and_cleared(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await redis.xgroup_create(IN, "s-group", id="0", mkstream=True)
    for i in range(5):
        await add(redis, f"r{i}")
    await redis.xreadgroup("s-group", "dead-pod", {IN: ">"}, count=5)  # a worker that read and died
    await redis.xtrim(IN, maxlen=0)
    w = workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: idle(redis), "pending list cleared")
    assert sum(e["count"] for e in w.events() if e["event"] == "trimmed_pending_cleared") == 5
    assert w.alive


@pytest.mark.timeout(60)
async def test_enqueue_before_the_first_worker_is_not_lost(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await add(redis, "early")  # the stream exists, the group does not yet: it is created at id 0
    workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: committed(redis, "s", "early"), "early record processed")
    [out] = await outputs(redis)
    assert json.loads(out["data"])["seen_by"] == "s"


async def _lock_gone(redis: aioredis.Redis) -> bool:
    return not await locked(redis, "s", "r1")


async def _locks(redis: aioredis.Redis, n: int) -> bool:
    return len(await locked_records(redis, "s")) == n


async def test_unreachable_redis_is_waited_for_not_crashed_on(workers: WorkerPool) -> None:
    w = workers.start("s", REDIS_URL=f"redis://:secret-pw@127.0.0.1:{free_loopback_port()}/0")
    await wait_until(lambda: w.logged("redis_unavailable"), "the worker reports Redis as unavailable")
    assert w.alive
    assert await asyncio.to_thread(w.terminate) == 0
    assert "secret-pw" not in w.process.log_path.read_text()


@pytest.mark.timeout(60)
async def test_locks_stay_renewed_while_draining(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await add(redis, "slow", action="sleep:3")
    w = workers.start("s", OUTPUT_QUEUE=OUT, LOCK_TIMEOUT="1", SHUTDOWN_GRACE="10")
    await wait_until(lambda: locked(redis, "s", "slow"), "in flight")
    w.process.popen.send_signal(signal.SIGTERM)
    for _ in range(4):  # two lock lifetimes into the drain
        await asyncio.sleep(0.5)
        assert await redis.pttl(record_key("s", "slow")) > 0
    assert await asyncio.to_thread(w.process.popen.wait, 30) == 0
    assert [o["record_id"] for o in await outputs(redis)] == ["slow"]
