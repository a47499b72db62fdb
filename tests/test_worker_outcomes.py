"""Every outcome settles (issue 18): what user code does wrong, against the real Worker, real `phoenix worker`
processes and a real Valkey. A result JSON cannot hold, a BaseException, a swallowed cancellation, a thread stuck past
its timeout: each record ends committed, retried or dead-lettered, and the good records around it keep flowing.
Then the retry limits: MAX_ATTEMPTS, MAX_RETRY_AGE, and an exception's own `max_attempts`."""

from __future__ import annotations

import json
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from phoenix.worker_runtime import scrub
from phoenix.worker_runtime.blocking import BLOCKING_THREADS
from phoenix.worker_runtime.worker import Worker
from tests.fixtures.eventually import wait_until
from tests.fixtures.health import probe
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.records import committed, locked_records
from tests.fixtures.replies import stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, RETRY, add, idle, outputs
from tests.fixtures.workers import WorkerPool
from tests.processors import RELEASE_STUCK_THREADS, MisbehavingBatchProcessor, MisbehavingProcessor

MISBEHAVING = "tests.processors:MisbehavingProcessor"


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"stage": "s", **labels}) or 0.0


async def _dead_letters(redis: aioredis.Redis) -> dict[str, dict[str, str]]:
    return {fields["record_id"]: fields for _, fields in await stream_entries(redis, DLQ)}


@pytest.fixture
def release_stuck_threads() -> Iterator[None]:
    RELEASE_STUCK_THREADS.clear()
    yield
    RELEASE_STUCK_THREADS.set()  # whatever a test left stuck ends now


@pytest.mark.usefixtures("release_stuck_threads")
async def test_forty_good_records_flow_and_every_bad_one_settles(redis: aioredis.Redis, redis_url: str) -> None:
    bad = {
        "tuple-key": "tuple-key",
        "self-reference": "self-reference",
        "base-error": "base-error",
        "cancelled": "cancelled",
        "swallow": "swallow-cancel:1.5",
        "stuck": "stuck-thread:4",
    }
    good = [f"good-{i}" for i in range(40)]
    for i, record_id in enumerate(good):
        await add(redis, record_id, n=i)
        if i % 7 == 3 and bad:  # the bad ones among the good
            record, misbehave = bad.popitem()
            await add(redis, record, misbehave=misbehave)
    duplicates = _sample("phoenix_messages_total", outcome="skipped_duplicate")
    settings: dict[str, Any] = {
        "output_queue": OUT,
        "concurrency": 8,
        "processing_timeout": 1,
        "timeout_grace": 1,
        # Retries wait long enough that the swallower's late result (2.5 s after its start) comes first.
        "retry_base_seconds": 2.5,
        "retry_max_seconds": 2.5,
    }
    async with running_worker(redis_url, processor=MisbehavingProcessor, **settings) as worker:
        # The stuck thread held neither its record nor its slot: the good records went on meanwhile.
        await wait_until(lambda: _forwarded(redis, 40), "the 40 good records forwarded", 15)
        await wait_until(lambda: redis.exists("late:s:swallow"), "the swallower's late return", 15)
        await wait_until(lambda: _forwarded(redis, 44), "every retried record committed", 20)
        await wait_until(lambda: _settled(worker, redis), "nothing pending, in flight or waiting", 15)
        await wait_until(lambda: _leaked(0), "the stuck thread ended", 15)
        assert worker.alive() == (True, "ok")
    forwarded = Counter(o["record_id"] for o in await outputs(redis))
    assert forwarded == Counter([*good, "base-error", "cancelled", "swallow", "stuck"])  # each once
    assert not any(json.loads(o["data"]).get("late") for o in await outputs(redis))
    # The late result was dropped before the settler, not committed as a duplicate.
    assert _sample("phoenix_messages_total", outcome="skipped_duplicate") == duplicates
    dead = await _dead_letters(redis)
    assert sorted(dead) == ["self-reference", "tuple-key"]
    assert {d["error_type"] for d in dead.values()} == {"UnserializableResult"}
    assert dead["tuple-key"]["error"] == (
        "the result cannot be written as JSON: TypeError: keys must be str, int, float, bool or None, not tuple"
    )
    assert dead["self-reference"]["error"].endswith("ValueError: Circular reference detected")
    assert await locked_records(redis, KEYS.name) == []


