"""Deadlines (issue 34): a record carries when it entered the pipeline and may carry a deadline; past it, or past
MAX_RECORD_AGE, it goes to the DLQ as Expired before its processor runs and before its user's key is fetched,
retries included. Real Valkey, the real Worker (in-process and as `phoenix worker`), the billing double over HTTP."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from phoenix.producer import Producer, Record
from phoenix.worker_runtime.circuit_breaker import CircuitBreaker
from phoenix.worker_runtime.messages import Message, parse_entry
from phoenix.worker_runtime.outcomes import EXPIRED, Disposition, RecordPolicy
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.cli import run_phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.fuzzing import fuzz_settings
from tests.fixtures.inprocess import run_burst, running_worker
from tests.fixtures.key_service import KeyService, running_key_service
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, OUT, idle, outputs
from tests.fixtures.workers import WorkerPool


def _now_ms() -> int:
    return round(time.time() * 1000)


async def _calls(redis: aioredis.Redis) -> int:
    return int(await redis.get("calls:s") or 0)


async def _dead(redis: aioredis.Redis) -> dict[str, dict[str, str]]:
    return {fields["record_id"]: fields for _, fields in await stream_entries(redis, DLQ)}


async def test_records_past_their_deadline_are_dead_lettered_unprocessed_and_the_others_flow(
    redis: aioredis.Redis, redis_url: str
) -> None:
    producer = Producer(redis, "s")
    past, future = time.time() - 1, time.time() + 600
    await producer.send_many(
        [
            Record("late", {"n": 1}, "u1", deadline=past),
            Record("in-time", {"n": 2}, "u1", deadline=future),
            Record("no-deadline", {"n": 3}, "u1"),
            Record("too-old", {"n": 4}, "u1", entered_at=time.time() - 120),  # MAX_RECORD_AGE=60
        ]
    )
    await run_burst(redis_url, output_queue=OUT, max_record_age=60)
    assert await _calls(redis) == 2  # the processor saw only the two within their time
    forwarded = {fields["record_id"]: fields for fields in await outputs(redis)}
    assert set(forwarded) == {"in-time", "no-deadline"}
    # The entry time and the deadline travel on with the record, unchanged, to the next stage.
    assert forwarded["in-time"]["deadline"] == str(round(future * 1000))
    assert "deadline" not in forwarded["no-deadline"]
    dead = await _dead(redis)
    assert {record: fields["error_type"] for record, fields in dead.items()} == {"late": EXPIRED, "too-old": EXPIRED}
    assert "past its deadline" in dead["late"]["error"] and dead["late"]["error"].endswith(": not processed")
    assert "over MAX_RECORD_AGE=60s" in dead["too-old"]["error"]
    assert dead["late"]["data"] == '{"n": 1}' and dead["late"]["attempts"] == "0"  # the record kept whole
    assert await idle(redis)


async def test_malformed_time_fields_are_malformed_entries_and_the_worker_goes_on(
    redis: aioredis.Redis, redis_url: str
) -> None:
    await add_entry(redis, IN, {"record_id": "bad-deadline", "data": "{}", "deadline": "tomorrow"})
    await add_entry(redis, IN, {"record_id": "bad-entry", "data": "{}", "entered_at": "1.7e12"})
    await add_entry(redis, IN, {"record_id": "ok", "data": "{}"})
    await run_burst(redis_url, output_queue=OUT, max_record_age=60)
    dead = await _dead(redis)
    assert {record: fields["error_type"] for record, fields in dead.items()} == {
        "bad-deadline": "MalformedMessage",
        "bad-entry": "MalformedMessage",
    }
    assert (
        dead["bad-deadline"]["error"]
        == "deadline must be milliseconds since the Unix epoch (decimal digits), got 'tomorrow'"
    )
    assert [fields["record_id"] for fields in await outputs(redis)] == ["ok"]


@pytest.mark.timeout(60)
async def test_retries_count_against_the_deadline(redis: aioredis.Redis, redis_url: str) -> None:
    """A failing record is retried while its next attempt still comes before its deadline; the retry that would come
    after it is dead-lettered at once (Expired, with its failure history), not kept waiting in the retry set."""
    await Producer(redis, "s").send("failing", {"action": "fail"}, deadline=time.time() + 1.5)
    started = time.monotonic()
    async with running_worker(redis_url, output_queue=OUT):  # retries after 0.2, 0.4, 0.8 s (FAST), at most 1 s
        await wait_until(lambda: redis.xlen(DLQ), "dead-lettered", timeout=20)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == EXPIRED and dead["retry_count"] == dead["attempts"]
    assert "its next attempt would be past its deadline" in dead["error"] and "RuntimeError" in dead["error"]
    calls = await _calls(redis)
    assert 2 <= calls <= 4 and time.monotonic() - started < 10


@pytest.mark.timeout(60)
async def test_a_retry_that_expires_while_it_waits_is_dead_lettered_not_processed(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """The record fails once with its deadline still ahead; no worker runs until the deadline has passed. The next
    worker promotes the retry and dead-letters it without calling the processor."""
    deadline = time.time() + 2.5
    await Producer(redis, "s").send("failing", {"action": "fail"}, deadline=deadline)
    async with running_worker(redis_url, output_queue=OUT, retry_base_seconds=1.0) as worker:
        await wait_until(lambda: redis.zcard(worker.settings.retry_queue), "the first failure waits to be retried")
    assert await _calls(redis) == 1
    await wait_until(lambda: _past(deadline), "the deadline passed", timeout=10)
    async with running_worker(redis_url, output_queue=OUT):
        await wait_until(lambda: redis.xlen(DLQ), "dead-lettered", timeout=20)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == EXPIRED and dead["retry_count"] == "1" and dead["error"].endswith("not processed")
    assert await _calls(redis) == 1  # never called again


async def _past(when: float) -> bool:
    return time.time() > when


@pytest.fixture
async def key_service() -> AsyncIterator[KeyService]:
    async with running_key_service() as service:
        yield service


@pytest.mark.timeout(60)
async def test_expired_records_fetch_no_key_from_the_billing_service(
    redis: aioredis.Redis, workers: WorkerPool, key_service: KeyService
) -> None:
    """A real `phoenix worker` with per-user billing: the users whose records expired never get a key fetched; the
    records within their time are processed on their users' keys."""
    now = time.time()
    await Producer(redis, "s").send_many(
        [
            *(Record(f"late-{i}", {}, f"late-user-{i}", deadline=now - 5) for i in range(5)),
            Record("old", {}, "old-user", entered_at=now - 3600),  # MAX_RECORD_AGE=60 below
            *(Record(f"fresh-{i}", {}, f"fresh-user-{i}", deadline=now + 600) for i in range(3)),
            Record("plain", {}, "plain-user"),
        ]
    )
    workers.start(
        "s",
        BILLING_URL=key_service.url,
        BILLING_MASTER_KEY=key_service.master_key,
        OUTPUT_QUEUE=OUT,
        MAX_RECORD_AGE="60",
        PROCESSOR="tests.processors:KeyReportingProcessor",
    )
    await wait_until(lambda: idle(redis), "every record settled")
    fetched_for = sorted(body["user_id"] for body in key_service.requests)
    assert fetched_for == ["fresh-user-0", "fresh-user-1", "fresh-user-2", "plain-user"]
    dead = await _dead(redis)
    assert sorted(dead) == ["late-0", "late-1", "late-2", "late-3", "late-4", "old"]
    assert {fields["error_type"] for fields in dead.values()} == {EXPIRED}
    assert not await redis.exists(*(f"seen-key:{record}" for record in dead))
    assert sorted(fields["record_id"] for fields in await outputs(redis)) == [
        "fresh-0",
        "fresh-1",
        "fresh-2",
        "plain",
    ]


