"""Never lose a record: streams shrink only by what is finished, backpressure bounds them, the DLQ keeps count.

Real worker processes against a real Valkey: a stage `a` feeds a stage `b`, which writes to END.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.tools.queue_stats import collect
from tests.fixtures.chain import A_IN, B_IN, END, arrived, enqueue
from tests.fixtures.eventually import wait_until
from tests.fixtures.replies import read_group, recent_entries, stream_entries
from tests.fixtures.workers import WorkerPool


@pytest.mark.timeout(120)
async def test_backpressure_pauses_at_high_water_and_loses_nothing(redis: aioredis.Redis, workers: WorkerPool) -> None:
    high, concurrency = 100, 10
    ids = [f"r{i}" for i in range(3 * high)]
    await redis.xgroup_create(B_IN, "b-group", id="0", mkstream=True)  # stage b exists, but is stopped
    await enqueue(redis, A_IN, ids)
    a = workers.start(
        "a", OUTPUT_QUEUE=B_IN, OUTPUT_HIGH_WATER=str(high), CONCURRENCY=str(concurrency), TRIM_INTERVAL="0.2"
    )
    await wait_until(lambda: a.logged("backpressure_paused"), "stage a paused")
    await wait_until(lambda: redis.exists("phoenix:{default}:a:backpressure"), "the pause reported for the operator")
    await asyncio.sleep(2)  # several measurement and trim intervals: a stays paused, nothing disappears
    forwarded = await redis.xlen(B_IN)
    assert high <= forwarded <= high + 2 * concurrency
    [a_group] = await redis.xinfo_groups(A_IN)
    assert a_group["lag"] + a_group["pending"] + forwarded == len(ids)  # the rest waits in a's input, unread
    assert await redis.xlen(A_IN) >= len(ids) - forwarded  # a trimmed only entries it had acknowledged
    [stats] = await collect(redis, [StageKeys.for_stage("a")])
    assert stats.backpressure is not None and stats.backpressure >= high

    b = workers.start("b", OUTPUT_QUEUE=END, CONCURRENCY="20", TRIM_INTERVAL="0.2")
    await wait_until(lambda: _all_arrived(redis, len(ids)), "every record through a and b", timeout=90)
    assert await arrived(redis) == Counter(ids)  # each exactly once
    await wait_until(lambda: _shrunk(redis), "both inputs trimmed down to what was acknowledged")
    assert not await redis.exists("phoenix:{default}:a:backpressure")
    assert a.event_names().count("backpressure_resumed") >= 1
    # Logged once per pause, not once per message or per measurement.
    assert a.event_names().count("backpressure_paused") == a.event_names().count("backpressure_resumed")
    assert a.alive and b.alive


async def _all_arrived(redis: aioredis.Redis, n: int) -> bool:
    return await redis.xlen(END) >= n


async def _shrunk(redis: aioredis.Redis) -> bool:
    # XTRIM MINID keeps the last delivered entry itself.
    return await redis.xlen(A_IN) <= 1 and await redis.xlen(B_IN) <= 1


async def test_trimming_waits_for_the_slowest_consumer_group(redis: aioredis.Redis, workers: WorkerPool) -> None:
    ids = [f"r{i}" for i in range(10)]
    await redis.xgroup_create(A_IN, "audit", id="0", mkstream=True)  # a second reader of a's input, slower
    await enqueue(redis, A_IN, ids)
    workers.start("a", OUTPUT_QUEUE=B_IN, TRIM_INTERVAL="0.1")
    await wait_until(lambda: _count(redis, B_IN, 10), "a processed everything")
    await asyncio.sleep(1)  # ten trim intervals
    assert await redis.xlen(A_IN) == 10  # audit has read nothing: nothing may go

    entry_ids = [entry_id for entry_id, _ in await read_group(redis, "audit", "auditor", A_IN, 5)]
    await redis.xack(A_IN, "audit", *entry_ids[:3])
    await wait_until(lambda: _length(redis, A_IN, 7), "trimmed up to audit's oldest pending entry")
    await redis.xack(A_IN, "audit", *entry_ids[3:])
    await wait_until(lambda: _length(redis, A_IN, 6), "trimmed up to audit's last delivered entry")
    await asyncio.sleep(0.5)
    assert await redis.xlen(A_IN) == 6  # entries audit has not read yet stay
    assert [f["record_id"] for _, f in await stream_entries(redis, A_IN)] == ids[4:]


async def _count(redis: aioredis.Redis, stream: str, n: int) -> bool:
    return await redis.xlen(stream) >= n


async def _length(redis: aioredis.Redis, stream: str, n: int) -> bool:
    return await redis.xlen(stream) == n


async def test_dlq_over_its_limit_is_trimmed_counted_and_visible(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await enqueue(redis, A_IN, [f"gone{i}" for i in range(5)], action="missing")
    w = workers.start("a", DLQ_MAXLEN="3", TRIM_INTERVAL="0.1")
    await wait_until(lambda: redis.get("phoenix:{default}:a:dlq-trimmed"), "the DLQ trimmed to DLQ_MAXLEN")
    await wait_until(lambda: _length(redis, "phoenix:{default}:a:dlq", 3), "three dead letters kept")
    assert [f["record_id"] for _, f in await stream_entries(redis, "phoenix:{default}:a:dlq")] == [
        "gone2",
        "gone3",
        "gone4",
    ]
    assert await redis.get("phoenix:{default}:a:dlq-trimmed") == "2"
    assert sum(e["count"] for e in w.events() if e["event"] == "dlq_trimmed") == 2
    [stats] = await collect(redis, [StageKeys.for_stage("a")])
    assert (stats.dlq_length, stats.dlq_trimmed) == (3, 2)
    assert stats.as_status()["dlqTrimmed"] == 2  # what the operator writes to status.queue


async def test_dlq_is_unbounded_by_default(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await enqueue(redis, A_IN, [f"gone{i}" for i in range(5)], action="missing")
    w = workers.start("a", TRIM_INTERVAL="0.1")
    await wait_until(lambda: _length(redis, "phoenix:{default}:a:dlq", 5), "five dead letters")
    await asyncio.sleep(0.5)
    assert await redis.xlen("phoenix:{default}:a:dlq") == 5
    assert not await redis.exists("phoenix:{default}:a:dlq-trimmed")
    assert "dlq_trimmed" not in w.event_names()


@pytest.mark.subprocess
async def test_retired_stream_maxlen_stops_the_worker_with_one_line(redis_url: str, tmp_path: Path) -> None:
    pool = WorkerPool(redis_url, tmp_path)
    w = pool.start("a", STREAM_MAXLEN="5000")
    await wait_until(w.exited, "the worker refused to start")
    assert w.process.popen.returncode == 2
    [line] = w.process.log_path.read_text().splitlines()
    assert "STREAM_MAXLEN is no longer supported" in line and "OUTPUT_HIGH_WATER" in line


@pytest.mark.timeout(150)
async def test_a_chain_throttles_back_to_its_first_stage(redis: aioredis.Redis, workers: WorkerPool) -> None:
    """a -> b -> c with c stopped: b pauses at its high-water mark, then a does; a's producers see a backlog."""
    high, c_in, c_out = 50, "phoenix:{default}:c:input", "phoenix:{default}:c:output"
    ids = [f"r{i}" for i in range(6 * high)]
    await redis.xgroup_create(c_in, "c-group", id="0", mkstream=True)
    await enqueue(redis, A_IN, ids)
    env = {"OUTPUT_HIGH_WATER": str(high), "CONCURRENCY": "5", "TRIM_INTERVAL": "0.2"}
    a = workers.start("a", OUTPUT_QUEUE=B_IN, **env)
    b = workers.start("b", OUTPUT_QUEUE=c_in, **env)
    await wait_until(lambda: b.logged("backpressure_paused"), "b paused by c's backlog")
    await wait_until(lambda: a.logged("backpressure_paused"), "a paused by b's backlog")
    [a_group] = await redis.xinfo_groups(A_IN)
    assert a_group["lag"] > 0  # the first stage's input holds the rest, unread
    workers.start("c", OUTPUT_QUEUE=c_out, CONCURRENCY="20")
    await wait_until(lambda: _count(redis, c_out, len(ids)), "every record through a, b and c", timeout=120)
    assert await arrived(redis, c_out) == Counter(ids)


