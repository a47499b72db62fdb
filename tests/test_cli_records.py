"""`phoenix inspect` in each state a record can be in, and the runbook's fixes, against real workers and Valkey.

The workers run with the fast timings of tests/fixtures/workers.py; inspect is told the stage's CLAIM_IDLE_MS, as
a person passes the stage's settings when they differ from the defaults.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.record_format import LOCKED
from phoenix.tools.inspection import duration
from tests.fixtures.cli import phoenix, run_phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.records import committed, locked, record_key
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, RETRY, add, idle
from tests.fixtures.workers import FAST, WorkerPool


def inspect(redis_url: str, record_id: str, claim_idle_ms: str = FAST["CLAIM_IDLE_MS"]) -> dict[str, Any]:
    out = phoenix(
        redis_url, "inspect", "--service", "s", record_id, "--output", OUT, "--claim-idle-ms", claim_idle_ms, "--json"
    )
    return json.loads(out)


@pytest.mark.timeout(90)
async def test_in_flight_and_waiting_and_a_live_holders_lock_is_kept(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    await add(redis, "slow", action="sleep:30")
    queued = await add(redis, "queued")
    workers.start("s", OUTPUT_QUEUE=OUT, CONCURRENCY="1")
    await wait_until(lambda: locked(redis, "s", "slow"), "slow locked")

    slow = inspect(redis_url, "slow")
    assert slow["diagnosis"].startswith("in flight: ") and "is processing it" in slow["diagnosis"]
    [entry] = slow["entries"]
    assert entry["state"] == "pending" and entry["deliveries"] == 1 and entry["consumer"] == slow["lock"]["holder"]
    waiting = inspect(redis_url, "queued")
    assert [e["entry_id"] for e in waiting["entries"]] == [queued]
    assert waiting["diagnosis"].startswith(f"waiting: entry {queued} was added ")

    text = phoenix(redis_url, "inspect", "--service", "s", "slow", "--claim-idle-ms", FAST["CLAIM_IDLE_MS"])
    assert "  lock:   phoenix:{default}:s:record:slow held by " in text and text.splitlines()[-1].startswith(
        "diagnosis: in flight: "
    )

    refused = run_phoenix(redis_url, "unlock", "--service", "s", "slow", "--claim-idle-ms", FAST["CLAIM_IDLE_MS"])
    assert refused.returncode == 1 and refused.stderr.startswith("refused: phoenix:{default}:s:record:slow is held by ")
    assert await locked(redis, "s", "slow")
    forced = phoenix(redis_url, "unlock", "--service", "s", "slow", "--force", "--yes")
    assert forced.startswith("released phoenix:{default}:s:record:slow held by ")
    assert not await locked(redis, "s", "slow")


@pytest.mark.timeout(90)
async def test_locked_by_a_dead_worker_then_unlocked_and_reclaimed(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    await add(redis, "r1", action="crash-before")
    # A long lock and reclaim time, so the dead worker's traces stay until the commands act on them.
    slow_recovery = {"LOCK_TIMEOUT": "120", "CLAIM_IDLE_MS": "2000"}
    first = workers.start("s", OUTPUT_QUEUE=OUT, **slow_recovery)
    await wait_until(first.exited, "the worker killed itself holding the lock")
    await wait_until(lambda: _consumer_idle_over(redis, 2000), "the dead consumer idle past CLAIM_IDLE_MS")

    report = inspect(redis_url, "r1", "60000")  # under a longer CLAIM_IDLE_MS the holder still counts as alive
    assert report["diagnosis"].startswith("in flight: ")
    report = inspect(redis_url, "r1", "2000")
    assert report["diagnosis"].startswith("locked by a consumer that has been idle ")
    assert (
        "(dead): its entry is due to be reclaimed by the next live worker's reclaim pass, and the lock expires in "
    ) in report["diagnosis"]

    unlocked = phoenix(redis_url, "unlock", "--service", "s", "r1", "--claim-idle-ms", "2000")
    assert unlocked.startswith(f"released phoenix:{{default}}:s:record:r1 held by {report['lock']['holder']} (idle ")
    assert (
        phoenix(redis_url, "unlock", "--service", "s", "r1").strip()
        == "phoenix:{default}:s:record:r1 is not locked: nothing to release"
    )
    unlocked_report = inspect(redis_url, "r1", "2000")
    assert unlocked_report["diagnosis"].startswith(
        f"delivered to {report['lock']['holder']}, a consumer that has been idle "
    )
    assert unlocked_report["diagnosis"].endswith(
        "(dead): it is due to be reclaimed by the next live worker's reclaim pass; `phoenix reclaim` acts now"
    )
    # The dead consumer's entry is still pending on it: reclaim puts it back to work now.
    reclaimed = phoenix(redis_url, "reclaim", "--service", "s", "--claim-idle-ms", "2000", "--yes").splitlines()
    assert reclaimed[0].startswith(f"re-enqueued {report['entries'][0]['entry_id']} (record r1, ")
    assert reclaimed[-1] == "reclaimed 1 of 1 entries idle over 2000 ms in phoenix:{default}:s:input"
    assert inspect(redis_url, "r1", "2000")["diagnosis"].startswith("waiting for ")  # no live consumer now

    workers.start("s", OUTPUT_QUEUE=OUT, **slow_recovery)
    await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed by the second worker")
    done = inspect(redis_url, "r1", "2000")
    assert done["diagnosis"].startswith(
        f"committed by entry {done['marker']['committed_by']}; duplicates will be skipped for the next "
    )
    assert [f["stream"] for f in done["forwarded"]] == [OUT]
    assert await redis.hget("effects:s", "r1") == "1"


@pytest.mark.subprocess
async def test_reclaim_releases_the_dead_holders_lock_and_leaves_poison_to_the_worker(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """The atomic step of reclaim on entries set up by hand: one abandoned with its lock, one poison."""
    await redis.xgroup_create(IN, "s-group", id="0", mkstream=True)
    abandoned, poison = await add(redis, "a"), await add(redis, "p")
    await redis.xreadgroup("s-group", "dead-1", {IN: ">"}, count=2)
    await redis.set(record_key("s", "a"), LOCKED + "dead-1:0123456789ab")
    await redis.set(record_key("s", "p"), LOCKED + "someone-else:0123456789ab")
    for _ in range(2):  # three deliveries of the poison entry
        await redis.xclaim(IN, "s-group", "dead-1", 0, [poison])
    out = phoenix(
        redis_url, "reclaim", "--service", "s", "--claim-idle-ms", "1", "--max-deliveries", "3", "--yes"
    ).splitlines()
    assert out[0].startswith(f"re-enqueued {abandoned} (record a, dead-1, ") and out[0].endswith("; released its lock")
    assert out[1].startswith(f"left {poison} (record p, dead-1, ") and "dead-letters it (MAX_DELIVERIES=3)" in out[1]
    assert out[2] == "reclaimed 1 of 2 entries idle over 1 ms in phoenix:{default}:s:input"
    assert not await locked(redis, "s", "a") and await locked(redis, "s", "p")
    [(_, fields)] = await stream_entries(redis, IN, min="(" + poison)
    assert fields["record_id"] == "a" and fields["original_id"] == abandoned
    assert [row["message_id"] for row in await redis.xpending_range(IN, "s-group", "-", "+", 10)] == [poison]


@pytest.mark.timeout(60)
async def test_retrying_then_dead_lettered_then_reprocessed(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    await add(redis, "flaky", action="fail")
    await add(redis, "gone", action="missing")
    w = workers.start("s", OUTPUT_QUEUE=OUT, RETRY_BASE_SECONDS="120", RETRY_MAX_SECONDS="120")
    await wait_until(lambda: redis.zcard(RETRY), "flaky waiting for its retry")
    await wait_until(lambda: redis.xlen(DLQ), "gone dead-lettered")
    w.stop()

    flaky = inspect(redis_url, "flaky")
    [retry] = flaky["retries"]
    assert retry["attempt"] == 2 and retry["last_error"] == "RuntimeError: transient failure"
    assert flaky["diagnosis"] == (
        f"retrying: attempt 1 failed (RuntimeError: transient failure); attempt 2 is due "
        f"at {retry['due_at']} (in {duration(retry['due_in_seconds'])})"
    )
    gone = inspect(redis_url, "gone")
    [dead] = gone["dead_letters"]
    assert gone["diagnosis"] == (
        f"dead-lettered at {dead['failed_at']}: RecordNotFoundError: record gone does not "
        "exist (fix the cause, then `phoenix reprocess` or `phoenix dlq replay`)"
    )

    # Without a terminal and without --yes nothing happens.
    refused = run_phoenix(redis_url, "reprocess", "--service", "s", "gone")
    assert refused.returncode == 1 and "pass --yes to confirm" in refused.stderr
    assert await redis.xlen(DLQ) == 1
    done = phoenix(redis_url, "reprocess", "--service", "s", "gone", "--yes")
    assert done.startswith("enqueued gone as ") and done.strip().endswith(f"(from dlq entry {dead['entry_id']})")
    assert await redis.xlen(DLQ) == 0
    [(_, fields)] = [e for e in await stream_entries(redis, IN) if e[1]["record_id"] == "gone"][-1:]
    assert not {"error", "error_type", "failed_at", "retry_count"} & fields.keys()
    [(_, repaired)] = await stream_entries(redis, KEYS.audit)
    assert (repaired["action"], repaired["record_id"], repaired["detail"]) == ("reprocess", "gone", done.strip())


async def test_reprocess_a_committed_record_runs_it_again(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    first = await add(redis, "r1", n=1)
    workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed")
    await wait_until(lambda: idle(redis), "drained")
    out = phoenix(redis_url, "reprocess", "--service", "s", "r1", "--yes")
    assert (
        out.startswith("deleted phoenix:{default}:s:record:r1; enqueued r1 as ")
        and f"(from input entry {first})" in out
    )
    await wait_until(lambda: _effects(redis, "r1", "2"), "r1 processed a second time")
    assert await redis.xlen(OUT) == 2


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_no_trace_of_an_unknown_record(redis: aioredis.Redis, redis_url: str) -> None:
    report = inspect(redis_url, "nobody")
    assert report["diagnosis"].startswith(
        "no trace of nobody in the newest 100000 entries of phoenix:{default}:s:input"
    )
    assert not report["group_exists"]
    nothing = run_phoenix(redis_url, "reclaim", "--service", "s")
    assert nothing.returncode == 1 and nothing.stderr.startswith("phoenix reclaim: Redis error: NOGROUP")


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_dlq_export_then_purge_only_what_was_exported(redis: aioredis.Redis, redis_url: str) -> None:
    ids = [await add_entry(redis, DLQ, {"record_id": f"d{i}", "error": "boom"}) for i in range(3)]
    exported = run_phoenix(redis_url, "dlq", "export", "--service", "s")
    assert [json.loads(line)["id"] for line in exported.stdout.splitlines()] == ids
    assert exported.stderr.strip().endswith(f"phoenix dlq purge --service s --through {ids[-1]}")
    later = await redis.xadd(DLQ, {"record_id": "late"})
    refused = run_phoenix(redis_url, "dlq", "purge", "--service", "s", "--through", ids[-1])
    assert refused.returncode == 1 and await redis.xlen(DLQ) == 4
    purged = phoenix(redis_url, "dlq", "purge", "--service", "s", "--through", ids[-1], "--yes")
    assert purged.strip() == "deleted 3 entries from phoenix:{default}:s:dlq"
    assert [entry_id for entry_id, _ in await stream_entries(redis, DLQ)] == [later]
    assert phoenix(redis_url, "dlq", "purge", "--service", "s", "--all", "--yes").strip() == (
        "deleted 1 entries from phoenix:{default}:s:dlq"
    )
    assert await redis.xlen(DLQ) == 0  # --all deletes what it read: an entry dead-lettered meanwhile would stay
    purges = [(f["action"], f["count"]) for _, f in await stream_entries(redis, KEYS.audit)]
    assert purges == [("dlq-purge", "3"), ("dlq-purge", "1")]  # the refused one is not there


@pytest.mark.subprocess
async def test_dlq_export_names_the_namespace_in_its_purge_command(redis: aioredis.Redis, redis_url: str) -> None:
    """Another tenant's DLQ: the purge command export prints deletes that namespace's entries, not default's."""
    theirs = StageKeys.for_stage("s", "team-a").dlq
    exported_id = await add_entry(redis, theirs, {"record_id": "d0", "error": "boom"})
    await redis.xadd(DLQ, {"record_id": "mine", "error": "boom"})
    exported = run_phoenix(redis_url, "dlq", "export", "--service", "s", "--namespace", "team-a")
    hint = exported.stderr.strip().partition("delete exactly these with: ")[2]
    assert hint == f"phoenix dlq purge --service s --namespace team-a --through {exported_id}"
    phoenix(redis_url, *hint.split()[1:], "--yes")
    assert await redis.xlen(theirs) == 0 and await redis.xlen(DLQ) == 1


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_status_json_and_watch(redis: aioredis.Redis, redis_url: str) -> None:
    await redis.xgroup_create(IN, "s-group", id="0", mkstream=True)
    await add(redis, "r1")
    [row] = json.loads(phoenix(redis_url, "status", "--json"))
    undelivered_age = row.pop("oldestUndeliveredSeconds")
    assert undelivered_age >= 0 and row.pop("oldestUnfinishedSeconds") == undelivered_age
    assert row == {
        "namespace": "default",
        "stage": "s",
        "partitions": 1,
        "length": 1,
        "pending": 0,
        "lag": 1,
        "oldestPendingSeconds": None,
        "dlqLength": 0,
        "consumers": 0,
        "dlqTrimmed": 0,
        "throttled": 0,
    }
    watch = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "phoenix",
        "status",
        "--watch",
        "--interval",
        "0.2",
        "--redis-url",
        redis_url,
        stdout=subprocess.PIPE,
    )
    output = watch.stdout
    assert output is not None

    async def snapshot() -> list[str]:
        return [(await asyncio.wait_for(output.readline(), 30)).decode() for _ in range(3)]

    try:
        first = await snapshot()  # not a terminal: plain lines, one snapshot per change
        assert first[0].startswith("--- ") and first[1].split()[:2] == ["NAMESPACE", "STAGE"]
        assert first[2].split()[:5] == ["default", "s", "1", "0", "1"]
        await add(redis, "r2")
        second = await snapshot()
        assert second[2].split()[:5] == ["default", "s", "2", "0", "2"]
    finally:
        watch.terminate()
        await watch.wait()


