"""The queue dashboard: length, pending, lag, oldest pending, DLQ, consumers per stage,
plus the age of the oldest unfinished entry (the first undelivered one or the oldest pending one), and whether
any consumer group reads the stage's output.

Used by `phoenix status`, the demo and the operator's status refresh; all stages go out in one pipeline, and a
second one asks the stream's ids of the stages that have a backlog or pending entries: their first undelivered
entry, and the checks of Redis's lag and oldest pending entry, which XDEL and XTRIM make wrong (_cross_check).
A stage of several partitions is read lane by lane (collect_lanes) and summed (collect): what waits, is pending or
dead-lettered in any lane.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from phoenix import lua
from phoenix.keys import LATENCY_WINDOWS, StageKeys
from phoenix.redis_replies import text
from phoenix.tools.latency import Buckets, merged, parse_hash


@dataclass(frozen=True, slots=True)
class QueueStats:
    length: int
    pending: int
    lag: int | None  # None when Redis cannot tell (entries deleted in the unread range)
    oldest_pending_seconds: float | None
    dlq_length: int
    consumers: int
    group_exists: bool
    # Age of the first entry not yet delivered to any worker (None: nothing waits).
    oldest_undelivered_seconds: float | None = None
    read: int | None = None  # entries the group has read ever (entries-read): unlike LENGTH, not cut by trimming
    dlq_trimmed: int = 0  # dead letters DLQ_MAXLEN has removed, ever
    throttled: int = 0  # records the stage's rate limits hold back in the retry set now (of the stage as a whole)
    backpressure: int | None = None  # while the stage is paused: its output's unfinished entries, as reported
    # True while no consumer group reads the output stream (it is missing, or has none); None: no output asked.
    output_unread: bool | None = None
    # What the stream's ids say against Redis's counters (after XDEL/XTRIM): (reason, message) each.
    disagreements: tuple[tuple[str, str], ...] = ()
    # A final stage's end-to-end latencies of the last windows (keys.LATENCY_WINDOWS), merged (tools/latency.py).
    latency: Buckets = field(default_factory=dict)

    @property
    def oldest_unfinished_seconds(self) -> float | None:
        """Age of the oldest entry not yet finished, delivered or not: what a person waiting for it feels."""
        ages = [age for age in (self.oldest_pending_seconds, self.oldest_undelivered_seconds) if age is not None]
        return max(ages, default=None)

    def as_status(self) -> dict[str, int | float | None]:
        """camelCase, as in the PhoenixStage status."""
        return {
            "length": self.length,
            "pending": self.pending,
            "lag": self.lag,
            "oldestPendingSeconds": self.oldest_pending_seconds,
            "oldestUndeliveredSeconds": self.oldest_undelivered_seconds,
            "oldestUnfinishedSeconds": self.oldest_unfinished_seconds,
            "dlqLength": self.dlq_length,
            "consumers": self.consumers,
            "dlqTrimmed": self.dlq_trimmed,
            "throttled": self.throttled,
        }


# The reasons of `disagreements` (the operator's QueueFiguresDisagree condition).
LAG_UNKNOWN, LAG_WRONG, PENDING_DELETED = "LagUnknown", "LagWrong", "PendingDeleted"

# The window a stage's rate is measured over (the demo's table, `phoenix ui`).
RATE_WINDOW_SECONDS = 2.0


def acknowledged(stats: QueueStats) -> int | None:
    """Entries of the input stream the group has read and acknowledged: ENTRIES-READ - PENDING.

    The group's read counter, unlike the stream's length, is not cut when workers trim finished entries. Redis
    leaves it unset until the group's first read; nothing can have been trimmed before that, so LENGTH - LAG -
    PENDING is exact then. An entry sent back for a retry counts once per attempt. None when Redis cannot tell.
    """
    if stats.read is not None:
        return stats.read - stats.pending
    if stats.lag is None:
        return None
    return stats.length - stats.lag - stats.pending


@dataclass
class RateMeter:
    """Acknowledgements per second of each stage, from the `done` counts of recent snapshots."""

    history: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)

    def rate(self, name: str, now: float, done: int | None) -> float:
        samples = self.history.setdefault(name, deque())
        if done is None:
            return 0.0
        samples.append((now, done))
        while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_SECONDS:
            samples.popleft()
        (t0, d0) = samples[0]
        return (done - d0) / (now - t0) if now > t0 else 0.0


_COMMANDS_PER_STAGE = 7  # one more for a stage with an output, LATENCY_WINDOWS more for one that may be final


class _Extra(TypedDict):
    """What is read beside the stream and its group, so known whether the group exists or not."""

    dlq_trimmed: int
    throttled: int
    backpressure: int | None
    output_unread: bool | None
    latency: Buckets


async def collect(client: Redis, stages: Sequence[StageKeys]) -> list[QueueStats]:
    """Each stage's figures, summed over its lanes; at most two round trips for any number of stages."""
    return [summed(lanes) for lanes in await collect_lanes(client, stages)]


