"""The worker's parts in-process, against the real Valkey: parsing, dead-letter fields, the settler, and each
branch of the dispatch (commit, retry, dead letter, duplicate, malformed) through the real Worker class run in the
test's event loop (tests/fixtures/inprocess.py). Process-level behaviour is in test_worker_errors and others."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis

from phoenix.record_format import DONE, FAILURE_FIELDS, SCRIPT_SAFE_FIELDS, packed_pairs
from phoenix.worker_runtime.dlq import dead_letter_fields
from phoenix.worker_runtime.messages import MalformedEntry, Message, parse_entry
from phoenix.worker_runtime.outcomes import Disposition, Outcome
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.settle import Settler
from tests.fixtures.inprocess import run_burst
from tests.fixtures.records import locked_records
from tests.fixtures.replies import add_entry, scored_members, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, RETRY, add, outputs

# --- parse_entry ---------------------------------------------------------------------------------------------


def test_parse_entry_reads_the_envelope_and_merges_data() -> None:
    raw = {
        b"record_id": b"r1",
        b"user_id": b"u",
        b"data": b'{"n": 1}',
        b"extra": b"x",
        b"retry_count": b"2",
        b"first_failed_at": b"1.5",
        b"original_id": b"1-0",
        b"traceparent": b"00-ab-cd-01",
    }
    message = parse_entry("5-0", raw, 1_000_000, 1000)
    assert isinstance(message, Message)
    assert (message.record_id, message.user_id, message.data) == ("r1", "u", {"extra": "x", "n": 1})
    assert (message.retry_count, message.first_failed_at, message.original_id) == (2, 1.5, "1-0")
    assert message.traceparent == "00-ab-cd-01" and message.enqueued_at_ms == 5 and message.raw is raw


@pytest.mark.parametrize(
    ("raw", "max_bytes", "reason"),
    [
        ({b"user_id": b"u"}, 1000, "missing record_id"),
        ({b"record_id": b"r", b"data": b"{"}, 1000, "data is not valid JSON: "),
        ({b"record_id": b"r", b"data": b"[1]"}, 1000, "data must be a JSON object, got list"),
        ({b"record_id": b"\xff"}, 1000, "entry is not valid UTF-8: invalid start byte at byte 0"),
        ({b"record_id": b"r", b"data": b'"' + b"x" * 100 + b'"'}, 50, "entry is 116 bytes, over MAX_MESSAGE_BYTES=50"),
        ({b"record_id": b"r", b"retry_count": b"two"}, 1000, "bad runtime field: "),
        # MAX_ENTRY_FIELDS=4 here: four fields of the entry's own plus the six a retry adds are let through.
        (
            {b"record_id": b"r", **{b"f%d" % i: b"" for i in range(10)}},
            1000,
            "entry has 11 fields, over MAX_ENTRY_FIELDS=4",
        ),
        ({b"record_id": b"r", b"entered_at": b"1.5e12"}, 1000, "entered_at must be milliseconds since the Unix epoch"),
        ({b"record_id": b"r", b"entered_at": b""}, 1000, "entered_at must be milliseconds since the Unix epoch"),
        ({b"record_id": b"r", b"deadline": b"-5"}, 1000, "deadline must be milliseconds since the Unix epoch"),
        ({b"record_id": b"r", b"deadline": b"17650000000000000"}, 1000, "deadline must be milliseconds since"),
        ({b"record_id": b"r", b"deadline": "\u0663".encode()}, 1000, "deadline must be milliseconds since"),
        ({b"record_id": b"r", b"packed_fields": b"[]"}, 1000, "entry carries the packed_fields of an entry too wide"),
    ],
)
def test_parse_entry_names_what_is_wrong(raw: dict[bytes, bytes], max_bytes: int, reason: str) -> None:
    parsed = parse_entry("1-0", raw, max_bytes, 4)
    assert isinstance(parsed, MalformedEntry) and parsed.raw is raw
    assert parsed.reason.startswith(reason)


# --- dead_letter_fields --------------------------------------------------------------------------------------


def test_dead_letter_fields_keep_the_original_and_replace_an_earlier_failure() -> None:
    raw = {b"record_id": b"r", b"data": b"\xff\xfe", b"error": b"old", b"attempts": b"9"}
    fields = dead_letter_fields(raw, "7-0", error="x" * 3000, error_type="ValueError", stage="s", attempts=2)
    as_dict = {k if isinstance(k, bytes) else k.encode(): v for k, v in zip(fields[::2], fields[1::2], strict=True)}
    assert as_dict[b"record_id"] == b"r" and as_dict[b"data"] == b"\xff\xfe"  # bytes kept as they came
    assert as_dict[b"error"] == "x" * 2000 and as_dict[b"error_type"] == "ValueError"
    assert (as_dict[b"stage"], as_dict[b"attempts"], as_dict[b"original_id"]) == ("s", "2", b"7-0")
    again = dead_letter_fields({**raw, b"original_id": b"1-0"}, "8-0", error="e", error_type="T", stage="s", attempts=1)
    assert again[again.index(b"original_id") + 1] == b"1-0"  # a replayed entry keeps its first id


def test_dead_letter_fields_pack_an_entry_too_wide_for_the_scripts() -> None:
    raw = {b"record_id": b"r", b"bad": b"\xff", **{b"f%d" % i: b"v" for i in range(SCRIPT_SAFE_FIELDS)}}
    fields = dead_letter_fields(raw, "7-0", error="wide", error_type="MalformedMessage", stage="s", attempts=1)
    as_dict = {k if isinstance(k, bytes) else k.encode(): v for k, v in zip(fields[::2], fields[1::2], strict=True)}
    assert set(as_dict) == {b"record_id", b"packed_fields", *(f.encode() for f in FAILURE_FIELDS)}
    unpacked = packed_pairs(as_dict[b"packed_fields"])
    assert len(unpacked) == len(raw) and unpacked["bad"].encode(errors="surrogateescape") == b"\xff"


# --- the settler ---------------------------------------------------------------------------------------------


async def test_settler_writes_each_action_in_one_batch(redis: aioredis.Redis, raw_redis: aioredis.Redis) -> None:
    settings = WorkerSettings(service_name="s", processor="tests.processors:ScriptedProcessor", output_queue=OUT)
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    ids = [await add_entry(redis, IN, {"record_id": name}) for name in ("c", "c", "d", "r", "l", "t", "m")]
    await redis.xreadgroup(KEYS.consumer_group, "me", {IN: ">"})
    settled: list[list[Outcome]] = []
    settler = Settler(raw_redis, settings, "me:token", settled.append)
    task = asyncio.create_task(settler.run())
    try:
        settler.submit(Outcome(Disposition.COMMIT, ids[0], "c", ("u", "{}", "17", ""), holds_lock=False))
        settler.submit(Outcome(Disposition.COMMIT, ids[1], "c", ("u", "{}", "17", ""), holds_lock=False))
        settler.submit(
            Outcome(Disposition.DEAD_LETTER, ids[2], "d", ("record_id", "d", "error", "why"), holds_lock=False)
        )
        settler.submit(
            Outcome(Disposition.RETRY, ids[3], "r", (60_000, json.dumps(["record_id", "r"])), holds_lock=False)
        )
        settler.submit(Outcome(Disposition.LEAVE, ids[4], "l", holds_lock=False))
        settler.submit(Outcome(Disposition.COMMIT, ids[5], "t", ("u", "[]", "17", "99", "00-trace"), holds_lock=False))
        settler.submit(Outcome(Disposition.COMMIT, ids[6], "m", holds_lock=False))  # marked done, nothing forwarded
        await asyncio.wait_for(settler.flush(), 10)
    finally:
        task.cancel()
    assert [[o.duplicate for o in batch] for batch in settled] == [[False, True, False, False, False, False, False]]
    assert await outputs(redis) == [  # the second commit of c was a duplicate
        {"record_id": "c", "user_id": "u", "data": "{}", "entered_at": "17"},  # no deadline: no field
        {
            "record_id": "t",
            "user_id": "u",
            "data": "[]",
            "entered_at": "17",
            "deadline": "99",
            "traceparent": "00-trace",
        },
    ]
    assert await redis.get(KEYS.record_prefix + "m") == DONE + ids[6]
    assert await redis.get(KEYS.record_prefix + "c") == DONE + ids[0]
    assert [fields for _, fields in await stream_entries(redis, DLQ)] == [{"record_id": "d", "error": "why"}]
    [(member, due_ms)] = await scored_members(redis, RETRY)
    assert packed_pairs(member) == {"record_id": "r"} and due_ms > time.time() * 1000 + 50_000
    pending = await redis.xpending_range(IN, KEYS.consumer_group, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [ids[4]]  # only the left entry is still pending


# --- the worker's dispatch, one branch at a time -----------------------------------------------------------


async def test_commit_forwards_the_result_and_sets_the_marker(redis: aioredis.Redis, redis_url: str) -> None:
    entry = await add(redis, "r1", "alice", n=1)
    await run_burst(redis_url, output_queue=OUT)
    [forwarded] = await outputs(redis)
    # entered_at: the entry's id time, as the first stage found none.
    entered_at = entry.partition("-")[0]
    assert forwarded == {"record_id": "r1", "user_id": "alice", "data": forwarded["data"], "entered_at": entered_at}
    assert json.loads(forwarded["data"]) == {"n": 1, "seen_by": "s"}
    assert await redis.get(KEYS.record_prefix + "r1") == DONE + entry
    assert await locked_records(redis, KEYS.name) == []


async def test_a_failure_is_scheduled_for_retry_with_its_error(redis: aioredis.Redis, redis_url: str) -> None:
    entry = await add(redis, "r1", action="fail")
    await run_burst(redis_url, output_queue=OUT, retry_base_seconds=60, retry_max_seconds=60)
    [(member, _)] = await scored_members(redis, RETRY)
    fields = packed_pairs(member)
    assert fields["record_id"] == "r1" and fields["retry_count"] == "1" and fields["original_id"] == entry
    assert fields["last_error"] == "RuntimeError: transient failure"
    assert await outputs(redis) == [] and await redis.xlen(DLQ) == 0


async def test_record_not_found_is_dead_lettered_at_once(redis: aioredis.Redis, redis_url: str) -> None:
    entry = await add(redis, "gone", "bob", action="missing")
    await run_burst(redis_url, output_queue=OUT)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["record_id"], dead["original_id"], dead["attempts"]) == ("gone", entry, "1")
    assert (dead["error_type"], dead["error"]) == ("RecordNotFoundError", "record gone does not exist")
    assert await redis.zcard(RETRY) == 0 and await outputs(redis) == []


async def test_a_permanent_error_is_dead_lettered_under_its_own_name(redis: aioredis.Redis, redis_url: str) -> None:
    await add(redis, "bad", action="invalid")
    await run_burst(redis_url, output_queue=OUT)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["error_type"], dead["error"]) == ("InvalidInputError", "record bad has no usable input")
    assert await redis.zcard(RETRY) == 0


async def test_a_duplicate_is_acknowledged_without_processing(redis: aioredis.Redis, redis_url: str) -> None:
    await redis.set(KEYS.record_prefix + "r1", DONE + "1-0", ex=60)
    await add(redis, "r1")
    await run_burst(redis_url, output_queue=OUT)
    assert await redis.get("calls:s") is None  # the processor never saw it
    assert await outputs(redis) == [] and await redis.xlen(DLQ) == 0
    # The claim refreshed the marker to IDEMPOTENCY_TTL; the settle acknowledged the entry.
    assert await redis.get(KEYS.record_prefix + "r1") == DONE + "1-0"
    assert await redis.ttl(KEYS.record_prefix + "r1") > 60
    assert (await redis.xpending(IN, KEYS.consumer_group))["pending"] == 0


async def test_a_malformed_entry_is_dead_lettered_with_the_reason(redis: aioredis.Redis, redis_url: str) -> None:
    await redis.xadd(IN, {"user_id": "u", "data": "{}"})
    await run_burst(redis_url, output_queue=OUT)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["error_type"], dead["error"], dead["user_id"]) == ("MalformedMessage", "missing record_id", "u")
    assert await redis.get("calls:s") is None


async def test_a_record_key_of_another_type_dead_letters_its_entry_alone(redis: aioredis.Redis, redis_url: str) -> None:
    """Something other than the runtime wrote the record's key (a hash where the lock goes): that entry cannot be
    locked, so it is dead-lettered with the reason, and the rest of its read is processed (the claim script failed
    the whole read on WRONGTYPE, and the intake read it again forever)."""
    await redis.hset(KEYS.record_prefix + "bad", "x", "1")
    entry = await add(redis, "bad")
    await add(redis, "good")
    await run_burst(redis_url, output_queue=OUT)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["record_id"], dead["original_id"], dead["error_type"]) == ("bad", entry, "RecordKeyConflict")
    assert dead["error"].startswith(f"its record key {KEYS.record_prefix}bad holds no lock or marker")
    assert [o["record_id"] for o in await outputs(redis)] == ["good"]
    assert await redis.type(KEYS.record_prefix + "bad") == "hash"  # not the runtime's to delete
