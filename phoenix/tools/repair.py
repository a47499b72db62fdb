"""The runbook's manual fixes as single atomic steps: release a stale lock, put dead consumers' entries back to
work, reprocess one record. Each first says what it would do (for `--dry-run` and the confirmation question),
then returns what it did, for the CLI to print and to record in the stage's audit stream (audit.py)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from phoenix import lua
from phoenix.errors import PhoenixError
from phoenix.keys import StageKeys
from phoenix.record_format import (
    DEADLINE,
    DONE,
    ENTERED_AT,
    FAILURE_FIELDS,
    LUA_UNPACK_LIMIT,
    PACKED_FIELDS,
    RETRY_STATE_FIELDS,
    SCRIPT_SAFE_FIELDS,
    committed_by,
    id_order,
    lock_holder,
    locked_by,
)
from phoenix.redis_replies import text, text_range
from phoenix.tools.inspection import DEFAULT_SCAN_LIMIT, consumer_alive, entries_of
from phoenix.worker_runtime.settings import WorkerSettings

_RECLAIM_BATCH = 100
# A reprocessed record starts afresh: no failure history, its age counted from now and no deadline (an Expired one
# would expire again); original_id stays so it can be traced.
_DROPPED_ON_REPROCESS = (frozenset(FAILURE_FIELDS) | frozenset(RETRY_STATE_FIELDS) | {ENTERED_AT, DEADLINE}) - {
    "original_id"
}


class UnlockStatus(enum.StrEnum):
    RELEASED = "released"
    NOT_LOCKED = "not-locked"
    CHANGED = "changed"  # released or re-taken by someone else between the read and the release
    HOLDER_ALIVE = "alive"


async def _record_state(client: Redis, key: str) -> str | None:
    """A record key's value (locks.py says what it means), or None."""
    value = await client.get(key)
    return None if value is None else text(value)


@dataclass(frozen=True)
class UnlockResult:
    status: UnlockStatus
    key: str
    holder: str = ""
    holder_idle_seconds: float | None = None  # None: the holder is not in the consumer group


async def unlock_preview(client: Redis, settings: WorkerSettings, record_id: str) -> UnlockResult:
    """What `unlock` without force would do now, changing nothing: RELEASED (would release), HOLDER_ALIVE (would
    refuse) or NOT_LOCKED. The release itself checks again, atomically."""
    s = settings
    lane = s.keys.lane_of(record_id)  # the record's partition: the stage itself when it has one
    key = lane.record(record_id)
    token = locked_by(await _record_state(client, key))
    if token is None:
        return UnlockResult(UnlockStatus.NOT_LOCKED, key)
    holder = lock_holder(token)
    idle_ms = next(
        (int(c["idle"]) for c in await _consumers(client, lane) if text(c["name"]) == holder),
        None,
    )
    alive = idle_ms is not None and consumer_alive(idle_ms, s)
    status = UnlockStatus.HOLDER_ALIVE if alive else UnlockStatus.RELEASED
    return UnlockResult(status, key, holder, None if idle_ms is None else idle_ms / 1000)


async def _consumers(client: Redis, lane: StageKeys) -> list[dict]:
    try:
        return await client.xinfo_consumers(lane.input, lane.consumer_group)
    except ResponseError:  # no stream or no group: the holder is in no group
        return []


async def unlock(client: Redis, settings: WorkerSettings, record_id: str, *, force: bool) -> UnlockResult:
    """Release the record's lock unless its holder is alive (consumer idle below CLAIM_IDLE_MS) or `force`."""
    s = settings
    lane = s.keys.lane_of(record_id)
    key = lane.record(record_id)
    value = await _record_state(client, key)
    token = locked_by(value)
    if value is None or token is None:
        return UnlockResult(UnlockStatus.NOT_LOCKED, key)
    holder = lock_holder(token)
    script = lua.register(client, "repair_unlock.lua", __package__)
    status, idle_ms = await script(
        keys=[key, lane.input],
        args=[value, holder, s.consumer_group, s.claim_idle_ms, "1" if force else "0"],
    )
    idle = None if int(idle_ms) < 0 else int(idle_ms) / 1000
    return UnlockResult(UnlockStatus(text(status)), key, holder, idle)


class ReclaimTooEager(PhoenixError):
    """An idle time below reclaim_floor_ms: entries that idle may still be in a live worker's hands."""


