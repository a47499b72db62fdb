"""What the operator does in Redis besides claiming a stage's keys (worker_runtime/ownership.py): replay its DLQ
once, delete what its own stage created."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from phoenix.keys import StageKeys
from phoenix.redis_spec import is_cluster
from phoenix.worker_runtime import lua
from phoenix.worker_runtime.dlq import replay_args
from phoenix.worker_runtime.ownership import stage_ref
from phoenix.worker_runtime.redis_client import text

_DELETE_OWNED = lua.source("delete_owned.lua", __package__)
REPLAY_BATCH = 1000
# Long enough to outlive any operator outage; short enough not to accumulate.
REPLAY_LEDGER_TTL_SECONDS = 7 * 86400
# Record keys and replay ledgers are found by SCAN and deleted this many per script call.
DELETE_BATCH = 500


@dataclass(frozen=True)
class Destroyed:
    """What destroy deleted: the group, the streams and how many other keys (retry set, records, ledgers, ...)."""

    group: str | None = None
    streams: list[str] = field(default_factory=list)
    keys: int = 0


@dataclass(frozen=True)
class NotHeld:
    """The stage does not hold its keys: the marker names `holder` ("<namespace>/<name> (uid ...)"; "" when there
    is no marker), so destroy deleted nothing."""

    holder: str


async def _batches(client: Redis, pattern: str) -> AsyncIterator[list[str]]:
    batch: list[str] = []
    async for key in client.scan_iter(match=pattern, count=DELETE_BATCH):
        batch.append(text(key))
        if len(batch) == DELETE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def _marker(client: Redis, owner: str) -> dict[str, str]:
    return {text(k): text(v) for k, v in (await client.hgetall(owner)).items()}


async def destroy(client: Redis, keys: StageKeys, uid: str) -> Destroyed | NotHeld:
    """deletionPolicy Delete: remove what the PhoenixStage `uid` owns of the stage's keys, each only while it has
    its type: of each lane, the streams and group its marker says it created, its retry set, record keys, replay
    ledgers, backpressure figure, DLQ trim counter and outbox, and last its marker; of the stage as a whole its
    audit stream and layout (a stage of several partitions: with its stage-wide marker, last; a retry
    after a failure finds it still there). A stage whose marker (or any lane's) names another stage or uid, or
    that has none, deletes nothing."""
    whole = await _marker(client, keys.owner)
    if not _holds(whole, keys, uid):
        holder = whole.get("stage", "")
        return NotHeld(f"{holder} (uid {whole.get('uid') or 'none'})" if holder else "")
    lanes = [(lane, whole if lane.owner == keys.owner else await _marker(client, lane.owner)) for lane in keys.lanes]
    for _, marker in lanes:
        if marker and not _holds(marker, keys, uid):
            return NotHeld(f"{marker.get('stage', '')} (uid {marker.get('uid') or 'none'})")
    delete = client.register_script(_DELETE_OWNED)
    count, group_destroyed, streams = 0, None, []
    stage_wide = [(keys.audit, "stream"), (keys.layout, "hash")]
    for lane, marker in lanes:
        if not marker:
            continue  # a lane never claimed (a claim refused half-way) has nothing of this stage's
        created = set(marker.get("created", "input,dlq,group").split(","))
        input_stream, dlq, group = marker.get("input", lane.input), marker.get("dlq", lane.dlq), marker.get("group")
        named = [(input_stream, "input"), (dlq, "dlq")]
        destroyed_group = group if group and "group" in created else None
        # The group goes with its stream when the stage created that; else it is destroyed alone.
        alone = destroyed_group if destroyed_group and "input" not in created else ""
        final = [
            *((stream, "stream" if word in created else "-") for stream, word in named),
            (lane.retry, "zset"),
            (lane.backpressure, "string"),
            (lane.dlq_trimmed, "string"),
            (lane.outbox, "stream"),
            *(stage_wide if lane.owner == keys.owner else []),
        ]
        scanned = [(lane.record_prefix + "*", "string"), (lane.replay_ledgers_pattern, "hash")]
        done = await _delete_owned(client, delete, lane.owner, uid, scanned, final, alone)
        if done < 0:
            return NotHeld(marker["stage"])  # adopted by another PhoenixStage meanwhile
        count += done
        group_destroyed = group_destroyed or destroyed_group
        streams += [stream for stream, word in named if word in created]
    if keys.owner not in {lane.owner for lane in keys.lanes}:
        done = await _delete_owned(client, delete, keys.owner, uid, [], stage_wide, "")
        if done < 0:
            return NotHeld(whole["stage"])
        count += done
    return Destroyed(group_destroyed, streams, count)


def _holds(marker: dict[str, str], keys: StageKeys, uid: str) -> bool:
    return marker.get("stage") == stage_ref(keys) and marker.get("uid") == uid


async def _delete_owned(
    client: Redis,
    delete: AsyncScript,
    owner: str,
    uid: str,
    scanned: list[tuple[str, str]],
    final: list[tuple[str, str]],
    group: str,
) -> int:
    """delete_owned.lua under the marker `owner` (one slot): the keys matching each (pattern, type) of `scanned`
    in batches, then `final` (key, type), destroying `group` first, and the marker last; -1 when the marker names
    another uid."""
    count = 0
    for pattern, kind in scanned:
        async for batch in _batches(client, pattern):
            done = int(await delete(keys=[owner, *batch], args=[uid, "", "0", *[kind] * len(batch)]))
            if done < 0:
                return done
            count += done
    done = int(await delete(keys=[owner, *(key for key, _ in final)], args=[uid, group, "1", *(k for _, k in final)]))
    return done if done < 0 else count + done


async def replay_lanes(client: Redis, keys: StageKeys, request_id: str, limit: int | None) -> int:
    """replay_once for each lane of the stage (its DLQ back to its own input, its own ledger in its slot), up to
    `limit` (None: all) in all; a repeated attempt finds each lane's ledger and continues where it stopped."""
    moved = 0
    for lane in keys.lanes:
        if limit is not None and moved >= limit:
            break
        rest = None if limit is None else limit - moved
        moved += await replay_once(client, lane.replay_ledger(request_id), lane.dlq, lane.input, rest)
    return moved


async def replay_once(client: Redis, ledger: str, dlq: str, input_stream: str, limit: int | None) -> int:
    """Move up to `limit` (None: all) DLQ entries back to the input, at most once for the request `ledger` names.

    Each batch is one MULTI/EXEC holding the claim of the batch (HINCRBY claimed) and the atomic move of the
    worker runtime's replay script: both happen or neither does. The number moved is recorded right after. A
    crash between EXEC and that record leaves claimed > recorded: the request then ends there instead of moving
    again, so a crash can make a replay move fewer entries (they stay in the DLQ, nothing is lost), never more.
    """
    move = lua.register(client, "dlq_replay.lua")
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
        if is_cluster(client):
            # redis-py's cluster pipeline refuses scripts (its evalsha): the script is loaded on every primary
            # first, again each batch, as a promoted replica never got it, and queued as a plain EVALSHA.
            await client.script_load(move.script)
            pipe.execute_command("EVALSHA", move.sha, 2, dlq, input_stream, *replay_args(want, start))
        else:
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
