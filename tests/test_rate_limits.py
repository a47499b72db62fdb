"""Rate limits shared by every pod of a stage (issue 34): real `phoenix worker` processes on the real Valkey hold one
limit together; a user's own limit keeps a heavy user from starving the others; a provider's 429 pauses every pod;
reported usage counts for a tokens limit. A record held back is no failure: no retry count, no dead letter."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable

import pytest
import redis.asyncio as aioredis
from pydantic import ValidationError

from phoenix.errors import ConfigError
from phoenix.keys import StageKeys
from phoenix.producer import Producer, Record
from phoenix.rate_limits import RateLimit
from phoenix.tools import queue_stats
from phoenix.worker_runtime.rate_limit import HOLD_MS
from phoenix.worker_runtime.settings import load_settings
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.replies import scored_members, stream_entries
from tests.fixtures.sample_stage import DLQ, OUT, RETRY, finished, idle, outputs
from tests.fixtures.workers import WorkerPool
from tests.processors import LimitedCallProcessor

PROCESSOR = "tests.processors:LimitedCallProcessor"


async def _call_times(redis: aioredis.Redis) -> list[int]:
    return [int(ms) for ms in await redis.lrange("calls-at:s", 0, -1)]


async def _sleep_until(when: float) -> bool:
    await asyncio.sleep(max(0.0, min(1.0, when - time.time())))
    return time.time() >= when


@pytest.mark.timeout(120)
async def test_three_workers_share_one_limit_of_20_per_second(redis: aioredis.Redis, workers: WorkerPool) -> None:
    """A backlog far over what 30 s at 20/s allow: three processes together deliver 600 in 30 s, within 10%."""
    await Producer(redis, "s").send_many(Record(f"r{i}", {}, "u") for i in range(1500))
    limits = json.dumps([{"rate": 20, "burst": 1}])
    for _ in range(3):
        workers.start("s", PROCESSOR=PROCESSOR, OUTPUT_QUEUE=OUT, CONCURRENCY="16", RATE_LIMITS=limits)
    await wait_until(lambda: redis.llen("calls-at:s"), "the first call", 30)
    first = (await _call_times(redis))[0]
    await wait_until(lambda: redis.zcard(RETRY), "records held back waiting in the retry set", 30)
    await wait_until(lambda: _sleep_until(first / 1000 + 31), "31 s after the first call", 40)
    calls = await _call_times(redis)
    in_window = sum(1 for ms in calls if first <= ms < first + 30_000)
    print(f"three workers, a shared 20/s limit: {in_window} calls in 30 s (target 600 +- 10%)")
    assert 540 <= in_window <= 660
    assert await redis.xlen(DLQ) == 0  # held back is no failure
    held = [json.loads(member) for member, _ in await scored_members(redis, RETRY)]
    assert held and all("retry_count" not in member for member in held)  # as they came: no failure history
    # What the status (queue.throttled, the RATE-LIMITED column) shows: the records held back now.
    (stats,) = await queue_stats.collect(redis, [StageKeys.for_stage("s")])
    assert stats.throttled > 0 and stats.as_status()["throttled"] == stats.throttled
    for worker in workers.workers:
        assert worker.alive and "circuit_opened" not in worker.event_names()


@pytest.mark.timeout(90)
async def test_a_users_own_limit_keeps_a_heavy_user_from_starving_the_light_users(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """One user floods 1,000 records; three light users send 2 records a second each. Per-user 10/s: the light users'
    records wait about nothing (measured from entry to commit), the heavy user gets its 10/s."""
    producer = Producer(redis, "s")
    await producer.send_many(Record(f"heavy-{i}", {}, "heavy") for i in range(1000))
    limits = json.dumps([{"rate": 10, "burst": 2, "scope": "user"}])
    workers.start("s", PROCESSOR=PROCESSOR, OUTPUT_QUEUE=OUT, CONCURRENCY="16", RATE_LIMITS=limits)
    await wait_until(lambda: redis.llen("calls-at:s"), "the first call", 30)
    started = time.time()
    for i in range(20):  # 10 s
        await producer.send_many(Record(f"light-{user}-{i}", {}, f"light-{user}") for user in range(3))
        await asyncio.sleep(0.5)
    await wait_until(lambda: _light_done(redis, 60), "every light record committed", 20)
    elapsed = time.time() - started
    forwarded = await stream_entries(redis, OUT)
    latency = {
        fields["record_id"]: int(entry_id.partition("-")[0]) - int(fields["entered_at"])
        for entry_id, fields in forwarded
    }
    light = sorted(ms for record, ms in latency.items() if record.startswith("light-"))
    heavy = sum(1 for record in latency if record.startswith("heavy-"))
    p95 = light[int(len(light) * 0.95) - 1]
    print(
        f"per-user 10/s, one user flooding: light users' latency median {statistics.median(light)} ms, p95 {p95} ms, "
        f"max {light[-1]} ms; heavy user {heavy} records in {elapsed:.1f} s"
    )
    assert p95 < 1000 and light[-1] < 2000
    assert heavy <= 10 * (elapsed + 2) + 2  # its own limit (2 of burst), not more
    assert heavy >= 10 * elapsed * 0.7  # and not starved itself
    assert await redis.xlen(DLQ) == 0


async def _light_done(redis: aioredis.Redis, count: int) -> bool:
    return sum(1 for fields in await outputs(redis) if fields["record_id"].startswith("light-")) >= count


@pytest.mark.timeout(90)
async def test_a_429_pauses_the_shared_limit_for_every_pod_and_fails_no_record(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """Two processes under a downstream's 20/s; the first call is answered 429 with Retry-After 2 s: neither process
    calls the downstream for those 2 s but for the records whose units were reserved before the pause reached Redis
    (at most HOLD_MS of the rate, all started within HOLD_MS), then both go on; the refused record is processed
    later, once, without a retry count."""
    await redis.set("answer-429:s", 1)
    await Producer(redis, "s").send_many(Record(f"r{i}", {"retry_after": 2}, "u") for i in range(40))
    limits = json.dumps([{"rate": 20, "burst": 1, "scope": "downstream", "downstream": "llm"}])
    for _ in range(2):
        workers.start("s", PROCESSOR=PROCESSOR, OUTPUT_QUEUE=OUT, CONCURRENCY="4", RATE_LIMITS=limits)
    await wait_until(lambda: idle(redis), "every record committed", 60)
    calls = await _call_times(redis)
    refused_at = calls[0]  # the first call saw the key
    during = [ms - refused_at for ms in calls if refused_at < ms < refused_at + 1900]
    print(f"a 429 with Retry-After 2 s: calls in the 1.9 s after it: {during} (ms after the 429)")
    reserved_before = 20 * HOLD_MS // 1000 + 1
    assert len(during) <= reserved_before and all(ms <= HOLD_MS + 100 for ms in during)
    assert len(calls) == 41 and len(await outputs(redis)) == 40  # the refused record once more, then committed
    assert await redis.xlen(DLQ) == 0


@pytest.mark.timeout(60)
async def test_reported_usage_counts_for_a_tokens_limit(redis: aioredis.Redis, redis_url: str) -> None:
    """A tokens limit of 200 a second (200 at once), each call reporting 100 tokens: about two calls a second."""
    await Producer(redis, "s").send_many(Record(f"r{i}", {"tokens": 100}, "u") for i in range(30))
    limit = RateLimit(rate=200, burst=200, scope="downstream", downstream="llm", cost="tokens")
    async with running_worker(redis_url, "s", LimitedCallProcessor, output_queue=OUT, rate_limits=[limit]):
        await wait_until(lambda: redis.llen("calls-at:s"), "the first call", 20)
        first = (await _call_times(redis))[0]
        await wait_until(lambda: _sleep_until(first / 1000 + 4), "4 s after the first call", 10)
        calls = [ms for ms in await _call_times(redis) if ms < first + 4000]
    print(f"a tokens limit of 200/s, 100 tokens a call: {len(calls)} calls in 4 s")
    assert 7 <= len(calls) <= 11  # 2 at once, then 2 a second; a call reported after the one in flight
    assert await redis.xlen(DLQ) == 0


async def _held_now(redis: aioredis.Redis) -> int:
    """What the stage's status shows in queue.throttled (the RATE-LIMITED column)."""
    (stats,) = await queue_stats.collect(redis, [StageKeys.for_stage("s")])
    return stats.throttled