def reclaim_floor_ms(settings: WorkerSettings) -> int:
    """The least idle time `reclaim` takes entries at: the stage's LOCK_TIMEOUT, or CLAIM_IDLE_MS when that is
    shorter (the workers' own reclaim takes entries idle that long). A live worker resets the idle time of the
    entries it processes three times within it, as it renews their locks (Worker._renew_interval); below it,
    reclaim would take an entry from a worker still processing it and release its lock: the record would run twice
    at once."""
    return min(math.ceil(settings.lock_timeout * 1000), settings.claim_idle_ms)


@dataclass(frozen=True)
class Reclaimed:
    entry_id: str
    record_id: str
    consumer: str
    idle_seconds: float
    deliveries: int
    # moved | busy | alive | poison | wide | trimmed (see repair_reclaim.lua); in a plan: what it would be
    status: str
    new_entry_id: str = ""
    lock_released: bool = False


@dataclass(frozen=True)
class ReclaimPlan:
    """The entries pending for at least `min_idle_ms`, oldest first in each lane, each with the status it would get
    (moved or poison), the lock value to release ('' when its consumer holds none) and its lane."""

    min_idle_ms: int
    candidates: list[tuple[Reclaimed, str, StageKeys]]

    @property
    def entries(self) -> list[Reclaimed]:
        return [c for c, _, _ in self.candidates]

    @property
    def movable(self) -> int:
        return sum(c.status == "moved" for c in self.entries)


async def plan_reclaim(client: Redis, settings: WorkerSettings, min_idle_ms: int | None = None) -> ReclaimPlan:
    """What `reclaim` would do now (default idle: CLAIM_IDLE_MS), changing nothing. Raises ReclaimTooEager below
    reclaim_floor_ms. Entries of consumers still alive (as `unlock` tells them) are planned as 'alive': left."""
    s = settings
    min_idle = s.claim_idle_ms if min_idle_ms is None else min_idle_ms
    if min_idle < (floor := reclaim_floor_ms(s)):
        raise ReclaimTooEager(
            f"an idle time of {min_idle} ms is below the stage's lock timeout ({floor} ms: LOCK_TIMEOUT, or "
            "CLAIM_IDLE_MS when shorter): entries idle that long may be in the hands of live workers"
        )
    candidates: list[tuple[Reclaimed, str, StageKeys]] = []
    for lane in s.keys.lanes:
        alive = {text(c["name"]) for c in await _consumers(client, lane) if consumer_alive(int(c["idle"]), s)}
        start = "-"
        while rows := await client.xpending_range(
            lane.input, lane.consumer_group, min=start, max="+", count=_RECLAIM_BATCH, idle=min_idle
        ):
            start = "(" + text(rows[-1]["message_id"])
            candidates += [(*await _candidate(client, s, lane, row, alive), lane) for row in rows]
    return ReclaimPlan(min_idle, candidates)


async def reclaim(client: Redis, settings: WorkerSettings, plan: ReclaimPlan) -> list[Reclaimed]:
    """Carry out the plan: each entry re-enqueued atomically if it is still pending and idle (else 'busy')."""
    s = settings
    script = lua.register(client, "repair_reclaim.lua", __package__)
    done: list[Reclaimed] = []
    for lane in s.keys.lanes:  # one lane's keys per call: one slot
        of_lane = [(c, lock_value) for c, lock_value, at in plan.candidates if at == lane]
        for first in range(0, len(of_lane), _RECLAIM_BATCH):
            batch = of_lane[first : first + _RECLAIM_BATCH]
            # The script's KEYS: the input, then each candidate's record key; ARGV: its fixed head, then two per
            # candidate.
            keys = [lane.input, *(lane.record(c.record_id) for c, _ in batch)]
            args: list[str | int] = [
                lane.consumer_group,
                plan.min_idle_ms,
                s.max_deliveries,
                LUA_UNPACK_LIMIT,
                s.claim_idle_ms,
            ]
            for c, lock_value in batch:
                args += (c.entry_id, lock_value)
            replies = await script(keys=keys, args=args)
            for (c, _), (status, new_id, released) in zip(batch, replies, strict=True):
                done.append(replace(c, status=text(status), new_entry_id=text(new_id), lock_released=bool(released)))
    return done