async def collect_lanes(client: Redis, stages: Sequence[StageKeys]) -> list[list[QueueStats]]:
    """Each stage's figures per lane (one for a stage of one partition), in partition order."""
    lanes = [lane for st in stages for lane in st.lanes]
    # The output is the stage's as a whole: asked once, of its first lane.
    stats = await _collect(client, [replace(lane, output=None) if lane.partition else lane for lane in lanes])
    out, at = [], 0
    for st in stages:
        out.append(stats[at : at + st.partitions])
        at += st.partitions
    return out


def summed(lanes: Sequence[QueueStats]) -> QueueStats:
    """One stage's figures from its lanes': counts added, ages the oldest, consumers the most in any lane (every
    worker reads every lane), unknown (None) when any lane's is."""
    if len(lanes) == 1:
        return lanes[0]

    def total(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    def oldest(values: list[float | None]) -> float | None:
        return max((v for v in values if v is not None), default=None)

    paused = [lane.backpressure for lane in lanes if lane.backpressure is not None]
    return QueueStats(
        length=sum(lane.length for lane in lanes),
        pending=sum(lane.pending for lane in lanes),
        lag=total([lane.lag for lane in lanes]),
        oldest_pending_seconds=oldest([lane.oldest_pending_seconds for lane in lanes]),
        dlq_length=sum(lane.dlq_length for lane in lanes),
        consumers=max(lane.consumers for lane in lanes),
        group_exists=all(lane.group_exists for lane in lanes),
        oldest_undelivered_seconds=oldest([lane.oldest_undelivered_seconds for lane in lanes]),
        read=total([lane.read for lane in lanes]),
        dlq_trimmed=sum(lane.dlq_trimmed for lane in lanes),
        throttled=lanes[0].throttled,  # one held set for the stage, read with each lane
        backpressure=max(paused) if paused else None,
        output_unread=lanes[0].output_unread,
        latency=lanes[0].latency,  # of the stage as a whole, read with its first lane
        disagreements=tuple(note for lane in lanes for note in lane.disagreements),
    )


async def _collect(client: Redis, stages: Sequence[StageKeys]) -> list[QueueStats]:
    """At most two round trips for any number of stages (lanes); a missing stream or group reads as empty."""
    pipe = client.pipeline(transaction=False)
    now = time.time()
    for st in stages:
        pipe.xlen(st.input)
        pipe.xinfo_groups(st.input)
        pipe.xpending(st.input, st.consumer_group)
        pipe.xlen(st.dlq)
        pipe.get(st.dlq_trimmed)
        # Held back now: due later than now (the set keeps records past due until the next limiter call).
        pipe.zcount(st.held, now * 1000, "+inf")
        pipe.get(st.backpressure)
        if st.output is not None:
            pipe.xinfo_groups(st.output)
        if _may_be_final(st):
            for window in st.latency_windows(now):
                pipe.hgetall(window)
    replies = await pipe.execute(raise_on_error=False)
    now_ms = now * 1000
    out = []
    # Stages whose figures the ids are to check (_cross_check).
    checks: list[int] = []
    at = 0
    for i, st in enumerate(stages):
        count = _COMMANDS_PER_STAGE + (st.output is not None)
        length, groups, pending, dlq_length, dlq_trimmed, throttled, paused, *output_groups = replies[at : at + count]
        at += count
        windows = replies[at : at + LATENCY_WINDOWS] if _may_be_final(st) else []
        at += len(windows)
        extra: _Extra = {
            "dlq_trimmed": _int(dlq_trimmed),
            "throttled": _int(throttled),
            "backpressure": None if paused is None else _int(paused),
            "output_unread": _unread(output_groups[0]) if output_groups else None,
            "latency": merged(parse_hash(window) for window in windows if isinstance(window, dict)),
        }
        group = _find_group(groups, st.consumer_group)
        if group is None or isinstance(pending, ResponseError):
            out.append(QueueStats(_int(length), 0, _int(length), None, _int(dlq_length), 0, False, **extra))
            if _int(length):
                checks.append(i)  # no group: every entry is undelivered, the first one the oldest
            continue
        oldest = None
        if pending["pending"]:
            oldest = _age_seconds(text(pending["min"]), now_ms)
        lag, read = group.get("lag"), group.get("entries-read")
        # A lag of 0 with nothing pending is trusted: the cross-check costs a round trip, asked only where something
        # waits or is pending.
        if lag is None or lag > 0 or pending["pending"]:
            checks.append(i)
        out.append(
            QueueStats(
                length=_int(length),
                pending=int(pending["pending"]),
                lag=None if lag is None else int(lag),
                oldest_pending_seconds=oldest,
                dlq_length=_int(dlq_length),
                consumers=int(group["consumers"]),
                group_exists=True,
                read=None if read is None else int(read),
                **extra,
            )
        )
    if checks:
        await _cross_check(client, stages, out, checks, now_ms)
    return out


# Pending entries counted below the stream's first entry, at most: how many trimmed ones a condition names.
GHOSTS_COUNTED = 100


async def _cross_check(
    client: Redis, stages: Sequence[StageKeys], out: list[QueueStats], checks: Sequence[int], now_ms: float
) -> None:
    """The backlog and the ages from the stream's ids, against XINFO's lag and XPENDING's oldest entry, which are
    wrong after XDEL and XTRIM: lag null (an entry deleted after the last-delivered id) or counting entries trimmed
    before delivery, the oldest pending entry deleted from the stream. Corrects what the ids tell exactly and says
    in `disagreements` what disagreed. One round trip: queue_check.lua per stage with a group (one atomic look at
    the figures and the ids), the first entry of one without (all its entries are undelivered)."""
    script = lua.register(client, "queue_check.lua", __package__)
    for attempt in range(2):
        # EVALSHA queued plainly (a cluster's pipeline refuses scripts); the script is loaded where it is missing,
        # then asked again, once.
        pipe = client.pipeline(transaction=False)
        for i in checks:
            st = stages[i]
            if out[i].group_exists:
                pipe.execute_command("EVALSHA", script.sha, 1, st.input, st.consumer_group, GHOSTS_COUNTED)
            else:
                pipe.xrange(st.input, count=1)
        replies = await pipe.execute(raise_on_error=False)
        if attempt or not any(isinstance(reply, NoScriptError) for reply in replies):
            break
        await client.script_load(script.script)
    for i, reply in zip(checks, replies, strict=True):
        if not out[i].group_exists:
            first = _first_id(reply)
            age = None if first is None else _age_seconds(first, now_ms)
            out[i] = dataclasses.replace(out[i], oldest_undelivered_seconds=age)
        elif isinstance(reply, list) and reply:  # else the stream or group went since the first round trip
            out[i] = _checked(out[i], stages[i].partition, [text(value) for value in reply], now_ms)


def _checked(stats: QueueStats, partition: int | None, look: list[str], now_ms: float) -> QueueStats:
    """`stats` with the figures of queue_check.lua's look, corrected from the ids, and what disagreed: the backlog is
    0 with no entry after the last-delivered id, the stream's length when its first entry is undelivered, else
    XINFO's lag (unknown when null); the oldest pending entry is the oldest still in the stream."""
    length, lag, head, undelivered, pending, oldest, gone = look
    reported = None if lag == "-1" else int(lag)
    exact = 0 if not undelivered else int(length) if undelivered == head else None
    stats = dataclasses.replace(
        stats,
        length=int(length),
        pending=int(pending),
        lag=reported if exact is None else exact,
        oldest_pending_seconds=_age_seconds(oldest, now_ms) if oldest else None,
        oldest_undelivered_seconds=_age_seconds(undelivered, now_ms) if undelivered else None,
    )
    shown = "null" if reported is None else str(reported)
    if exact is not None and exact != reported:
        why = (
            "no entry is left after the group's last-delivered id"
            if exact == 0
            else f"every one of the stream's {length} entries is after the group's last-delivered id"
        )
        message = (
            f"XINFO GROUPS reports lag {shown} but {why} (entries deleted or trimmed before delivery): BACKLOG "
            f"shows {exact}; KEDA scales on Redis's figure"
        )
        stats = _noted(stats, partition, LAG_WRONG if reported is not None else LAG_UNKNOWN, message)
    elif reported is None:
        message = (
            "XINFO GROUPS reports lag null (an entry was deleted after the group's last-delivered id): BACKLOG is "
            f"unknown, at most the stream's {length} entries; OLDEST is read from the first undelivered entry"
        )
        stats = _noted(stats, partition, LAG_UNKNOWN, message)
    if int(gone):
        more = "at least " if int(gone) >= GHOSTS_COUNTED else ""
        message = (
            f"{more}{gone} pending entries are no longer in the stream (deleted or trimmed before they were "
            "acknowledged): their age is left out of OLDEST; a worker's XAUTOCLAIM clears them from the group"
        )
        stats = _noted(stats, partition, PENDING_DELETED, message)
    return stats


def _noted(stats: QueueStats, partition: int | None, reason: str, message: str) -> QueueStats:
    """`stats` with the disagreement (reason, message), the message naming the lane's partition."""
    where = "" if partition is None else f"partition {partition}: "
    return dataclasses.replace(stats, disagreements=(*stats.disagreements, (reason, where + message)))


def _first_id(reply: object) -> str | None:
    """The id of an XRANGE reply's first entry; None when it has none (or is an error: no stream)."""
    return text(reply[0][0]) if isinstance(reply, list) and reply else None


def _may_be_final(st: StageKeys) -> bool:
    """Whether the stage's workers may write latency windows: its first lane (collect_lanes asks the others with no
    output) of a stage of no single output (named outputs do not show in StageKeys)."""
    return not st.partition and st.output is None


def _age_seconds(entry_id: str, now_ms: float) -> float:
    """Seconds since an entry was added, from the millisecond time in its id."""
    return round(max(0.0, now_ms - int(entry_id.partition("-")[0])) / 1000, 1)


def _unread(groups: object) -> bool:
    """No consumer group in an XINFO GROUPS reply; an error is a missing stream, which no group reads either."""
    return not isinstance(groups, list) or not groups


def _find_group(groups: object, name: str) -> dict | None:
    if not isinstance(groups, list):
        return None  # ResponseError: no such stream
    for g in groups:
        if text(g["name"]) == name:
            return g
    return None


def _int(value: object) -> int:
    """Replies as numbers; counters read with GET come as text. An error or a missing key reads as 0."""
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, (str, bytes)) and value.isdigit() else 0
