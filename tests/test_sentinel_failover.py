"""Sentinel failover under load: a primary SIGKILLed (or a failover forced) while two chained stages run, and the
producer's side of MIN_REPLICAS_ACK (`phoenix enqueue`).

Real components only: a primary, two replicas and three Sentinels (tests/fixtures/sentinel.py), real `phoenix
worker` processes that find the primary through the Sentinels (REDIS_MODE=sentinel).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tests.fixtures.chain import A_IN, B_IN, END, arrived, enqueue
from tests.fixtures.cli import run_phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.sentinel import MASTER_NAME, Address, SentinelSet
from tests.fixtures.workers import WorkerPool, WorkerProcess

pytestmark = pytest.mark.sentinel

RECORDS = 5000
WORKERS_PER_STAGE = 3
STAGES = {"a": (A_IN, B_IN), "b": (B_IN, END)}
# At this many records at the end the pipeline is under way: the failover comes mid-run.
FAIL_OVER_AT = 1000


def sentinel_env(output: str) -> dict[str, str]:
    return {
        "REDIS_MODE": "sentinel",
        "REDIS_SENTINEL_MASTER": MASTER_NAME,
        "OUTPUT_QUEUE": output,
        "CONCURRENCY": "8",
        "MIN_REPLICAS_ACK": "1",
        # Generous on a loaded machine; a short count would be logged (replicas_behind), never lose a record.
        "MIN_REPLICAS_TIMEOUT_MS": "5000",
    }


async def _run_through_failover(
    sentinels: SentinelSet, tmp_path: Path, fail_over: Callable[[Address], Awaitable[None]], what: str
) -> None:
    """5,000 records through stages a -> b, three workers each, with `fail_over` done mid-run: every record
    arrives once, nothing is dead-lettered, pending or waiting to retry, and every worker is still running."""
    client = sentinels.master()
    pool = WorkerPool(sentinels.url, tmp_path / "logs")
    ids = [f"r{i}" for i in range(RECORDS)]
    try:
        # The producer's side: entries on both replicas before anything runs, so no failover can lose them.
        for start in range(0, RECORDS, 500):
            await enqueue(client, A_IN, ids[start : start + 500], action="sleep:0.01")
        assert await client.wait(2, 30_000) == 2
        for stage, (_, output) in STAGES.items():
            for _ in range(WORKERS_PER_STAGE):
                pool.start(stage, **sentinel_env(output))
        await wait_until(lambda: _arrived_at_least(client, FAIL_OVER_AT), "the pipeline under way", timeout=120)
        old = await sentinels.primary()
        failed_at = time.time()
        await fail_over(old)
        new = await sentinels.failed_over(old, replicas=1)
        elected = time.time()
        await wait_until(lambda: _drained(client), "every record at the end, nothing left over", timeout=150)
        settled = time.time()
        assert await arrived(client) == Counter(ids)  # each record exactly once, by record id
        for stage in STAGES:
            assert await client.xlen(f"phoenix:{stage}:dlq") == 0
        assert [w.process.name for w in pool.workers if not w.alive] == []
        assert all("worker_started" in w.event_names() for w in pool.workers)
        pauses = {stage: _pause(pool.workers, stage, failed_at) for stage in STAGES}
        print(
            f"\n{what}: primary {old} -> {new}, elected {elected - failed_at:.1f} s after; pause (last commit "
            f"before to first after) {', '.join(f'{s} {p:.2f} s' for s, p in pauses.items())}; "
            f"all {RECORDS} settled {settled - failed_at:.1f} s after the failover"
        )
    finally:
        pool.stop_all()
        await client.aclose()


async def _arrived_at_least(client: aioredis.Redis, n: int) -> bool | None:
    try:
        return await client.xlen(END) >= n
    except RedisError:
        return None  # the election under way


async def _drained(client: aioredis.Redis) -> bool | None:
    try:
        if await client.xlen(END) < RECORDS:
            return False
        for stage, (stream, _) in STAGES.items():
            [group] = await client.xinfo_groups(stream)
            if group["lag"] or group["pending"] or await client.zcard(f"phoenix:{stage}:retry"):
                return False
        return True
    except RedisError:
        return None


def _pause(workers: list[WorkerProcess], stage: str, failed_at: float) -> float:
    """Seconds from a stage's last commit before `failed_at` to its first after, from its workers' logs (a
    worker logs processing_complete once the commit is written, and with MIN_REPLICAS_ACK on a replica)."""
    stamps = sorted(
        datetime.fromisoformat(e["timestamp"]).timestamp()
        for w in workers
        if w.env["SERVICE_NAME"] == stage
        for e in w.events()
        if e["event"] == "processing_complete"
    )
    before = max(t for t in stamps if t <= failed_at)
    after = min(t for t in stamps if t > failed_at)
    return after - before


async def test_primary_sigkilled_mid_run_loses_and_repeats_nothing(sentinels: SentinelSet, tmp_path: Path) -> None:
    async def kill(primary: Address) -> None:
        sentinels.kill_primary(primary)

    await _run_through_failover(sentinels, tmp_path, kill, "SIGKILL")


async def test_forced_failover_mid_run_loses_and_repeats_nothing(sentinels: SentinelSet, tmp_path: Path) -> None:
    async def forced(_primary: Address) -> None:
        await sentinels.force_failover()

    await _run_through_failover(sentinels, tmp_path, forced, "SENTINEL FAILOVER")


async def test_enqueue_waits_for_replicas_and_says_when_they_fall_short(
    sentinels: SentinelSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = await sentinels.primary()
    url = f"redis://{primary[0]}:{primary[1]}/0"
    replicas = await sentinels.replicas(primary)
    assert len(replicas) == 2
    done = run_phoenix(url, "enqueue", "--service", "a", "--record-id", "r-1", "--min-replicas-ack", "2")
    assert done.returncode == 0, done.stderr
    entry_id = done.stdout.strip()
    for address in replicas:  # on both replicas by the time the command returned
        copy = sentinels.client(address)
        try:
            assert [e for e, _ in await copy.xrange(A_IN)] == [entry_id]
        finally:
            await copy.aclose()

    # The same option from the environment, with one replica frozen: the entry stands, and the command says it
    # may not survive a failover.
    monkeypatch.setenv("MIN_REPLICAS_ACK", "2")
    monkeypatch.setenv("MIN_REPLICAS_TIMEOUT_MS", "300")
    async with sentinels.frozen(replicas[0]):
        short = run_phoenix(url, "enqueue", "--service", "a", "--record-id", "r-2", "--data", json.dumps({"n": 2}))
    assert short.returncode == 1
    late_id = short.stdout.strip()
    assert short.stderr.strip() == (
        f"{late_id} acknowledged by 1 of 2 replicas within 300 ms: a failover now could lose it; enqueueing the "
        "record again is safe (its record id makes a second entry a duplicate)"
    )
    client = sentinels.client(primary)
    try:
        assert [f["record_id"] for _, f in await client.xrange(A_IN)] == ["r-1", "r-2"]
    finally:
        await client.aclose()

    monkeypatch.setenv("MIN_REPLICAS_ACK", "two")
    bad = run_phoenix(url, "enqueue", "--service", "a", "--record-id", "r-3")
    assert bad.returncode == 2
    assert "--min-replicas-ack: not a whole number >= 0: 'two'" in bad.stderr