async def _candidate(
    client: Redis, s: WorkerSettings, lane: StageKeys, row: dict, alive: set[str]
) -> tuple[Reclaimed, str]:
    """A pending entry of `lane` with its record, and the lock's token if its consumer holds the record's lock ('' if
    not); `alive`: the lane's consumers alive now."""
    entry_id, consumer = text(row["message_id"]), text(row["consumer"])
    entries = await text_range(client, lane.input, first=entry_id, last=entry_id)
    record_id = entries[0][1].get("record_id", "") if entries else ""
    value = await _record_state(client, lane.record(record_id)) if record_id else None
    token = locked_by(value)
    owned = token is not None and lock_holder(token) == consumer
    deliveries = int(row["times_delivered"])
    # As repair_reclaim.lua decides: an entry of a live consumer is left to it, one delivered MAX_DELIVERIES times
    # for the worker's poison check, one too wide for an XADD (its fields and original_id over LUA_UNPACK_LIMIT
    # values) for its packed dead letter.
    if consumer in alive:
        status = "alive"
    elif deliveries >= s.max_deliveries:
        status = "poison"
    elif entries and 2 * len(entries[0][1]) + 2 > LUA_UNPACK_LIMIT:
        status = "wide"
    else:
        status = "moved"
    found = Reclaimed(
        entry_id,
        record_id,
        consumer,
        int(row["time_since_delivered"]) / 1000,
        deliveries,
        status,
        lock_released=owned and status == "moved",
    )
    return found, value if owned and value else ""


class ReprocessError(PhoenixError):
    """The record cannot be reprocessed now; the message says why and what to do."""


@dataclass(frozen=True)
class ReprocessPlan:
    """What reprocess would do, for the confirmation question."""

    record_id: str
    source: str  # "input" or "dlq"
    source_entry_id: str
    fields: dict[str, str]
    record_key: str
    committed_by: str | None


async def plan_reprocess(
    client: Redis, settings: WorkerSettings, record_id: str, scan_limit: int = DEFAULT_SCAN_LIMIT
) -> ReprocessPlan:
    """The record's newest entry, in the input stream or the DLQ (where it is newer when the record was
    dead-lettered last), gives the new entry's fields."""
    lane = settings.keys.lane_of(record_id)  # the record's partition: the stage itself when it has one
    found = []
    for name, stream in (("input", lane.input), ("dlq", lane.dlq)):
        async for entry_id, fields in entries_of(client, stream, record_id, scan_limit):
            found.append((id_order(entry_id), name, entry_id, fields))
            break
    if not found:
        raise ReprocessError(
            f"no entry of record {record_id} in the newest {scan_limit} entries of "
            f"{lane.input} or {lane.dlq}: add it with `phoenix enqueue`"
        )
    _, name, entry_id, fields = max(found, key=lambda f: f[0])
    if PACKED_FIELDS in fields or len(fields) > SCRIPT_SAFE_FIELDS:
        width = f"its fields are packed in {PACKED_FIELDS}" if PACKED_FIELDS in fields else f"{len(fields)} fields"
        raise ReprocessError(
            f"entry {entry_id} of record {record_id} is too wide to reprocess ({width}; the runtime's scripts write "
            f"at most {SCRIPT_SAFE_FIELDS}): fix what produced it and add the record anew with `phoenix enqueue`"
        )
    kept = {k: v for k, v in fields.items() if k not in _DROPPED_ON_REPROCESS}
    kept.setdefault("original_id", fields.get("original_id", entry_id))
    record_key = lane.record(record_id)
    return ReprocessPlan(
        record_id, name, entry_id, kept, record_key, committed_by(await _record_state(client, record_key))
    )


async def reprocess(client: Redis, settings: WorkerSettings, plan: ReprocessPlan) -> tuple[str, bool]:
    """Carry out the plan atomically; returns (new entry id, whether a marker was deleted)."""
    lane = settings.keys.lane_of(plan.record_id)
    script = lua.register(client, "repair_reprocess.lua", __package__)
    flat = [item for pair in plan.fields.items() for item in pair]
    reply = await script(
        keys=[plan.record_key, lane.input, lane.dlq],
        args=[DONE, plan.source_entry_id if plan.source == "dlq" else "", *flat],
    )
    if text(reply[0]) == "locked":
        raise ReprocessError(
            f"record {plan.record_id} is locked (being processed): wait, or release a stale lock with `phoenix unlock`"
        )
    return text(reply[1]), bool(reply[2])
