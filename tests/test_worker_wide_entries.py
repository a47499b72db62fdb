"""Wide entries (thousands of fields) and a settle that keeps failing for one item: neither may stop a stage.

Lua 5.1 unpacks at most about 8,000 values, and every script that writes an entry unpacks its fields. These run
the real worker, settler, scripts and repair tools against the real Valkey.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis.asyncio as aioredis

from phoenix.record_format import PACKED_FIELDS, SCRIPT_SAFE_FIELDS, packed_pairs
from phoenix.tools import dlq, repair
from phoenix.worker_runtime.outcomes import Disposition, Outcome
from phoenix.worker_runtime.retry import RetryScheduler
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.settle import Settler
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, RETRY, add, outputs

WIDE = 9_000  # fields: 18,000 values, more than twice what Lua can unpack


def _wide_fields(record_id: str, n: int = WIDE) -> dict[str, str]:
    return {"record_id": record_id, "data": json.dumps({"action": "invalid"}), **{f"f{i}": "v" for i in range(n)}}


def _settings(**extra: Any) -> WorkerSettings:
    return WorkerSettings(service_name="s", processor="tests.processors:ScriptedProcessor", **extra)


def _commit(entry_id: str, record_id: str) -> Outcome:
    return Outcome(Disposition.COMMIT, entry_id, record_id, ("u", "{}", "17", ""), holds_lock=False)


async def _settled(raw_redis: aioredis.Redis, outcomes: list[Outcome]) -> list[Outcome]:
    """The outcomes submitted at once to a settler forwarding to OUT: what it settled, once all are written."""
    settled: list[Outcome] = []
    settler = Settler(raw_redis, _settings(output_queue=OUT), "me:token", settled.extend)
    task = asyncio.create_task(settler.run())
    try:
        for outcome in outcomes:
            settler.submit(outcome)
        await asyncio.wait_for(settler.flush(), 10)
    finally:
        task.cancel()
    return settled


async def test_a_wide_entry_is_dead_lettered_and_the_records_behind_it_flow(
    redis: aioredis.Redis, redis_url: str
) -> None:
    wide_id = await add_entry(redis, IN, _wide_fields("wide"))
    for i in range(40):
        await add(redis, f"ok{i}")
    async with running_worker(redis_url, output_queue=OUT, concurrency=8) as worker:
        await wait_until(lambda: drained(worker), "input drained", 20)
    assert sorted(o["record_id"] for o in await outputs(redis)) == sorted(f"ok{i}" for i in range(40))
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error"] == f"entry has {WIDE + 2} fields, over MAX_ENTRY_FIELDS=1000"
    assert dead["error_type"] == "MalformedMessage" and dead["original_id"] == wide_id
    # Too wide for any script to write field by field: kept whole, as one JSON field, beside its record_id.
    assert dead["record_id"] == "wide"
    assert packed_pairs(dead[PACKED_FIELDS]) == _wide_fields("wide")
    assert (await redis.xpending(IN, KEYS.consumer_group))["pending"] == 0


async def test_an_entry_at_the_script_limit_is_dead_lettered_field_by_field(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """Within MAX_ENTRY_FIELDS (raised to its maximum), a permanent failure's DLQ write keeps every field."""
    fields = _wide_fields("wide-ish", SCRIPT_SAFE_FIELDS - 2)
    await add_entry(redis, IN, fields)
    await add(redis, "ok")
    async with running_worker(redis_url, output_queue=OUT, max_entry_fields=SCRIPT_SAFE_FIELDS) as worker:
        await wait_until(lambda: drained(worker), "input drained", 20)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == "InvalidInputError" and PACKED_FIELDS not in dead
    assert {k: dead[k] for k in fields} == fields
    assert [o["record_id"] for o in await outputs(redis)] == ["ok"]