async def test_what_a_processor_returns_or_raises_cannot_end_its_worker(redis: aioredis.Redis, redis_url: str) -> None:
    """Found by the processor fuzzer (tests/test_fuzz_processors.py): a result holding a value whose str() raised
    KeyboardInterrupt ended the worker's event loop; an exception whose `max_attempts` property raised left its
    record in flight for good."""
    for misbehave in ("interrupting-result", "interrupting-error", "limit-untold"):
        await add(redis, misbehave, misbehave=misbehave)
    async with running_worker(
        redis_url, processor=MisbehavingProcessor, output_queue=OUT, max_attempts=2, concurrency=4
    ) as worker:
        await wait_until(lambda: _settled(worker, redis), "every record settled")
        assert worker.alive() == (True, "ok")
    dead = await _dead_letters(redis)
    assert (dead["interrupting-result"]["error_type"], dead["interrupting-result"]["error"]) == (
        "UnserializableResult",
        "the result cannot be written as JSON: KeyboardInterrupt: KeyboardInterrupt",
    )
    assert dead["interrupting-error"]["error_type"] == "RetriesExhausted"
    assert dead["interrupting-error"]["error"].endswith("; last error: InterruptingError: InterruptingError")
    assert dead["limit-untold"]["error_type"] == "RetriesExhausted"
    assert dead["limit-untold"]["error"].endswith("reached MAX_ATTEMPTS=2; last error: LimitUntold: limited")
    assert await outputs(redis) == []


async def _leaked(n: int) -> bool:
    return BLOCKING_THREADS.leaked == n and _sample("phoenix_leaked_threads") == n


async def _forwarded(redis: aioredis.Redis, n: int) -> bool:
    return len(await outputs(redis)) >= n


async def _settled(worker: Worker, redis: aioredis.Redis) -> bool:
    return await drained(worker) and await redis.zcard(RETRY) == 0


async def test_the_batch_path_settles_every_record_too(redis: aioredis.Redis, redis_url: str) -> None:
    for i in range(10):
        await add(redis, f"ok-{i}")
    await add(redis, "tuple-key", misbehave="tuple-key")
    await add(redis, "base-error", misbehave="base-error")
    async with running_worker(redis_url, processor=MisbehavingBatchProcessor, output_queue=OUT, concurrency=16) as w:
        await wait_until(lambda: _settled(w, redis), "every record settled", 15)
    assert sorted(o["record_id"] for o in await outputs(redis)) == sorted(
        [*(f"ok-{i}" for i in range(10)), "base-error"]
    )
    dead = await _dead_letters(redis)
    assert list(dead) == ["tuple-key"] and dead["tuple-key"]["error_type"] == "UnserializableResult"
    assert await redis.llen("batches:s") >= 1


async def test_exception_text_that_cannot_be_stored_or_printed_still_settles(
    redis: aioredis.Redis, redis_url: str
) -> None:
    await add(redis, "surrogate", misbehave="surrogate")
    await add(redis, "unprintable", misbehave="unprintable")
    await add(redis, "fine")
    async with running_worker(redis_url, processor=MisbehavingProcessor, output_queue=OUT) as worker:
        await wait_until(lambda: _forwarded(redis, 2), "the fine and the unprintable records forwarded", 15)
        await wait_until(lambda: _settled(worker, redis), "every record settled", 15)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["record_id"], dead["error"]) == ("surrogate", "undecodable byte \\udcff in the input")
    assert sorted(o["record_id"] for o in await outputs(redis)) == ["fine", "unprintable"]


