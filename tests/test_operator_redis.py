"""The operator's once-only DLQ replay against a real Valkey (claim and destroy: tests/test_ownership.py)."""

from __future__ import annotations

import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.record_format import PACKED_FIELDS
from phoenix.tools import dlq
from tests.fixtures.replies import stream_entries

STREAMS = StageKeys.for_stage("s")


async def test_replay_runs_once_per_request(redis: aioredis.Redis) -> None:
    for i in range(5):
        await redis.xadd(STREAMS.dlq, {"record_id": f"r{i}", "error": "boom", "retry_count": "3"})
    ledger = STREAMS.replay_ledger("req-1")
    assert await dlq.replay(redis, STREAMS.dlq, STREAMS.input, 3, ledger=ledger) == 3
    # The same request again (an operator restarted before recording it): nothing more moves.
    assert await dlq.replay(redis, STREAMS.dlq, STREAMS.input, 3, ledger=ledger) == 3
    assert (await redis.xlen(STREAMS.dlq), await redis.xlen(STREAMS.input)) == (2, 3)
    moved = await stream_entries(redis, STREAMS.input)
    assert moved[0][1] == {"record_id": "r0", "retry_count": "0"}
    assert await dlq.replay(redis, STREAMS.dlq, STREAMS.input, None, ledger=STREAMS.replay_ledger("req-2")) == 2
    assert await redis.xlen(STREAMS.dlq) == 0


async def test_replay_interrupted_after_a_move_never_moves_again(redis: aioredis.Redis) -> None:
    for i in range(4):
        await redis.xadd(STREAMS.dlq, {"record_id": f"r{i}"})
    ledger = STREAMS.replay_ledger("req-3")
    # What a crash between the batch's EXEC and recording its count leaves behind.
    await redis.hset(ledger, mapping={"claimed": 1, "recorded": 0, "moved": 0})
    assert await dlq.replay(redis, STREAMS.dlq, STREAMS.input, None, ledger=ledger) == 0
    assert await redis.xlen(STREAMS.dlq) == 4


async def test_replay_keeps_entries_too_wide_to_replay_and_moves_the_rest(redis: aioredis.Redis) -> None:
    """`phoenix.io/replay-dlq`: an entry of 9,000 fields (dead-lettered field by field before MAX_ENTRY_FIELDS) and
    a packed one stay in the DLQ; the entries behind them are moved, up to the count asked for."""
    await redis.xadd(STREAMS.dlq, {"record_id": "wide", **{f"f{i}": "v" for i in range(9000)}})
    await redis.xadd(STREAMS.dlq, {"record_id": "packed", PACKED_FIELDS: "[]"})
    for i in range(3):
        await redis.xadd(STREAMS.dlq, {"record_id": f"r{i}"})
    assert await dlq.replay(redis, STREAMS.dlq, STREAMS.input, 2, ledger=STREAMS.replay_ledger("req-w")) == 2
    assert [f["record_id"] for _, f in await stream_entries(redis, STREAMS.input)] == ["r0", "r1"]
    assert await dlq.replay(redis, STREAMS.dlq, STREAMS.input, None, ledger=STREAMS.replay_ledger("req-w2")) == 1
    assert [f["record_id"] for _, f in await stream_entries(redis, STREAMS.dlq)] == ["wide", "packed"]