async def test_a_dead_letter_too_wide_for_the_script_is_written_minimal_and_the_rest_settles(
    redis: aioredis.Redis, raw_redis: aioredis.Redis
) -> None:
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    ids = [await add_entry(redis, IN, {"record_id": f"r{i}"}) for i in range(6)]
    await redis.xreadgroup(KEYS.consumer_group, "me", {IN: ">"})
    # A dead letter whose fields no script can unpack: on main the whole batch's script call fails on it, forever.
    too_wide = [v for i in range(WIDE) for v in (f"f{i}", "v")]
    crafted = ["record_id", "r2", *too_wide, "error", "bad input", "error_type", "InvalidInputError"]
    retry = Outcome(Disposition.RETRY, ids[3], "r3", (60_000, json.dumps(["record_id", "r3"])), holds_lock=False)
    settled = await _settled(
        raw_redis,
        [
            _commit(ids[0], "r0"),
            _commit(ids[1], "r1"),
            Outcome(Disposition.DEAD_LETTER, ids[2], "r2", crafted, holds_lock=False),
            retry,
            _commit(ids[4], "r4"),
            _commit(ids[5], "r5"),
        ],
    )
    assert sorted(o.entry_id for o in settled) == sorted(ids)  # every slot freed
    assert [o["record_id"] for o in await outputs(redis)] == ["r0", "r1", "r4", "r5"]
    assert await redis.zcard(RETRY) == 1
    # The item itself: dead-lettered in a form every script can write, its fields kept whole, the reason said.
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["record_id"] == "r2" and dead["error_type"] == "InvalidInputError"
    assert dead["error"] == "bad input; the dead letter could not be written field by field: 18006 values, over 7900"
    fields = {"record_id": "r2", **dict(zip(too_wide[::2], too_wide[1::2], strict=True))}
    assert packed_pairs(dead[PACKED_FIELDS]) == fields
    assert (await redis.xpending(IN, KEYS.consumer_group))["pending"] == 0