async def _consumer_idle_over(redis: aioredis.Redis, ms: int) -> bool:
    consumers = await redis.xinfo_consumers(IN, "s-group")
    return bool(consumers) and all(int(c["idle"]) > ms for c in consumers)


async def _effects(redis: aioredis.Redis, record_id: str, count: str) -> bool:
    return await redis.hget("effects:s", record_id) == count


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_pending_on_a_live_consumer_without_a_lock_and_acknowledged_without_a_marker(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """Set up by hand: what a worker whose circuit opened leaves behind, and a record whose marker expired."""
    await redis.xgroup_create(IN, "s-group", id="0", mkstream=True)
    left, done = await add(redis, "left"), await add(redis, "done")
    await redis.xreadgroup("s-group", "pod-a", {IN: ">"}, count=2)
    await redis.xack(IN, "s-group", done)
    report = inspect(redis_url, "left", "60000")
    assert report["entries"][0]["entry_id"] == left and report["consumers"]["pod-a"]["alive"]
    assert report["diagnosis"].startswith("delivered to pod-a (alive) ")
    assert (
        "left pending without a lock (its circuit is open, or it is shutting down): if it stays idle, it will "
        "be reclaimed in " in report["diagnosis"]
    )
    assert inspect(redis_url, "done")["diagnosis"].startswith("acknowledged, but no marker, retry or dead letter")


async def _pending_idle_on(redis: aioredis.Redis, entry_id: str, idle_ms: int) -> bool:
    rows = await redis.xpending_range(IN, KEYS.consumer_group, min=entry_id, max=entry_id, count=1, idle=idle_ms)
    return bool(rows)


@pytest.mark.timeout(60)
async def test_reclaim_takes_nothing_from_a_live_worker(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    """Reclaim had no floor and no liveness check: below the lock-renewal interval it took a live worker's entries
    and released their locks, so a record ran twice at once (two LLM bills). Now an idle time below the lock timeout
    is refused, and the entries of a live consumer are left to it, as unlock leaves its locks."""
    timings = ["--lock-timeout", "2", "--claim-idle-ms", "60000"]
    workers.start("s", OUTPUT_QUEUE=OUT, LOCK_TIMEOUT="2", CLAIM_IDLE_MS="60000", CONCURRENCY="2")
    first = await add(redis, "r1", action="sleep:6")
    await wait_until(lambda: locked(redis, "s", "r1"), "r1 in the live worker's hands")
    # A second entry of the record: the live worker finds its own lock, and leaves the entry pending on itself.
    second = await add(redis, "r1")
    await wait_until(lambda: _pending_idle_on(redis, second, 2000), "the second entry idle for the lock timeout")

    refused = run_phoenix(redis_url, "reclaim", "--service", "s", *timings, "--idle-ms", "100", "--yes")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "phoenix reclaim: --idle-ms: an idle time of 100 ms is below the stage's lock timeout (2000 ms: "
        "LOCK_TIMEOUT, or CLAIM_IDLE_MS when shorter): entries idle that long may be in the hands of live workers; "
        "nothing changed"
    ]
    planned = phoenix(redis_url, "reclaim", "--service", "s", *timings, "--idle-ms", "2000", "--dry-run")
    [line, summary] = planned.splitlines()
    assert line.startswith(f"would leave {second} (record r1, ") and line.endswith(
        "is alive (CLAIM_IDLE_MS=60000), it may be processing it"
    ), line
    assert summary.startswith("would reclaim 0 of 1 entries idle over 2000 ms")
    done = phoenix(redis_url, "reclaim", "--service", "s", *timings, "--idle-ms", "2000", "--yes")
    assert done.startswith("nothing to reclaim: none of the 1 entries idle over 2000 ms")

    await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed by the live worker", 20)
    assert await committed(redis, "s", "r1") == first
    assert await redis.get("calls:s") == "1"  # never run twice at once
    assert await locked(redis, "s", "r1") is None