SINK = "sink:results"  # an output no consumer group reads: a sink read with XREAD, or by nobody


async def test_an_output_no_group_reads_is_warned_about_at_start_and_stops_the_stage(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """Without OUTPUT_RETENTION nothing ever shrinks such an output: the stage pauses for good, but says why."""
    high, concurrency = 50, 5
    await enqueue(redis, A_IN, [f"r{i}" for i in range(4 * high)])
    a = workers.start(
        "a", OUTPUT_QUEUE=SINK, OUTPUT_HIGH_WATER=str(high), CONCURRENCY=str(concurrency), TRIM_INTERVAL="0.2"
    )
    await wait_until(lambda: a.logged("output_unread"), "the worker warned that nobody reads its output")
    [warning] = [e for e in a.events() if e["event"] == "output_unread"]
    assert warning["level"] == "warning" and warning["output"] == SINK and warning["retention"] is None
    assert "OUTPUT_RETENTION" in warning["hint"]
    names = a.event_names()
    assert names.index("output_unread") < names.index("worker_started") + 3  # among the start lines
    await wait_until(lambda: a.logged("backpressure_paused"), "stage a paused at the high-water mark")
    await asyncio.sleep(2)  # ten trim intervals: an unread output without a retention keeps every entry
    forwarded = await redis.xlen(SINK)
    assert high <= forwarded <= high + 2 * concurrency
    [a_group] = await redis.xinfo_groups(A_IN)
    assert a_group["lag"] > 0  # the rest waits, unread: today's behaviour, now visible
    assert a.event_names().count("output_unread") == 1  # once, not once per trim

    # A group created later is seen by the next trim.
    await redis.xgroup_create(SINK, "late-reader", id="0")
    await wait_until(lambda: a.logged("output_read"), "the worker noticed the new consumer group")
    assert a.alive


async def test_a_start_trims_nothing_before_trim_interval(redis: aioredis.Redis, workers: WorkerPool) -> None:
    """A stage that keeps what it acknowledged (a long TRIM_INTERVAL, as the e2e suite's stages do to read exactly
    once back) keeps it across a restart: the start-up look at the output trims nothing."""
    await enqueue(redis, A_IN, ["r1", "r2", "r3"])
    first = workers.start("a", OUTPUT_QUEUE=SINK, TRIM_INTERVAL="3600")
    await wait_until(lambda: _length(redis, SINK, 3), "three records forwarded")
    first.stop()
    second = workers.start("a", OUTPUT_QUEUE=SINK, TRIM_INTERVAL="3600")
    await wait_until(lambda: second.logged("output_unread"), "the second worker's start-up lines")
    assert await redis.xlen(A_IN) == 3  # all acknowledged, none trimmed


async def test_output_retention_keeps_a_stage_with_an_unread_output_flowing(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    high, keep = 50, 30
    ids = [f"r{i}" for i in range(6 * high)]
    await enqueue(redis, A_IN, ids)
    a = workers.start(
        "a",
        OUTPUT_QUEUE=SINK,
        OUTPUT_HIGH_WATER=str(high),
        OUTPUT_RETENTION=f"maxlen:{keep}",
        CONCURRENCY="5",
        TRIM_INTERVAL="0.2",
    )
    await wait_until(lambda: _finished(redis, len(ids)), "every record processed although nobody reads the output")
    await wait_until(lambda: _length(redis, SINK, keep), "the output trimmed to OUTPUT_RETENTION")
    [line] = [e for e in a.events() if e["event"] == "output_unread"]
    assert (line["level"], line["output"], line["retention"]) == ("info", SINK, f"maxlen:{keep}")  # chosen
    assert "backpressure_paused" not in a.event_names()
    # The newest entries are the ones kept.
    assert [f["record_id"] for _, f in await stream_entries(redis, SINK)] == [
        f["record_id"] for _, f in (await recent_entries(redis, SINK, keep))[::-1]
    ]
    assert await redis.xlen(A_IN) <= 1  # the input was trimmed as usual


async def test_output_retention_by_age_and_never_for_a_read_output(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await redis.xgroup_create(B_IN, "b-group", id="0", mkstream=True)  # b reads this output (b is stopped)
    await enqueue(redis, A_IN, [f"r{i}" for i in range(20)])
    workers.start("a", OUTPUT_QUEUE=B_IN, OUTPUT_RETENTION="age:1s", TRIM_INTERVAL="0.2")
    await enqueue(redis, "phoenix:{default}:c:input", [f"c{i}" for i in range(20)])
    workers.start("c", OUTPUT_QUEUE=SINK, OUTPUT_RETENTION="age:1s", TRIM_INTERVAL="0.2")
    await wait_until(lambda: _count(redis, SINK, 1), "c forwarded to its unread output")
    await wait_until(lambda: _length(redis, SINK, 0), "entries older than a second removed", timeout=10)
    assert await redis.xlen(B_IN) == 20  # a group reads B_IN: the retention does not apply, nothing is lost


@pytest.mark.subprocess
async def test_a_bad_output_retention_stops_the_worker_with_one_line(redis_url: str, tmp_path: Path) -> None:
    pool = WorkerPool(redis_url, tmp_path)
    w = pool.start("a", OUTPUT_QUEUE=SINK, OUTPUT_RETENTION="100000")
    await wait_until(w.exited, "the worker refused to start")
    assert w.process.popen.returncode == 2
    [line] = w.process.log_path.read_text().splitlines()
    assert "OUTPUT_RETENTION" in line and "maxlen:" in line and "age:" in line and "'100000'" in line


async def _finished(redis: aioredis.Redis, n: int) -> bool:
    groups = await redis.xinfo_groups(A_IN)  # empty until the worker has created its group
    return any(g["entries-read"] == n and g["lag"] == 0 and g["pending"] == 0 for g in groups)
