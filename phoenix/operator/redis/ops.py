"""What the operator does in Redis besides claiming a stage's keys (worker_runtime/ownership.py): replay its DLQ
once, delete what its own stage created."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from phoenix import lua
from phoenix.keys import StageKeys
from phoenix.redis_replies import text
from phoenix.tools import dlq
from phoenix.worker_runtime.ownership import laid_out, name_users, stage_ref

_DELETE_OWNED = lua.source("delete_owned.lua", __package__)
# Record keys and replay ledgers are found by SCAN and deleted this many per script call.
DELETE_BATCH = 500


@dataclass(frozen=True)
class Destroyed:
    """What destroy deleted: the group, the streams and how many other keys (retry set, records, ledgers, ...); and
    the streams it created but kept, since another consumer group reads them or another stage of its namespace uses
    them."""

    group: str | None = None
    streams: list[str] = field(default_factory=list)
    keys: int = 0
    kept: list[str] = field(default_factory=list)


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


async def destroy(client: Redis, given: StageKeys, uid: str, cluster: str = "") -> Destroyed | NotHeld:
    """deletionPolicy Delete: remove what the PhoenixStage `uid` (of the Kubernetes cluster `cluster`, "" unknown)
    owns of the stage's keys, in the layout Redis holds (its lanes, whatever the spec asks for now), each only while
    it has its type: of each lane, the streams and group its marker says it created (a stream only while no other
    consumer group reads it and no other stage of its namespace uses its claimed name), its retry set, record keys,
    replay ledgers, backpressure figure, DLQ trim counter and outbox, and last its marker; of the stage as a whole
    its audit stream, layout and latency windows (a stage of several partitions: with its stage-wide marker, last; a
    retry after a failure finds it still there). A stage whose marker (or any lane's) names another stage, uid or
    cluster, or that has none, deletes nothing. The names it claimed are given up apart (ownership.release_names)."""
    [keys] = await laid_out(client, [given])
    whole = await _marker(client, keys.owner)
    if not _holds(whole, keys, uid, cluster):
        return NotHeld(_holder(whole))
    lanes = [(lane, whole if lane.owner == keys.owner else await _marker(client, lane.owner)) for lane in keys.lanes]
    for _, marker in lanes:
        if marker and not _holds(marker, keys, uid, cluster):
            return NotHeld(_holder(marker))
    shared = {stream for stream, users in (await name_users(client, keys, cluster)).items() if users - {keys.name}}
    delete = client.register_script(_DELETE_OWNED)
    count, group_destroyed, created_streams = 0, None, []
    stage_wide = [(keys.audit, "stream"), (keys.layout, "hash"), (keys.held, "zset")]
    stage_wide_scanned = [(keys.latency_windows_pattern, "hash")]
    for lane, marker in lanes:
        if not marker:
            continue  # a lane never claimed (a claim refused half-way) has nothing of this stage's
        created = set(marker.get("created", "input,dlq,group").split(","))
        input_stream, dlq, group = marker.get("input", lane.input), marker.get("dlq", lane.dlq), marker.get("group")
        # A stream the stage created goes only while nothing else reads it (the script looks at its groups, after
        # destroying the stage's own) and no other stage of its namespace uses its claimed name.
        mine = [stream for stream, word in ((input_stream, "input"), (dlq, "dlq")) if word in created]
        destroyed_group = group if group and "group" in created else None
        final = [
            *((stream, "unread" if stream in mine and stream not in shared else "-") for stream in (input_stream, dlq)),
            (lane.retry, "zset"),
            (lane.backpressure, "string"),
            (lane.dlq_trimmed, "string"),
            (lane.outbox, "stream"),
            *(stage_wide if lane.owner == keys.owner else []),
        ]
        scanned = [
            (lane.record_prefix + "*", "string"),
            (lane.ingest_prefix + "*", "string"),
            (lane.replay_ledgers_pattern, "hash"),
            *(stage_wide_scanned if lane.owner == keys.owner else []),
        ]
        done = await _delete_owned(client, delete, lane.owner, uid, scanned, final, destroyed_group or "")
        if done < 0:
            return NotHeld(marker["stage"])  # adopted by another PhoenixStage meanwhile
        count += done
        group_destroyed = group_destroyed or destroyed_group
        created_streams += mine
    if keys.owner not in {lane.owner for lane in keys.lanes}:
        done = await _delete_owned(client, delete, keys.owner, uid, stage_wide_scanned, stage_wide, "")
        if done < 0:
            return NotHeld(whole["stage"])
        count += done
    # What became of the streams it created: gone, kept (read or used by others), or another's key of that name.
    kinds = [text(await client.type(stream)) for stream in created_streams]
    return Destroyed(
        group_destroyed,
        [stream for stream, kind in zip(created_streams, kinds, strict=True) if kind == "none"],
        count,
        [stream for stream, kind in zip(created_streams, kinds, strict=True) if kind == "stream"],
    )


def _holds(marker: dict[str, str], keys: StageKeys, uid: str, cluster: str) -> bool:
    same_cluster = not cluster or marker.get("cluster", "") in ("", cluster)
    return marker.get("stage") == stage_ref(keys) and marker.get("uid") == uid and same_cluster


def _holder(marker: dict[str, str]) -> str:
    """Who a marker names, as deletion's Warning says it ("" for no marker)."""
    holder = marker.get("stage", "")
    if not holder:
        return ""
    cluster = f", Kubernetes cluster {marker['cluster']}" if marker.get("cluster") else ""
    return f"{holder} (uid {marker.get('uid') or 'none'}{cluster})"


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
    """A ledgered replay (tools/dlq.py) of each lane of the stage (its DLQ back to its own input, its own ledger in
    its slot), up to `limit` (None: all) in all; a repeated attempt finds each lane's ledger and continues where it
    stopped."""
    moved = 0
    for lane in keys.lanes:
        if limit is not None and moved >= limit:
            break
        rest = None if limit is None else limit - moved
        moved += await dlq.replay(client, lane.dlq, lane.input, rest, ledger=lane.replay_ledger(request_id))
    return moved