@pytest.mark.subprocess
async def test_enqueue_takes_a_deadline_as_a_duration_or_a_time(redis: aioredis.Redis, redis_url: str) -> None:
    before = _now_ms()
    done = run_phoenix(redis_url, "enqueue", "--service", "s", "--record-id", "r1", "--deadline", "30m")
    assert done.returncode == 0, done.stderr
    done = run_phoenix(
        redis_url, "enqueue", "--service", "s", "--record-id", "r2", "--deadline", "2031-01-01T00:00:00+00:00"
    )
    assert done.returncode == 0, done.stderr
    (_, first), (_, second) = await stream_entries(redis, IN)
    assert before + 1_800_000 <= int(first["deadline"]) <= _now_ms() + 1_800_000
    assert second["deadline"] == "1924992000000"
    assert before <= int(first["entered_at"]) <= _now_ms()
    for bad, why in (("soon", "neither a duration"), ("2031-01-01T00:00:00", "needs a time zone")):
        refused = run_phoenix(redis_url, "enqueue", "--service", "s", "--record-id", "r3", "--deadline", bad)
        assert refused.returncode == 2 and why in refused.stderr
    assert await redis.xlen(IN) == 2


def test_a_producer_refuses_a_deadline_that_is_no_time() -> None:
    from datetime import datetime

    with pytest.raises(ValueError, match="needs a time zone"):
        Record("r", deadline=datetime(2031, 1, 1)).fields()
    with pytest.raises(ValueError, match="seconds since the Unix epoch"):
        Record("r", deadline=float("nan")).fields()
    assert Record("r", deadline=1_924_992_000, entered_at=1_700_000_000.25).fields()["deadline"] == "1924992000000"


def _policy(max_record_age: float) -> RecordPolicy:
    settings = WorkerSettings(
        service_name="s", processor="tests.processors:ScriptedProcessor", max_record_age=max_record_age
    )
    return RecordPolicy(settings, CircuitBreaker(5, 60, 1))


def _message(entered_at_ms: int, deadline_ms: int | None) -> Message:
    raw = {b"record_id": b"r", b"entered_at": b"%d" % entered_at_ms}
    if deadline_ms is not None:
        raw[b"deadline"] = b"%d" % deadline_ms
    parsed = parse_entry("1700000000000-0", raw, 1_000_000, 1000)
    assert isinstance(parsed, Message)
    return parsed


_MS = st.integers(0, 10**12)


@pytest.mark.fuzz
@fuzz_settings(300)
@given(entered=_MS, deadline=st.none() | _MS, age_s=st.integers(0, 10**6), now=_MS)
def test_a_record_expires_exactly_at_the_earlier_of_its_deadline_and_its_maximum_age(
    entered: int, deadline: int | None, age_s: int, now: int
) -> None:
    limits = [deadline] if deadline is not None else []
    if age_s:
        limits.append(entered + age_s * 1000)
    outcome = _policy(age_s).expired(_message(entered, deadline), now)
    if limits and now >= min(limits):
        assert outcome is not None and outcome.disposition is Disposition.DEAD_LETTER and outcome.holds_lock
        assert dict(zip(outcome.fields[::2], outcome.fields[1::2], strict=True))[b"error_type"] == EXPIRED
    else:
        assert outcome is None