async def test_system_exit_and_keyboard_interrupt_fail_the_record_not_the_worker(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await add(redis, "exit", misbehave="system-exit")
    await add(redis, "interrupt", misbehave="keyboard-interrupt")
    await add(redis, "fine")
    w = workers.start("s", processor=MISBEHAVING, OUTPUT_QUEUE=OUT)
    await wait_until(lambda: _forwarded(redis, 3), "every record forwarded, the two after a retry", 20)
    await wait_until(lambda: idle(redis), "queue drained")
    assert w.alive
    retried = {e["record_id"]: e for e in w.events() if e["event"] == "processing_failed_will_retry"}
    assert retried["exit"]["error_type"] == "SystemExit" and retried["exit"]["error"] == "3"
    assert retried["interrupt"]["error_type"] == "KeyboardInterrupt"
    assert await redis.xlen(DLQ) == 0


@pytest.mark.timeout(60)
async def test_a_stuck_thread_fails_healthz_and_does_not_hold_up_the_exit(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    port = free_loopback_port()
    await add(redis, "stuck", misbehave="stuck-thread:120")
    w = workers.start(
        "s",
        processor=MISBEHAVING,
        OUTPUT_QUEUE=OUT,
        HEALTH_PORT=str(port),
        PROCESSING_TIMEOUT="1",
        MAX_LEAKED_THREADS="1",
    )
    async with aiohttp.ClientSession() as http:

        async def unhealthy() -> tuple[int, str] | None:
            answer = await probe(http, port)
            return answer if answer and answer[0] == 503 else None

        assert await wait_until(unhealthy, "/healthz to ask for a restart", 20) == (
            503,
            "1 run_blocking threads outlived their calls (MAX_LEAKED_THREADS=1)\n",
        )
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            assert 'phoenix_leaked_threads{stage="s"} 1.0' in await response.text()
    # The record did not wait for the thread: retried, and committed by its second attempt.
    await wait_until(lambda: committed(redis, "s", "stuck"), "the record committed on its retry", 15)
    [leak] = [e for e in w.events() if e["event"] == "blocking_thread_leaked"]
    assert leak["record_id"] == "stuck" and leak["function"] == "_stuck" and leak["level"] == "error"
    # The thread would keep the interpreter from exiting for two minutes: the worker leaves without it.
    started = time.monotonic()
    assert w.terminate(timeout=30) == 0
    assert time.monotonic() - started < 15
    assert "exit_abandons_threads" in w.event_names()


# --- retry limits ---------------------------------------------------------------------------------------------


async def test_max_attempts_dead_letters_the_record_with_its_history(redis: aioredis.Redis, redis_url: str) -> None:
    entry = await add(redis, "r1", action="fail")
    before = time.time()
    async with running_worker(redis_url, output_queue=OUT, max_attempts=3, circuit_failure_threshold=100):
        await wait_until(lambda: redis.xlen(DLQ), "the dead letter", 15)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == "RetriesExhausted" and dead["attempts"] == "3" and dead["retry_count"] == "3"
    assert dead["error"].startswith("3 attempts in ")
    assert dead["error"].endswith("s reached MAX_ATTEMPTS=3; last error: RuntimeError: transient failure")
    assert dead["last_error"] == "RuntimeError: transient failure"
    assert before <= float(dead["first_failed_at"]) <= time.time() and dead["original_id"] == entry
    assert await redis.get("calls:s") == "3"  # three attempts, over three stream entries
    assert await redis.zcard(RETRY) == 0 and (await redis.xpending(IN, KEYS.consumer_group))["pending"] == 0


async def test_max_retry_age_dead_letters_a_record_failing_for_too_long(redis: aioredis.Redis, redis_url: str) -> None:
    await add(redis, "r1", action="fail")
    settings: dict[str, Any] = {"max_retry_age": 1, "retry_base_seconds": 0.3, "retry_max_seconds": 0.3}
    async with running_worker(redis_url, output_queue=OUT, circuit_failure_threshold=100, **settings):
        await wait_until(lambda: redis.xlen(DLQ), "the dead letter", 15)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == "RetriesExhausted"
    assert "reached MAX_RETRY_AGE=1s; last error: RuntimeError: transient failure" in dead["error"]
    attempts = int(dead["attempts"])
    assert 2 <= attempts <= 6 and await redis.get("calls:s") == str(attempts)
    assert time.time() - float(dead["first_failed_at"]) >= 1


async def test_a_dead_letter_past_the_limits_keeps_its_history_without_secrets(
    redis: aioredis.Redis, redis_url: str
) -> None:
    secret = f"pw-{secrets.token_hex(8)}"
    scrub.register(secret)
    await add(redis, "r1", misbehave=f"quote:{secret}")
    async with running_worker(redis_url, processor=MisbehavingProcessor, output_queue=OUT, max_attempts=2):
        await wait_until(lambda: redis.xlen(DLQ), "the dead letter", 15)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == "RetriesExhausted" and dead["last_error"] == "ConnectionError: cannot connect with ***"
    assert dead["error"].endswith("; last error: ConnectionError: cannot connect with ***")  # data keeps its own


async def test_without_limits_a_failure_is_retried_on(redis: aioredis.Redis, redis_url: str) -> None:
    await add(redis, "r1", action="fail")
    async with running_worker(redis_url, output_queue=OUT, circuit_failure_threshold=100, retry_max_seconds=0.2):
        await wait_until(lambda: _calls_at_least(redis, 6), "six attempts", 15)
    assert await redis.xlen(DLQ) == 0


async def _calls_at_least(redis: aioredis.Redis, n: int) -> bool:
    return int(await redis.get("calls:s") or 0) >= n


async def test_a_call_that_ignores_the_shutdown_leaves_its_entry_pending_and_unlocked(
    redis: aioredis.Redis, redis_url: str
) -> None:
    await add(redis, "swallow", misbehave="swallow-cancel:3")
    settings: dict[str, Any] = {"output_queue": OUT, "shutdown_grace": 0.2, "timeout_grace": 0.5}
    async with running_worker(redis_url, processor=MisbehavingProcessor, **settings) as worker:
        await wait_until(lambda: redis.exists("misbehaved:s:swallow"), "the call started")
    # Stopped while the call ran and ignored its cancellation: given up, the entry left for the next worker.
    assert worker.in_flight == {}
    assert (await redis.xpending(IN, KEYS.consumer_group))["pending"] == 1
    assert await locked_records(redis, KEYS.name) == []
    await wait_until(lambda: redis.exists("late:s:swallow"), "the late return (the call ends within the test)", 10)