@pytest.mark.timeout(60)
async def test_the_status_counts_the_records_held_back_now_not_a_failed_one(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """Under a limit of one record a minute, six records: the first fails (and waits 30 s to be retried), the five
    others are held back, due over the next minutes. The retry set holds six; the status counts the five."""
    await Producer(redis, "s").send_many(
        [Record("failing", {"action": "fail"}, "u"), *(Record(f"r{i}", {}, "u") for i in range(5))]
    )
    throttled_before = finished("throttled")
    limit = RateLimit(rate=1, per="minute", burst=1)
    async with running_worker(
        redis_url, output_queue=OUT, rate_limits=[limit], retry_base_seconds=30, retry_max_seconds=60
    ):
        await wait_until(lambda: _count(redis.zcard(RETRY), 6), "six records in the retry set", 20)
        assert await _held_now(redis) == 5
    assert finished("throttled") - throttled_before == 5  # the total, ever, is the workers' metric
    held = StageKeys.for_stage("s").held
    assert 4 * 60_000 < await redis.pttl(held) <= 5 * 60_000 + 2000  # goes with its last record's due time


@pytest.mark.timeout(60)
async def test_a_record_a_429_sent_back_is_counted_held_until_it_is_due(redis: aioredis.Redis, redis_url: str) -> None:
    """A provider's 429 with Retry-After 3 s: the status counts its record as held back, then, once it was retried
    and committed, no longer."""
    await redis.set("answer-429:s", 1)
    await Producer(redis, "s").send("r1", {"retry_after": 3}, user_id="u")
    limit = RateLimit(rate=100, scope="downstream", downstream="llm")
    async with running_worker(redis_url, "s", LimitedCallProcessor, output_queue=OUT, rate_limits=[limit]):
        await wait_until(lambda: _count(_held_now(redis), 1), "the refused record counted held back", 10)
        await wait_until(lambda: idle(redis), "the record committed", 20)
        assert await _held_now(redis) == 0
    assert len(await outputs(redis)) == 1 and await redis.xlen(DLQ) == 0


async def _count(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def test_a_limit_of_a_downstream_names_it_and_only_it_does() -> None:
    with pytest.raises(ValidationError, match="names its downstream"):
        RateLimit(rate=1, scope="downstream")
    with pytest.raises(ValidationError, match="names its downstream"):
        RateLimit(rate=1, downstream="llm")
    assert RateLimit(rate=90_000, per="minute", cost="tokens").capacity == 1500
    assert RateLimit(rate=0.5).capacity == 1 and RateLimit(rate=0.5).interval_ms == 2000


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("[{", "RATE_LIMITS"),
        ('[{"rate": 0}]', "RATE_LIMITS"),
        ('[{"rate": 5, "scope": "team"}]', "RATE_LIMITS"),
        ('[{"rate": 5, "scope": "downstream"}]', "names its downstream"),
    ],
)
def test_bad_rate_limits_stop_the_worker_with_one_line(monkeypatch: pytest.MonkeyPatch, value: str, named: str) -> None:
    monkeypatch.setenv("SERVICE_NAME", "s")
    monkeypatch.setenv("PROCESSOR", "tests.processors:ScriptedProcessor")
    monkeypatch.setenv("RATE_LIMITS", value)
    with pytest.raises(ConfigError, match=named) as refused:
        load_settings()
    assert "\n" not in str(refused.value)
