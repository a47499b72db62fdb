"""What the operator does in Redis: create a stage's streams and group, replay its DLQ once, destroy its data."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from phoenix.keys import StageKeys
from phoenix.worker_runtime import lua as runtime_lua
from phoenix.worker_runtime.dlq import replay_args
from phoenix.worker_runtime.redis_client import text

_ENSURE_STREAM = files(__package__).joinpath("ensure_stream.lua").read_text()
REPLAY_BATCH = 1000
# Long enough to outlive any operator outage; short enough not to accumulate.
REPLAY_LEDGER_TTL_SECONDS = 7 * 86400


@dataclass(frozen=True)
class Created:
    """What ensure_streams had to create."""

    group: bool
    dlq: bool


async def ensure_streams(client: Redis, streams: StageKeys) -> Created:
    """The input stream with the consumer group (an existing group is adopted), and an empty DLQ stream."""
    try:
        # From 0: entries enqueued before the stage existed are processed too.
        await client.xgroup_create(streams.input, streams.consumer_group, id="0", mkstream=True)
        group = True
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
        group = False
    dlq = await client.register_script(_ENSURE_STREAM)(keys=[streams.dlq])
    return Created(group=group, dlq=bool(dlq))


async def destroy(client: Redis, streams: StageKeys) -> None:
    """Remove the consumer group, the input and DLQ streams and the retry set (deletionPolicy: Delete)."""
    pipe = client.pipeline(transaction=True)
    pipe.xgroup_destroy(streams.input, streams.consumer_group)
    pipe.delete(streams.input, streams.dlq, streams.retry)
    # XGROUP DESTROY on a missing stream fails; the DEL still runs and that is all that matters.
    await pipe.execute(raise_on_error=False)


async def replay_once(client: Redis, ledger: str, dlq: str, input_stream: str, limit: int | None) -> int:
    """Move up to `limit` (None: all) DLQ entries back to the input, at most once for the request `ledger` names.

    Each batch is one MULTI/EXEC holding the claim of the batch (HINCRBY claimed) and the atomic move of the
    worker runtime's replay script: both happen or neither does. The number moved is recorded right after. A
    crash between EXEC and that record leaves claimed > recorded: the request then ends there instead of moving
    again, so a crash can make a replay move fewer entries (they stay in the DLQ, nothing is lost), never more.
    """
    move = runtime_lua.register(client, "dlq_replay.lua")
    start = "-"  # entries the script keeps in the DLQ (too wide to replay) are looked at once per call
    while True:
        state = await client.hgetall(ledger)
        moved, claimed, recorded = (int(state.get(k, 0)) for k in ("moved", "claimed", "recorded"))
        if state.get("done") or claimed > recorded:
            break
        want = REPLAY_BATCH if limit is None else min(REPLAY_BATCH, limit - moved)
        if want <= 0:
            break
        pipe = client.pipeline(transaction=True)
        pipe.hincrby(ledger, "claimed", 1)
        pipe.expire(ledger, REPLAY_LEDGER_TTL_SECONDS)
        await move(keys=[dlq, input_stream], args=replay_args(want, start), client=pipe)
        _, _, (count, seen, last) = await pipe.execute()
        record = client.pipeline(transaction=True)
        record.hincrby(ledger, "moved", count)
        record.hincrby(ledger, "recorded", 1)
        await record.execute()
        moved += count
        if seen < want:
            break
        start = "(" + text(last)
    await client.hset(ledger, "done", 1)
    return moved