async def test_a_settle_item_the_script_fails_on_is_isolated_and_the_rest_settles_once(
    redis: aioredis.Redis, raw_redis: aioredis.Redis
) -> None:
    """A crafted item the script raises on (a retry delay that is no number), after commits the same script run
    already wrote: the halves are written apart, the commits are forwarded once, the bad item is left pending."""
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    ids = [await add_entry(redis, IN, {"record_id": f"r{i}"}) for i in range(7)]
    await redis.xreadgroup(KEYS.consumer_group, "me", {IN: ">"})
    bad_retry = Outcome(Disposition.RETRY, ids[3], "r3", ("soon", json.dumps(["record_id", "r3"])), holds_lock=False)
    dead = Outcome(Disposition.DEAD_LETTER, ids[4], "r4", ("record_id", "r4", "error", "why"), holds_lock=False)
    commits = [_commit(ids[i], f"r{i}") for i in range(7)]
    settled = await _settled(raw_redis, [*commits[:3], bad_retry, dead, *commits[5:]])
    assert sorted(o.entry_id for o in settled) == sorted(ids)
    assert [o["record_id"] for o in await outputs(redis)] == ["r0", "r1", "r2", "r5", "r6"]
    assert [f for _, f in await stream_entries(redis, DLQ)] == [{"record_id": "r4", "error": "why"}]
    assert [o.disposition for o in settled if o.entry_id == ids[3]] == [Disposition.LEAVE]
    pending = await redis.xpending_range(IN, KEYS.consumer_group, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [ids[3]]


async def test_a_settle_item_that_cannot_be_written_at_all_is_left_pending(
    redis: aioredis.Redis, raw_redis: aioredis.Redis
) -> None:
    """The fallback of the fallback: the DLQ key is not a stream, so no dead letter can be written; the item is
    left pending (its lock released) for a later attempt, and the commits beside it settle."""
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    ids = [await add_entry(redis, IN, {"record_id": f"r{i}"}) for i in range(3)]
    await redis.xreadgroup(KEYS.consumer_group, "me", {IN: ">"})
    await redis.set(DLQ, "not a stream")
    await redis.set(KEYS.record_prefix + "r1", "me:token")
    dead = Outcome(Disposition.DEAD_LETTER, ids[1], "r1", ("record_id", "r1", "error", "why"), holds_lock=True)
    settled = await _settled(raw_redis, [_commit(ids[0], "r0"), dead, _commit(ids[2], "r2")])
    assert [(o.entry_id, o.disposition) for o in settled if o.entry_id == ids[1]] == [(ids[1], Disposition.LEAVE)]
    assert [o["record_id"] for o in await outputs(redis)] == ["r0", "r2"]
    pending = await redis.xpending_range(IN, KEYS.consumer_group, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [ids[1]]
    assert await redis.get(KEYS.record_prefix + "r1") is None  # our lock released


async def test_a_retry_too_wide_to_promote_is_requeued_packed_and_dead_lettered(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """A retry-set member written before the cap (or by hand) with thousands of fields: promotion must not fail
    on it, or every retry of the stage waits behind it forever."""
    wide = _wide_fields("wide")
    await redis.zadd(RETRY, {json.dumps([v for pair in wide.items() for v in pair]): 1})
    await redis.zadd(RETRY, {json.dumps(["record_id", "ok", "data", "{}"]): 2})
    moved = await RetryScheduler(redis, _settings()).promote_due()
    assert moved == 2
    entries = [fields for _, fields in await stream_entries(redis, IN)]
    assert entries[1] == {"record_id": "ok", "data": "{}"}
    assert entries[0]["record_id"] == "wide" and packed_pairs(entries[0][PACKED_FIELDS]) == wide
    async with running_worker(redis_url, output_queue=OUT) as worker:
        await wait_until(lambda: drained(worker), "input drained", 20)
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error_type"] == "MalformedMessage" and "packed" in dead["error"]
    assert packed_pairs(dead[PACKED_FIELDS]) == wide
    assert [o["record_id"] for o in await outputs(redis)] == ["ok"]


async def test_a_wide_ish_entry_retries_and_commits(redis: aioredis.Redis, redis_url: str) -> None:
    """At MAX_ENTRY_FIELDS, a transient failure goes through the retry set and back: every script handles it."""
    await redis.set("dependency-down:s", 1)
    fields = {"record_id": "r", **{f"f{i}": "v" for i in range(998)}}
    await add_entry(redis, IN, fields)
    async with running_worker(redis_url, output_queue=OUT, circuit_failure_threshold=1000) as worker:
        await wait_until(lambda: redis.zcard(RETRY), "a retry scheduled", 20)
        await redis.delete("dependency-down:s")
        await wait_until(lambda: drained(worker), "input drained", 20)
        await wait_until(lambda: outputs(redis), "forwarded", 20)
    [out] = await outputs(redis)
    assert len(json.loads(out["data"])) == 998 + 1  # the plain fields plus seen_by
    assert await redis.xlen(DLQ) == 0


async def test_dlq_replay_moves_what_it_can_and_keeps_what_would_fail_again(redis: aioredis.Redis) -> None:
    packed = {"record_id": "p", PACKED_FIELDS: json.dumps(["record_id", "p"]), "error": "wide"}
    await add_entry(redis, DLQ, packed)
    await add_entry(redis, DLQ, {**_wide_fields("w"), "error": "x"})  # written field by field before the cap
    ok = await redis.xadd(DLQ, {"record_id": "ok", "data": "{}", "error": "x", "error_type": "E"})
    assert await dlq.replay(redis, DLQ, IN, None) == 1
    assert [fields for _, fields in await stream_entries(redis, IN)] == [
        {"record_id": "ok", "data": "{}", "retry_count": "0"}
    ]
    kept = await stream_entries(redis, DLQ)
    assert [f["record_id"] for _, f in kept] == ["p", "w"] and ok not in [i for i, _ in kept]
    assert await dlq.replay(redis, DLQ, IN, None) == 0  # the kept ones never block a later replay either


async def test_repair_reclaim_leaves_a_wide_entry_to_the_worker(redis: aioredis.Redis) -> None:
    s = _settings(claim_idle_ms=1)  # dead-pod is dead a millisecond after its read
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    wide_id = await add_entry(redis, IN, _wide_fields("wide"))
    ok_id = await add(redis, "ok")
    await redis.xreadgroup(KEYS.consumer_group, "dead-pod", {IN: ">"})
    await asyncio.sleep(0.01)
    plan = await repair.plan_reclaim(redis, s)
    assert {r.entry_id: r.status for r in plan.entries} == {wide_id: "wide", ok_id: "moved"}  # the dry run says so
    done = {r.entry_id: r.status for r in await repair.reclaim(redis, s, plan)}
    assert done == {wide_id: "wide", ok_id: "moved"}
    pending = await redis.xpending_range(IN, KEYS.consumer_group, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [wide_id]  # the worker's reclaim dead-letters it


async def test_reprocess_refuses_an_entry_too_wide_to_write(redis: aioredis.Redis) -> None:
    await add_entry(redis, IN, _wide_fields("wide"))
    await redis.xadd(DLQ, {"record_id": "packed", PACKED_FIELDS: "[]", "error": "wide"})
    for record in ("wide", "packed"):
        with pytest.raises(repair.ReprocessError, match="too wide"):
            await repair.plan_reprocess(redis, _settings(), record)


async def test_a_read_asks_for_no_more_entries_than_fit_in_read_memory(redis: aioredis.Redis, redis_url: str) -> None:
    """READ_MEMORY_BYTES / MAX_MESSAGE_BYTES bounds COUNT, seen on the wire (MONITOR): 4 MiB / 1 MiB = 4 entries
    per XREADGROUP, where CONCURRENCY alone would ask for 32."""
    for i in range(12):
        await add(redis, f"r{i}")
    reads: list[int] = []
    watching = asyncio.Event()

    async def watch() -> None:
        async with redis.monitor() as monitor:  # MONITOR is on once entered
            watching.set()
            async for command in monitor.listen():
                words = command["command"].split()
                if words[0].upper() == "XREADGROUP":
                    reads.append(int(words[[w.upper() for w in words].index("COUNT") + 1]))

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(watching.wait(), 10)  # before the worker's first read
        async with running_worker(
            redis_url, output_queue=OUT, concurrency=64, max_message_bytes=2**20, read_memory_bytes=4 * 2**20
        ) as worker:
            await wait_until(lambda: drained(worker), "input drained", 20)
    finally:
        watcher.cancel()
    assert reads and max(reads) == 4
    assert len(await outputs(redis)) == 12


async def test_a_commit_whose_forward_fails_is_neither_lost_nor_doubled(
    redis: aioredis.Redis, raw_redis: aioredis.Redis
) -> None:
    """The output key is no stream: the script fails on the commit after writing the dead letter before it. The
    batch written again must not dead-letter twice, nor take the commit's own marker for a duplicate (acknowledged,
    never forwarded: lost)."""
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    ids = [await add_entry(redis, IN, {"record_id": f"r{i}"}) for i in range(2)]
    await redis.xreadgroup(KEYS.consumer_group, "me", {IN: ">"})
    await redis.set(OUT, "not a stream")
    dead = Outcome(Disposition.DEAD_LETTER, ids[0], "r0", ("record_id", "r0", "error", "why"), holds_lock=False)
    await _settled(raw_redis, [dead, _commit(ids[1], "r1")])
    assert [f for _, f in await stream_entries(redis, DLQ)] == [{"record_id": "r0", "error": "why"}]
    assert await redis.get(KEYS.record_prefix + "r1") is None  # not marked done: it was never forwarded
    pending = await redis.xpending_range(IN, KEYS.consumer_group, "-", "+", 10)
    assert [p["message_id"] for p in pending] == [ids[1]]  # left for a later attempt
