"""The operator's Redis operations against a real Valkey: streams and group, once-only replay, destroy."""

from __future__ import annotations

import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.operator.redis_ops import Created, destroy, ensure_streams, replay_once
from phoenix.worker_runtime.messages import PACKED_FIELDS

STREAMS = StageKeys.for_stage("s")


async def test_ensure_streams_is_idempotent_and_adopts_the_group(redis: aioredis.Redis) -> None:
    await redis.xadd(STREAMS.input, {"record_id": "early"})
    assert await ensure_streams(redis, STREAMS) == Created(group=True, dlq=True)
    await redis.xadd(STREAMS.dlq, {"record_id": "dead"})
    assert await ensure_streams(redis, STREAMS) == Created(group=False, dlq=False)
    groups = await redis.xinfo_groups(STREAMS.input)
    # From 0: the entry enqueued before the stage existed is still to be delivered.
    assert [(g["name"], g["lag"]) for g in groups] == [("s-group", 1)]
    assert await redis.xlen(STREAMS.dlq) == 1
    await redis.delete(STREAMS.dlq)
    assert await ensure_streams(redis, STREAMS) == Created(group=False, dlq=True)
    assert (await redis.type(STREAMS.dlq), await redis.xlen(STREAMS.dlq)) == ("stream", 0)


async def test_replay_runs_once_per_request(redis: aioredis.Redis) -> None:
    for i in range(5):
        await redis.xadd(STREAMS.dlq, {"record_id": f"r{i}", "error": "boom", "retry_count": "3"})
    ledger = STREAMS.replay_ledger("req-1")
    assert await replay_once(redis, ledger, STREAMS.dlq, STREAMS.input, 3) == 3
    # The same request again (an operator restarted before recording it): nothing more moves.
    assert await replay_once(redis, ledger, STREAMS.dlq, STREAMS.input, 3) == 3
    assert (await redis.xlen(STREAMS.dlq), await redis.xlen(STREAMS.input)) == (2, 3)
    moved = await redis.xrange(STREAMS.input)
    assert moved[0][1] == {"record_id": "r0", "retry_count": "0"}
    assert await replay_once(redis, STREAMS.replay_ledger("req-2"), STREAMS.dlq, STREAMS.input, None) == 2
    assert await redis.xlen(STREAMS.dlq) == 0


async def test_replay_interrupted_after_a_move_never_moves_again(redis: aioredis.Redis) -> None:
    for i in range(4):
        await redis.xadd(STREAMS.dlq, {"record_id": f"r{i}"})
    ledger = STREAMS.replay_ledger("req-3")
    # What a crash between the batch's EXEC and recording its count leaves behind.
    await redis.hset(ledger, mapping={"claimed": 1, "recorded": 0, "moved": 0})
    assert await replay_once(redis, ledger, STREAMS.dlq, STREAMS.input, None) == 0
    assert await redis.xlen(STREAMS.dlq) == 4


async def test_replay_keeps_entries_too_wide_to_replay_and_moves_the_rest(redis: aioredis.Redis) -> None:
    """`phoenix.io/replay-dlq`: an entry of 9,000 fields (dead-lettered field by field before MAX_ENTRY_FIELDS) and
    a packed one stay in the DLQ; the entries behind them are moved, up to the count asked for."""
    await redis.xadd(STREAMS.dlq, {"record_id": "wide", **{f"f{i}": "v" for i in range(9000)}})
    await redis.xadd(STREAMS.dlq, {"record_id": "packed", PACKED_FIELDS: "[]"})
    for i in range(3):
        await redis.xadd(STREAMS.dlq, {"record_id": f"r{i}"})
    assert await replay_once(redis, STREAMS.replay_ledger("req-w"), STREAMS.dlq, STREAMS.input, 2) == 2
    assert [f["record_id"] for _, f in await redis.xrange(STREAMS.input)] == ["r0", "r1"]
    assert await replay_once(redis, STREAMS.replay_ledger("req-w2"), STREAMS.dlq, STREAMS.input, None) == 1
    assert [f["record_id"] for _, f in await redis.xrange(STREAMS.dlq)] == ["wide", "packed"]


async def test_destroy_removes_group_streams_and_retry_set(redis: aioredis.Redis) -> None:
    await ensure_streams(redis, STREAMS)
    await redis.zadd("phoenix:{default}:s:retry", {"x": 1})
    await redis.xadd("phoenix:{default}:other:input", {"record_id": "keep"})
    await destroy(redis, STREAMS)
    assert await redis.exists(STREAMS.input, STREAMS.dlq, "phoenix:{default}:s:retry") == 0
    assert await redis.exists("phoenix:{default}:other:input") == 1
    await destroy(redis, STREAMS)  # nothing left: still fine
