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
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from phoenix.producer import Record
from tests.fixtures.chain import A_IN, B_IN, END, arrived, enqueue
from tests.fixtures.cli import run_phoenix
from tests.fixtures.docs import DOCS, marked_block
from tests.fixtures.eventually import wait_until
from tests.fixtures.replies import stream_entries
from tests.fixtures.sentinel import MASTER_NAME, Address, SentinelSet
from tests.fixtures.workers import WorkerPool

pytestmark = pytest.mark.sentinel

RECORDS = 5000
WORKERS_PER_STAGE = 3
STAGES = {"a": (A_IN, B_IN), "b": (B_IN, END)}
# At this many records at the end the pipeline is under way: the failover comes mid-run.
FAIL_OVER_AT = 1000


def sentinel_env(stage: str, claim_idle_ms: str) -> dict[str, str]:
    env = {
        "CLAIM_IDLE_MS": claim_idle_ms,
        "REDIS_MODE": "sentinel",
        "REDIS_SENTINEL_MASTER": MASTER_NAME,
        "OUTPUT_QUEUE": STAGES[stage][1],
        "CONCURRENCY": "8",
        "MIN_REPLICAS_ACK": "1",
        # Generous on a loaded machine; a short count is logged (replicas_behind), never loses a record.
        "MIN_REPLICAS_TIMEOUT_MS": "5000",
    }
    if stage == "b":
        # Stage b keeps its input whole (no trim within the test), so B_IN shows every commit of stage a that
        # survived, by its entry id (the server's clock), as END shows those of stage b.
        env["TRIM_INTERVAL"] = "3600"
    return env


