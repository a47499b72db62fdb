"""The way back from a stage's dead-letter stream: list, replay and purge it (`phoenix dlq`, and the operator's
replay annotation)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from phoenix import lua
from phoenix.keys import StageKeys
from phoenix.record_format import LUA_UNPACK_LIMIT, PACKED_FIELDS, packed_pairs
from phoenix.redis_replies import text, text_range
from phoenix.redis_spec import is_cluster

_BATCH = 1000
# A replay request's ledger: long enough to outlive any operator outage; short enough not to accumulate.
REPLAY_LEDGER_TTL_SECONDS = 7 * 86400


async def oldest(client: Redis, lanes: Sequence[StageKeys], count: int) -> list[tuple[str, dict[str, str | int]]]:
    """The oldest `count` dead letters over every lane of a stage, oldest first (`phoenix dlq list`, `phoenix ui`)."""
    found = [
        (entry_id, {**fields, **lane_fields(lanes, p)})
        for p, lane in enumerate(lanes)
        for entry_id, fields in await text_range(client, lane.dlq, count=count)
    ]
    return sorted(found, key=lambda entry: entry_time(entry[0]))[:count]


def lane_fields(lanes: Sequence[StageKeys], p: int) -> dict[str, str | int]:
    """The partition an entry came from, for a stage of several."""
    return {"partition": p} if len(lanes) > 1 else {}


def entry_time(entry_id: str) -> tuple[int, int]:
    """An entry id as its (milliseconds, sequence), for ordering entries of several streams."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def replay(client: Redis, dlq: str, input_stream: str, limit: int | None, *, ledger: str | None = None) -> int:
    """Move up to `limit` (None: all) DLQ entries, oldest first, back into the input stream; entries too wide for the
    scripts stay (they could only fail again) and are looked at once.

    With a `ledger` (the operator's replay request: keys.replay_ledger), at most once for that request: each batch is
    one MULTI/EXEC holding the claim of the batch (HINCRBY claimed) and the atomic move, both or neither, and the
    number moved is recorded right after. A crash between EXEC and that record leaves claimed > recorded: the request
    then ends there instead of moving again, so a crash can make a replay move fewer entries (they stay in the DLQ,
    nothing is lost), never more. A repeated request continues where it stopped; returns the request's total.
    """
    move = lua.register(client, "dlq_replay.lua", __package__)
    moved, start = 0, "-"
    while True:
        if ledger is not None:
            state = await client.hgetall(ledger)
            moved, claimed, recorded = (int(state.get(k, 0)) for k in ("moved", "claimed", "recorded"))
            if state.get("done") or claimed > recorded:
                break
        want = _BATCH if limit is None else min(_BATCH, limit - moved)
        if want <= 0:
            break
        args: list[str | int] = [want, start, LUA_UNPACK_LIMIT, PACKED_FIELDS]
        if ledger is None:
            count, seen, last = await move(keys=[dlq, input_stream], args=args)
        else:
            count, seen, last = await _move_claimed(client, move, ledger, [dlq, input_stream], args)
        moved += count
        if seen < want:
            break
        start = "(" + text(last)
    if ledger is not None:
        await client.hset(ledger, "done", 1)
    return moved


async def _move_claimed(
    client: Redis, move: AsyncScript, ledger: str, keys: list[str], args: list[str | int]
) -> tuple[int, int, bytes | str]:
    pipe = client.pipeline(transaction=True)
    pipe.hincrby(ledger, "claimed", 1)
    pipe.expire(ledger, REPLAY_LEDGER_TTL_SECONDS)
    if is_cluster(client):
        # redis-py's cluster pipeline refuses scripts (its evalsha): the script is loaded on every primary first,
        # again each batch, as a promoted replica never got it, and queued as a plain EVALSHA.
        await client.script_load(move.script)
        pipe.execute_command("EVALSHA", move.sha, len(keys), *keys, *args)
    else:
        await move(keys=keys, args=args, client=pipe)
    _, _, (count, seen, last) = await pipe.execute()
    record = client.pipeline(transaction=True)
    record.hincrby(ledger, "moved", count)
    record.hincrby(ledger, "recorded", 1)
    await record.execute()
    return count, seen, last


async def entries(
    client: Redis, stream: str, page: int = _BATCH, *, first: str = "-", last: str = "+"
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Every entry of a DLQ (or of any stream) from `first` to `last`, oldest first, read a page at a time."""
    lower = first
    while True:
        batch = await text_range(client, stream, first=lower, last=last, count=page)
        for entry in batch:
            yield entry
        if len(batch) < page:
            return
        lower = "(" + batch[-1][0]


async def waiting_records(client: Redis, lane: StageKeys, record_ids: Collection[str]) -> set[str]:
    """Those of `record_ids` with an entry the lane has still to work on: not yet delivered to its group, pending,
    or in its retry set (a copy `phoenix reprocess` added, the record sent again). It reads that part of the lane
    whole, the cost of a purge, paid by the person purging and never by a worker."""
    wanted, found = set(record_ids), set[str]()
    if not wanted:
        return found
    try:
        group = next((g for g in await client.xinfo_groups(lane.input) if g["name"] == lane.consumer_group), None)
    except ResponseError:  # no input stream: nothing waits in it
        group = None
    undelivered = "(" + group["last-delivered-id"] if group else "-"
    async for _, fields in entries(client, lane.input, first=undelivered):
        found.add(fields.get("record_id", ""))
    if group:
        start = "-"
        while rows := await client.xpending_range(lane.input, lane.consumer_group, min=start, max="+", count=_BATCH):
            pipe = client.pipeline(transaction=False)
            for row in rows:
                pipe.xrange(lane.input, min=row["message_id"], max=row["message_id"])
            found.update(fields.get("record_id", "") for reply in await pipe.execute() for _, fields in reply)
            start = "(" + text(rows[-1]["message_id"])
    async for member in client.zscan_iter(lane.retry):
        found.add(packed_pairs(member[0]).get("record_id", ""))
    return found & wanted


async def purge_through(client: Redis, dlq: str, last_id: str) -> int:
    """Delete the DLQ entries up to and including `last_id` (e.g. the last one exported) in one command.

    Entries dead-lettered after it stay, so exporting and then purging never deletes an entry nobody has read.
    """
    ms, _, seq = last_id.partition("-")
    return await client.xtrim(dlq, minid=f"{int(ms)}-{int(seq or 0) + 1}", approximate=False)
