"""Circuit breaker: the state machine on its own, then a worker with a dependency that fails on demand."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from phoenix.worker_runtime.circuit_breaker import CircuitBreaker, CircuitState
from phoenix.worker_runtime.worker import Worker
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.replies import get_existing
from tests.fixtures.sample_stage import DLQ, IN, OUT, RETRY, add, idle, outputs
from tests.fixtures.workers import WorkerPool
from tests.processors import UnreachableRedisProcessor


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock) -> CircuitBreaker:
    return CircuitBreaker(5, 60, 3, clock=clock)


def test_opens_after_consecutive_failures_only() -> None:
    b = breaker(Clock())
    for _ in range(4):
        b.record_failure()
    b.record_success()  # the streak is broken
    for _ in range(4):
        b.record_failure()
    assert b.state is CircuitState.CLOSED and b.try_acquire()
    b.record_failure()
    assert b.state is CircuitState.OPEN
    assert not b.try_acquire() and b.trial_slots() == 0


def test_half_open_after_reset_timeout_admits_three_trials_and_closes() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(5):
        b.record_failure()
    clock.now += 59.9
    assert b.state is CircuitState.OPEN and b.seconds_until_half_open() > 0
    clock.now += 0.1
    assert b.state is CircuitState.HALF_OPEN
    assert [b.try_acquire() for _ in range(4)] == [True, True, True, False]
    b.record_success()
    b.record_success()
    assert b.state is CircuitState.HALF_OPEN
    b.record_success()
    assert b.state is CircuitState.CLOSED and b.trial_slots() is None


def test_any_failure_in_half_open_opens_again() -> None:
    clock = Clock()
    b = breaker(clock)
    for _ in range(5):
        b.record_failure()
    clock.now += 60
    assert b.try_acquire()
    b.record_success()
    b.record_failure()
    assert b.state is CircuitState.OPEN
    assert b.seconds_until_half_open() == 60


@pytest.mark.timeout(90)
async def test_worker_with_open_circuit_leaves_messages_queued_then_recovers(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await redis.set("dependency-down:s", 1)
    w = workers.start(
        "s",
        OUTPUT_QUEUE=OUT,
        CONCURRENCY="4",
        CIRCUIT_FAILURE_THRESHOLD="2",
        CIRCUIT_RESET_TIMEOUT="1",
        CIRCUIT_HALF_OPEN_CALLS="3",
        RETRY_BASE_SECONDS="3",
        RETRY_MAX_SECONDS="3",
    )
    for i in range(10):
        await add(redis, f"r{i}")
    await wait_until(lambda: w.logged("circuit_open_fast_fail"), "fast failures while open")
    # While open: two failures wait for their retry, the rest stay in the stream; nothing is dead-lettered.
    await asyncio.sleep(1.5)
    assert await redis.zcard(RETRY) >= 2
    assert await redis.xlen(DLQ) == 0
    calls_while_down = int(await get_existing(redis, "calls:s"))
    assert calls_while_down < 10  # it stopped calling the failing dependency for every message
    await redis.delete("dependency-down:s")
    await wait_until(lambda: _processed(redis, 10), "all ten processed after recovery", timeout=60)
    assert await redis.xlen(DLQ) == 0
    assert sorted(o["record_id"] for o in await outputs(redis)) == sorted(f"r{i}" for i in range(10))
    states = [(e["previous"], e["state"]) for e in w.events() if e["event"] == "circuit_state_changed"]
    assert ("CLOSED", "OPEN") in states and ("OPEN", "HALF_OPEN") in states and states[-1] == ("HALF_OPEN", "CLOSED")


async def _processed(redis: aioredis.Redis, n: int) -> bool:
    return await redis.xlen(OUT) == n and await idle(redis)


async def test_redis_unreachable_from_a_processor_does_not_open_the_circuit(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """A failover's election fails a processor's Redis calls; each such record is retried, but Redis being away is not
    the processor's dependency failing: an open circuit would idle the worker for CIRCUIT_RESET_TIMEOUT after Redis is
    back (measured in the failover tests before: two of three workers of a stage)."""
    port = free_loopback_port()
    for i in range(4):
        await add(redis, f"r{i}", port=port)
    async with running_worker(
        redis_url,
        processor=UnreachableRedisProcessor,
        concurrency=4,
        circuit_failure_threshold=2,
        retry_base_seconds=60,  # the retries stay in the retry set until the test has looked
        retry_max_seconds=60,
    ) as worker:
        await wait_until(lambda: _settled_all(redis, worker), "every record failed and settled")
        assert worker.breaker.state is CircuitState.CLOSED
    assert await redis.zcard(RETRY) == 4  # each retried, none left pending by an open circuit


async def _settled_all(redis: aioredis.Redis, worker: Worker) -> bool:
    groups = await redis.xinfo_groups(IN)
    return bool(groups) and groups[0]["lag"] == 0 and groups[0]["pending"] == 0 and not worker.in_flight