async def _run_through_failover(
    sentinels: SentinelSet,
    tmp_path: Path,
    fail_over: Callable[[Address], Awaitable[None]],
    what: str,
    claim_idle_ms: str,
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
        for stage in STAGES:
            for _ in range(WORKERS_PER_STAGE):
                pool.start(stage, **sentinel_env(stage, claim_idle_ms))
        await wait_until(lambda: _arrived_at_least(client, FAIL_OVER_AT), "the pipeline under way", timeout=120)
        old = await sentinels.primary()
        failed_at = time.time()
        await fail_over(old)
        new = await sentinels.failed_over(old, replicas=1)
        elected = time.time()
        await wait_until(lambda: _drained(client), "every record at the end, nothing left over", timeout=150)
        settled = time.time()
        # Each record exactly once, by record id: at the end, and forwarded by stage a.
        assert await arrived(client) == Counter(ids)
        assert Counter(f["record_id"] for _, f in await _forwards(client, B_IN)) == Counter(ids)
        for stage in STAGES:
            assert await client.xlen(f"phoenix:{stage}:dlq") == 0
        assert [w.process.name for w in pool.workers if not w.alive] == []
        assert all("worker_started" in w.event_names() for w in pool.workers)  # and every line is JSON
        # The processors' Redis calls failed during the election: retried, without opening any circuit.
        assert not [w.process.name for w in pool.workers if "circuit_state_changed" in w.event_names()]
        pauses = {stage: await _pause(client, output, failed_at, elected) for stage, (_, output) in STAGES.items()}
        print(
            f"\n{what}: primary {old} -> {new}, elected {elected - failed_at:.1f} s after; pause (last commit "
            f"before to first after) {', '.join(f'{s} {p:.2f} s' for s, p in pauses.items())}; "
            f"all {RECORDS} settled {settled - failed_at:.1f} s after the failover"
        )
        assert all(pause < elected - failed_at + 30 for pause in pauses.values())
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


async def _forwards(client: aioredis.Redis, stream: str) -> list[tuple[str, dict[str, str]]]:
    """The entries a stage's commits added to `stream`, leaving out those its own retries put back into it
    (`retry_count` set: the next stage's failures during the election go back into its input)."""
    return [(entry_id, f) for entry_id, f in await stream_entries(client, stream) if "retry_count" not in f]


async def _pause(client: aioredis.Redis, output: str, failed_at: float, elected: float) -> float:
    """Seconds between a stage's last surviving commit before the failover and its first after: the widest gap
    between consecutive entries of its output (ids start with the server's milliseconds) that overlaps the
    time from the failover's start to the election. Commits the old primary took and lost are not there."""
    stamps = [int(entry_id.partition("-")[0]) / 1000 for entry_id, _ in await _forwards(client, output)]
    return max(later - earlier for earlier, later in pairwise(stamps) if earlier <= elected and later >= failed_at)


@pytest.mark.timeout(240)
async def test_primary_sigkilled_mid_run_loses_and_repeats_nothing(sentinels: SentinelSet, tmp_path: Path) -> None:
    async def kill(primary: Address) -> None:
        sentinels.kill_primary(primary)

    # CLAIM_IDLE_MS as in production (5 min): nothing may wait for a reclaim. With MIN_REPLICAS_ACK=1 no commit is
    # lost, and what a broken read left pending on a worker's consumer that worker reads again at once.
    await _run_through_failover(sentinels, tmp_path, kill, "SIGKILL", claim_idle_ms="300000")


@pytest.mark.timeout(240)
async def test_forced_failover_mid_run_loses_and_repeats_nothing(sentinels: SentinelSet, tmp_path: Path) -> None:
    async def forced(_primary: Address) -> None:
        await sentinels.force_failover()

    # The old primary takes commits until it is demoted, and their WAITs time out: those commits are undone, and
    # their entries, pending on the new primary, are reclaimed after CLAIM_IDLE_MS (1 s here).
    await _run_through_failover(sentinels, tmp_path, forced, "SENTINEL FAILOVER", claim_idle_ms="1000")


@pytest.mark.timeout(60)
async def test_enqueue_waits_for_replicas_and_says_when_they_fall_short(
    sentinels: SentinelSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    primary = await sentinels.primary()
    replicas = await sentinels.replicas(primary)
    assert len(replicas) == 2
    # Through the Sentinels, with the flag.
    sentinel = ("--redis-mode", "sentinel", "--redis-sentinel-master", MASTER_NAME)
    enqueue_r1 = ("enqueue", "--service", "a", "--record-id", "r-1", "--min-replicas-ack", "2")
    done = run_phoenix(sentinels.url, *enqueue_r1, *sentinel)
    assert done.returncode == 0, done.stderr
    entry_id = done.stdout.strip()
    for address in replicas:  # on both replicas by the time the command returned
        copy = sentinels.client(address)
        try:
            assert [e for e, _ in await stream_entries(copy, A_IN)] == [entry_id]
        finally:
            await copy.aclose()

    # The same option from the environment, against the primary itself, with one replica frozen: the entry stands,
    # and the command says it may not survive a failover.
    url = f"redis://{primary[0]}:{primary[1]}/0"
    monkeypatch.setenv("MIN_REPLICAS_ACK", "2")
    monkeypatch.setenv("MIN_REPLICAS_TIMEOUT_MS", "300")
    async with sentinels.frozen(replicas[0]):
        short = run_phoenix(url, "enqueue", "--service", "a", "--record-id", "r-2", "--data", json.dumps({"n": 2}))
    assert short.returncode == 1
    late_id = short.stdout.strip()
    assert short.stderr.strip() == (
        f"{late_id} acknowledged by 1 of 2 replicas within 300 ms: a failover now could lose it; sending the "
        "record again is safe (a record id makes a second entry a duplicate)"
    )
    client = sentinels.client(primary)
    try:
        assert [f["record_id"] for _, f in await stream_entries(client, A_IN)] == ["r-1", "r-2"]
    finally:
        await client.aclose()

    monkeypatch.setenv("MIN_REPLICAS_ACK", "two")
    bad = run_phoenix(url, "enqueue", "--service", "a", "--record-id", "r-3")
    assert bad.returncode == 2
    assert "--min-replicas-ack: not a whole number >= 0: 'two'" in bad.stderr


async def test_documented_producer_waits_for_replicas(sentinels: SentinelSet) -> None:
    """docs/durability.md's producer, run as written, through the Sentinels."""
    args, code = marked_block("producer", DOCS / "durability.md")
    namespace: dict[str, Any] = {}
    exec(compile(code, args.removeprefix("file="), "exec"), namespace)
    produce = namespace["produce"]
    client = sentinels.master()
    try:
        [entry_id] = await produce(client, "a", [Record("r-1", {"n": 1})], replicas=2)
        replicas = await sentinels.replicas(await sentinels.primary())
        for address in replicas:
            copy = sentinels.client(address)
            try:
                assert [e for e, _ in await stream_entries(copy, A_IN)] == [entry_id]
            finally:
                await copy.aclose()
        async with sentinels.frozen(replicas[0]):
            with pytest.raises(RuntimeError, match=r"^1 records are on 1 of 2 replicas$"):
                await produce(client, "a", [Record("r-2", {"n": 2})], replicas=2)
    finally:
        await client.aclose()
