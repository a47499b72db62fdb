"""The original design's error table, row by row, against real worker processes and a real Valkey."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from tests.fixtures.eventually import wait_until
from tests.fixtures.records import committed, locked_records, record_key
from tests.fixtures.replies import get_existing, raw_stream_entries, scored_members, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, RETRY, add, idle, outputs
from tests.fixtures.workers import WorkerPool, WorkerProcess


async def test_success_forwards_result_with_ids_and_sets_marker(redis: aioredis.Redis, workers: WorkerPool) -> None:
    entry = await add(redis, "r1", "alice", n=1)
    await add(redis, "r2", action="none")
    workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: committed(redis, "s", "r2"), "r2 committed")
    await wait_until(lambda: idle(redis), "queue drained")
    out = await outputs(redis)
    # Compact JSON; the entry time the first stage took from the entry's id (it came without one).
    entered_at = entry.partition("-")[0]
    assert out == [{"record_id": "r1", "user_id": "alice", "data": '{"n":1,"seen_by":"s"}', "entered_at": entered_at}]
    assert await committed(redis, "s", "r1") == entry  # the marker names the entry that committed it
    assert 86000 < await redis.ttl(record_key("s", "r1")) <= 86400
    assert await locked_records(redis, "s") == []


async def test_record_not_found_goes_to_dlq_at_once(redis: aioredis.Redis, workers: WorkerPool) -> None:
    entry = await add(redis, "gone", "bob", action="missing")
    await add(redis, "ok")
    w = workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: redis.xlen(DLQ), "dead letter")
    await wait_until(lambda: idle(redis), "queue drained")
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["record_id"] == "gone" and dead["user_id"] == "bob"
    assert json.loads(dead["data"]) == {"action": "missing"}
    assert dead["error"] == "record gone does not exist"
    assert dead["error_type"] == "RecordNotFoundError"
    assert dead["stage"] == "s" and dead["attempts"] == "1" and dead["original_id"] == entry
    assert dead["failed_at"].endswith("+00:00")
    assert await redis.zcard(RETRY) == 0
    assert [o["record_id"] for o in await outputs(redis)] == ["ok"]
    assert await redis.hget("effects:s", "gone") is None
    assert "message_dead_lettered" in w.event_names()


async def test_transient_error_retries_with_backoff_until_it_succeeds(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await redis.set("dependency-down:s", 1)
    await add(redis, "r1")
    w = workers.start(
        "s",
        OUTPUT_QUEUE=OUT,
        RETRY_BASE_SECONDS="0.1",
        RETRY_MAX_SECONDS="0.4",
        CIRCUIT_FAILURE_THRESHOLD="1000",
        RETRY_WARN_AFTER="0.5",
    )
    await wait_until(lambda: redis.get("calls:s"), "first attempt")
    # A fifth call means four have failed: the fourth call's own check of the key may still be under way.
    await wait_until(lambda: _calls_at_least(redis, 5), "several attempts")
    # While it fails, the message lives in the retry set with its retry count, never in the DLQ.
    await redis.delete("dependency-down:s")
    await wait_until(lambda: committed(redis, "s", "r1"), "success after recovery")
    await wait_until(lambda: idle(redis), "queue drained")
    assert await redis.xlen(DLQ) == 0
    [out] = await outputs(redis)
    assert out["record_id"] == "r1"
    retries = [e for e in w.events() if e["event"] == "processing_failed_will_retry"]
    assert [e["retry_count"] for e in retries[:4]] == [1, 2, 3, 4]
    assert [e["retry_in_seconds"] for e in retries[:4]] == [0.1, 0.2, 0.4, 0.4]  # min(2^n x base, max)
    assert all(e["error"] == "dependency is down" and e["record_id"] == "r1" for e in retries)
    # Failing for longer than RETRY_WARN_AFTER (4 hours by default) is worth a warning of its own.
    long = [e for e in w.events() if e["event"] == "message_retrying_long"]
    assert long and long[0]["level"] == "warning" and long[0]["record_id"] == "r1"


async def _calls_at_least(redis: aioredis.Redis, n: int) -> bool:
    return int(await redis.get("calls:s") or 0) >= n


async def test_retry_waits_durably_in_redis_and_survives_a_restart(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await redis.set("dependency-down:s", 1)
    await add(redis, "r1", "carol", x=1)
    w = workers.start(
        "s", OUTPUT_QUEUE=OUT, RETRY_BASE_SECONDS="3", RETRY_MAX_SECONDS="10", CIRCUIT_FAILURE_THRESHOLD="1000"
    )
    await wait_until(lambda: redis.zcard(RETRY), "message scheduled for retry")
    w.kill()
    [(member, due_ms)] = await scored_members(redis, RETRY)
    fields = dict(zip(json.loads(member)[::2], json.loads(member)[1::2], strict=True))
    assert fields["record_id"] == "r1" and fields["user_id"] == "carol" and fields["retry_count"] == "1"
    seconds, micros = await redis.time()
    assert 2000 < due_ms - (seconds * 1000 + micros // 1000) <= 3000  # base delay, counted by Redis' clock
    assert (await redis.xpending(IN, "s-group"))["pending"] == 0  # acknowledged: the retry set holds it now
    await redis.delete("dependency-down:s")
    workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: committed(redis, "s", "r1"), "processed by the new worker", timeout=15)
    [out] = await outputs(redis)
    assert json.loads(out["data"]) == {"x": 1, "seen_by": "s"} and out["user_id"] == "carol"


async def test_malformed_entries_are_dead_lettered_with_the_reason(
    redis: aioredis.Redis, raw_redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await raw_redis.xadd(IN, {b"user_id": b"u"})
    await raw_redis.xadd(IN, {b"record_id": b"bad-json", b"data": b"{not json"})
    await raw_redis.xadd(IN, {b"record_id": b"list", b"data": b"[1, 2]"})
    await raw_redis.xadd(IN, {b"record_id": b"bytes", b"note": b"\xff\xfe"})
    await raw_redis.xadd(IN, {b"record_id": b"big", b"blob": b"x" * 5000})
    await raw_redis.xadd(IN, {b"record_id": b"fine", b"document_url": b"file:///x"})
    workers.start("s", OUTPUT_QUEUE=OUT, MAX_MESSAGE_BYTES="4096")
    await wait_until(lambda: committed(redis, "s", "fine"), "the good entry after the bad ones")
    await wait_until(lambda: idle(redis), "queue drained")
    dead = [fields for _, fields in await raw_stream_entries(raw_redis, DLQ)]
    reasons = [d[b"error"].decode() for d in dead]
    assert reasons[0] == "missing record_id"
    assert reasons[1].startswith("data is not valid JSON")
    assert reasons[2] == "data must be a JSON object, got list"
    assert reasons[3].startswith("entry is not valid UTF-8")
    assert reasons[4].startswith("entry is 5") and reasons[4].endswith("over MAX_MESSAGE_BYTES=4096")
    assert {d[b"error_type"] for d in dead} == {b"MalformedMessage"}
    assert dead[3][b"note"] == b"\xff\xfe"  # the original bytes are kept as they came
    [out] = await outputs(redis)
    assert json.loads(out["data"]) == {"document_url": "file:///x", "seen_by": "s"}  # flat fields join data


async def test_duplicate_record_is_processed_once(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await add(redis, "r1", n=1)
    await add(redis, "r1", n=2)
    workers.start("s", OUTPUT_QUEUE=OUT, CLAIM_IDLE_MS="300", CLAIM_INTERVAL="0.2")
    await wait_until(lambda: idle(redis), "queue drained")
    assert [o["record_id"] for o in await outputs(redis)] == ["r1"]
    assert await redis.hget("effects:s", "r1") == "1"


async def test_poison_message_goes_to_dlq_after_max_deliveries(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await add(redis, "poison")
    env = {"OUTPUT_QUEUE": OUT, "MAX_DELIVERIES": "3", "CONSUMER_NAME": "pod-a"}
    kills = 0
    while not await redis.xlen(DLQ):
        # Like a pod restarted in place: same consumer name, so it reads its own pending entries first.
        w = workers.start("s", processor="tests.processors:AlwaysCrashProcessor", **env)
        await wait_until(lambda w=w: _exited_or_dead_lettered(w, redis), "a crash or the dead letter")
        kills += not w.alive
        assert kills <= 3, "the poison message was delivered more than MAX_DELIVERIES times"
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == "PoisonMessage"
    assert dead["error"] == "delivered 4 times without finishing (MAX_DELIVERIES=3)"
    assert dead["attempts"] == "4" and dead["record_id"] == "poison"
    assert int(await get_existing(redis, "calls:s")) == kills >= 1
    await wait_until(lambda: idle(redis), "queue drained")
    assert w.alive  # the worker that dead-lettered it is unharmed


async def _exited_or_dead_lettered(w: WorkerProcess, redis: aioredis.Redis) -> bool:
    return await w.exited() or bool(await redis.xlen(DLQ))


@pytest.mark.timeout(60)
async def test_bad_configuration_stops_with_one_readable_line(redis_url: str, workers: WorkerPool) -> None:
    w = workers.start("s", CONCURRENCY="lots", REDIS_URL="redis://:hunter2@127.0.0.1:1/0")
    assert w.process.popen.wait(timeout=30) == 2
    output = w.process.log_path.read_text().strip().splitlines()
    assert output == [
        "phoenix worker: invalid configuration: CONCURRENCY: Input should be a valid integer, "
        "unable to parse string as an integer (got 'lots')"
    ]
    w2 = workers.start("s", PROCESSOR="no.such.module:Thing")
    assert w2.process.popen.wait(timeout=30) == 2
    assert "cannot import 'no.such.module:Thing'" in w2.process.log_path.read_text()
    w3 = workers.start("s", REDIS_URL="redis://:hunter2@127.0.0.1:1/0", LOCK_TIMEOUT="-1")
    assert w3.process.popen.wait(timeout=30) == 2
    assert "LOCK_TIMEOUT" in w3.process.log_path.read_text()
    assert "hunter2" not in w3.process.log_path.read_text()
    w4 = workers.start("s", REDIS_URL="redis://:hunter2@127.0.0.1:1/0", RETRY_MAX_SECONDS="1", RETRY_BASE_SECONDS="5")
    assert w4.process.popen.wait(timeout=30) == 2
    assert w4.process.log_path.read_text() == (
        "phoenix worker: invalid configuration: RETRY_MAX_SECONDS must be at least RETRY_BASE_SECONDS\n"
    )


@pytest.mark.timeout(60)
async def test_a_setting_in_two_letter_cases_stops_the_worker_naming_both_never_their_values(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    """`redis_url` from a ConfigMap of spec.pod.envFrom beside the operator's REDIS_URL: which one the settings
    would take follows the environment's order, which the kubelet does not fix. The worker takes neither."""
    elsewhere = "redis://:hunter2@elsewhere.example:6379/0"
    w = workers.start(
        "s",
        redis_url=elsewhere,
        consumer_name="pod-b",
        CONSUMER_NAME="pod-a",
        input_queue="phoenix:{other}:s:input",
    )
    assert w.process.popen.wait(timeout=30) == 2
    assert w.process.log_path.read_text() == (
        "phoenix worker: invalid configuration: "
        "CONSUMER_NAME is set in several letter cases (CONSUMER_NAME, consumer_name); "
        "REDIS_URL is set in several letter cases (REDIS_URL, redis_url): "
        "the worker reads its variables case-insensitively and could take either value; keep one spelling\n"
    )
    # One spelling alone, in any letter case, is read as before.
    alone = workers.start("s", consumer_name="pod-a", OUTPUT_QUEUE=OUT)
    await add(redis, "r1")
    await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed")
    assert [c["name"] for c in await redis.xinfo_consumers(IN, KEYS.consumer_group)] == ["pod-a"]
    assert alone.alive
