"""Liveness sees a hung connection (issue 20): a worker whose Redis connection goes half-open (a loopback proxy
that stops forwarding and keeps the sockets open) fails /healthz within LIVENESS_TIMEOUT, whether its calls hang
for good (no socket timeout) or keep failing with a timeout and are retried; a fresh worker then finishes every
record exactly once. Real Valkey, real `phoenix worker` processes and the real Worker."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from phoenix.embedded import embedded_valkey
from phoenix.worker_runtime.settings import WorkerSettings, describe_validation_error
from phoenix.worker_runtime.worker import Worker
from tests.fixtures.eventually import wait_until
from tests.fixtures.health import probe
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.records import locked_records
from tests.fixtures.sample_stage import DLQ, OUT, add, idle, outputs
from tests.fixtures.tcp_proxy import tcp_proxy
from tests.fixtures.workers import FAST, WorkerPool
from tests.processors import OffRedisProcessor

OFF_REDIS = "tests.processors:OffRedisProcessor"
LIMIT = 4.0  # LIVENESS_TIMEOUT in these tests; above FAST's BLOCK_MS, as the settings require
BLOCK = int(FAST["BLOCK_MS"]) / 1000
SLOW = 1.5  # seconds a slow record's processing takes: longer than the test needs to see it started and blackhole
# Slack for the bound's upper side only: a loaded machine may answer a probe late, never early.
SLACK = 5.0
# Either way a call on the blackholed connection goes: hanging for good, or failing after 2 s (BLOCK_MS + margin,
# as client socket timeouts are set) and retried with backoff.
SOCKET_TIMEOUTS = pytest.mark.parametrize("socket_timeout", [None, 2.0], ids=["calls-hang", "calls-time-out"])


async def _forwarded(redis: aioredis.Redis) -> Counter[str]:
    return Counter(fields["record_id"] for fields in await outputs(redis))


async def _forwarded_at_least(redis: aioredis.Redis, count: int) -> bool:
    return await redis.xlen(OUT) >= count


def _failure(worker: Worker) -> str | None:
    ok, reason = worker.alive()
    return None if ok else reason


@pytest.mark.timeout(150)
async def test_a_worker_on_a_blackholed_connection_fails_healthz_and_a_fresh_worker_finishes_everything(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    records = [f"r{i}" for i in range(300)]
    # Every 25th record takes longer: the proxy blackholes while one of them is processed (its lock is taken), so
    # its outcome surely comes after, for a settler that cannot commit it, whatever the machine's load.
    slow = set(records[24::25])
    for record_id in records:
        await add(redis, record_id, sleep=SLOW if record_id in slow else 0.05)
    port = free_loopback_port()
    with tcp_proxy(redis_url) as proxy:
        hung = workers.start(
            "s",
            processor=OFF_REDIS,
            REDIS_URL=proxy.url,
            OUTPUT_QUEUE=OUT,
            CONCURRENCY="8",
            HEALTH_PORT=str(port),
            LIVENESS_TIMEOUT=str(LIMIT),
        )
        async with aiohttp.ClientSession() as http:

            async def unhealthy() -> tuple[int, str] | None:
                answer = await probe(http, port)
                return answer if answer and answer[0] == 503 else None

            async def mid_run() -> bool:
                return await _forwarded_at_least(redis, 20) and bool(slow & set(await locked_records(redis, "s")))

            await wait_until(lambda: probe(http, port), "the worker's health server", 30)
            await wait_until(mid_run, "the worker forwarding records, a slow one in hand", 60, interval=0.02)
            proxy.blackhole()
            blackholed = time.monotonic()
            # The intake's reads hang as well (records are waiting): whichever stalls first fails /healthz first.
            _, first = await wait_until(unhealthy, "/healthz to fail", SLOW + LIMIT + 30)
            elapsed = time.monotonic() - blackholed
            assert "stalled: no " in first and f"(LIVENESS_TIMEOUT={LIMIT:g}s)" in first, first
            assert elapsed <= SLOW + LIMIT + SLACK, f"503 came {elapsed:.1f}s after the blackhole"

            async def settle_stalled() -> str | None:
                answer = await unhealthy()
                return answer[1] if answer and "settle stalled: no commit has succeeded for " in answer[1] else None

            # The settler's limit counts from the slow record's outcome, at most SLOW after the blackhole.
            await wait_until(settle_stalled, "/healthz to name the settler", SLOW + LIMIT + 30)
            elapsed = time.monotonic() - blackholed
            assert elapsed <= SLOW + LIMIT + SLACK, f"the settler was named {elapsed:.1f}s after the blackhole"
            # The kubelet asks again before it restarts the container: still failing, logged once.
            for _ in range(3):
                assert (answer := await probe(http, port)) is not None and answer[0] == 503
        [line] = [e for e in hung.events() if e["event"] == "liveness_failed"]
        assert line["level"] == "error" and line["reason"] == first.strip()
        # The kubelet's restart: SIGTERM; the worker leaves its unsettled records pending.
        hung.terminate(timeout=90)
        before = await _forwarded(redis)
        assert 0 < sum(before.values()) < len(records), "the blackhole came mid-run"
    fresh = workers.start("s", processor=OFF_REDIS, OUTPUT_QUEUE=OUT, CONCURRENCY="8")
    await wait_until(lambda: idle(redis), "every record finished by the fresh worker", 120)
    assert await _forwarded(redis) == Counter(records)  # each exactly once: nothing lost, nothing twice
    assert await redis.xlen(DLQ) == 0
    assert fresh.alive


@pytest.mark.timeout(90)
@SOCKET_TIMEOUTS
async def test_a_settler_that_cannot_commit_fails_liveness_within_the_limit(
    redis: aioredis.Redis, redis_url: str, socket_timeout: float | None
) -> None:
    """A record in flight, the one slot taken: the intake only waits for a slot (healthy), the record finishes off
    Redis after the blackhole and its outcome waits for a settler that cannot commit. One slot, so one read took
    it: a second read could hang on the blackhole too."""
    hold = 2.0  # the record's processing: the blackhole comes while it runs
    records = ["r0"]
    for record_id in records:
        await add(redis, record_id, sleep=hold)
    with tcp_proxy(redis_url) as proxy:
        async with running_worker(
            proxy.url,
            processor=OffRedisProcessor,
            output_queue=OUT,
            liveness_timeout=LIMIT,
            socket_timeout=socket_timeout,
        ) as worker:

            async def in_flight() -> bool:
                return bool(worker.in_flight)

            async def failure() -> str | None:
                return _failure(worker)

            await wait_until(in_flight, "the record in flight", 30, interval=0.02)
            proxy.blackhole()
            blackholed = time.monotonic()
            reason = await wait_until(failure, "liveness to fail", hold + LIMIT + 30)
            elapsed = time.monotonic() - blackholed
            assert reason.startswith("settle stalled: no commit has succeeded for "), reason
            assert "intake" not in reason
            # Not before the limit (the outcome waited from when it came), not much after it.
            assert LIMIT <= elapsed <= hold + LIMIT + SLACK, f"failed {elapsed:.1f}s after the blackhole"
            proxy.resume()  # the connection comes back before the kubelet gave up: the same worker goes on

            async def recovered() -> bool:
                return await drained(worker) and worker.alive() == (True, "ok")

            await wait_until(recovered, "the worker to commit everything and be alive again", 60)
    assert await _forwarded(redis) == Counter(records)


@pytest.mark.timeout(60)
@SOCKET_TIMEOUTS
async def test_an_intake_hung_on_a_blackholed_connection_fails_liveness_within_the_limit(
    redis: aioredis.Redis, redis_url: str, socket_timeout: float | None
) -> None:
    """No work: the intake sits in XREADGROUP BLOCK, which hangs (or keeps timing out) once the proxy blackholes."""
    with tcp_proxy(redis_url) as proxy:
        async with running_worker(
            proxy.url,
            processor=OffRedisProcessor,
            output_queue=OUT,
            liveness_timeout=LIMIT,
            socket_timeout=socket_timeout,
        ) as worker:

            async def reading() -> bool:
                return bool(await redis.exists(worker.settings.input_queue)) and worker.alive()[0]

            async def failure() -> str | None:
                return _failure(worker)

            await wait_until(reading, "the worker reading", 30)
            proxy.blackhole()
            blackholed = time.monotonic()
            reason = await wait_until(failure, "liveness to fail", LIMIT + 30)
            elapsed = time.monotonic() - blackholed
            assert reason.startswith("intake stalled: no Redis read has returned for "), reason
            assert "settle" not in reason
            # The last read began at most one BLOCK_MS before the blackhole.
            assert LIMIT - BLOCK - 1.5 <= elapsed <= LIMIT + SLACK, f"failed {elapsed:.1f}s after the blackhole"
            proxy.resume()

            async def alive() -> bool:
                return worker.alive() == (True, "ok")

            await wait_until(alive, "the intake reading again", 30)
            await add(redis, "after")
            await wait_until(lambda: _forwarded_at_least(redis, 1), "a record read after the outage", 30)
    assert await _forwarded(redis) == Counter(["after"])


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_an_intake_on_a_primary_demoted_by_a_failover_fails_liveness_within_the_limit() -> None:
    """A failover's other face: the connection still works, but the server behind it became a replica, so every
    XREADGROUP is refused (READONLY) and retried forever. Without Sentinel (a DNS name that moved to the new
    primary) only a new connection helps: the restart."""
    with embedded_valkey() as primary_url, embedded_valkey() as new_primary_url:
        demoted = aioredis.Redis.from_url(primary_url, decode_responses=True)
        async with running_worker(primary_url, processor=OffRedisProcessor, liveness_timeout=LIMIT) as worker:

            async def reading() -> bool:
                return bool(await demoted.exists(worker.settings.input_queue)) and worker.alive()[0]

            async def failure() -> str | None:
                return _failure(worker)

            await wait_until(reading, "the worker reading", 30)
            new_primary = urlsplit(new_primary_url)
            await demoted.replicaof(new_primary.hostname, new_primary.port)
            demoted_at = time.monotonic()
            reason = await wait_until(failure, "liveness to fail", LIMIT + 30)
            elapsed = time.monotonic() - demoted_at
            assert reason.startswith("intake stalled: no Redis read has returned for "), reason
            assert LIMIT - BLOCK - 1.5 <= elapsed <= LIMIT + SLACK, f"failed {elapsed:.1f}s after the demotion"
            await demoted.replicaof("NO", "ONE")  # a primary again, emptied by the sync: the group is made anew

            async def alive() -> bool:
                return worker.alive() == (True, "ok")

            await wait_until(alive, "the intake reading again", 30)
        await demoted.aclose()


def test_liveness_timeout_is_derived_from_the_longest_call_and_refused_below_it() -> None:
    base: dict[str, Any] = {"service_name": "s", "processor": "tests.processors:OffRedisProcessor"}
    # Three attempts of the longest call, each followed by the 5 s retry cap; at least 60 s.
    assert WorkerSettings(**base).liveness_timeout == 60
    assert WorkerSettings(**base, block_ms=30_000).liveness_timeout == 105
    assert WorkerSettings(**base, min_replicas_ack=1, min_replicas_timeout_ms=40_000).liveness_timeout == 135
    assert WorkerSettings(**base, min_replicas_timeout_ms=40_000).liveness_timeout == 60  # no WAIT without acks
    assert WorkerSettings(**base, liveness_timeout=20).liveness_timeout == 20
    with pytest.raises(ValidationError) as refused:
        WorkerSettings(**base, block_ms=10_000, liveness_timeout=10)
    assert describe_validation_error(refused.value, WorkerSettings) == (
        "LIVENESS_TIMEOUT must exceed BLOCK_MS and, with MIN_REPLICAS_ACK, MIN_REPLICAS_TIMEOUT_MS: "
        "a healthy read or commit may take that long"
    )
