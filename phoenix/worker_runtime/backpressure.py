"""Backpressure: a stage whose output holds too many unfinished entries stops reading until it drains.

A background job measures the output streams every BACKPRESSURE_INTERVAL (one round trip each); between two
measurements the worker adds what it forwarded itself, so it stops close to OUTPUT_HIGH_WATER even at tens of
thousands of messages a second. The intake loop only looks at flags. In-flight work still commits.
The pause is per partition where the output is: when each lane's results go to one partition of the next stage
(K -> K), lane p counts partition p of the output (and its own outbox) against its share of the mark,
OUTPUT_HIGH_WATER / K, and pauses alone, so one slow partition downstream holds back only the lane that feeds it.
Otherwise (one output stream, or results spread over another partition count) the lanes share one count, the
whole output and every outbox, against the whole mark.
While paused, a lane publishes the figure at its `StageKeys.backpressure` (with a TTL, so a dead worker's report
vanishes), which the operator shows as the Backpressure condition.
An output that no consumer group reads is the exception: nothing ever finishes its entries, so with
OUTPUT_RETENTION set they do not count (the retention bounds the stream, trim.py); without it they all do, and the
stage pauses at the high-water mark until a group reads the stream (the Trimmer warns about it).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis

from phoenix.worker_runtime import metrics
from phoenix.worker_runtime.lanes import Output, Route
from phoenix.worker_runtime.settings import WorkerSettings

log = structlog.get_logger("phoenix.backpressure")

# A report outlives a few missed measurements, not a dead worker.
_REPORT_TTL_INTERVALS = 5
_MIN_REPORT_TTL_SECONDS = 5


async def unfinished_entries(client: Redis, stream: str, *, retained: bool = False) -> int | None:
    """Entries of `stream` its slowest consumer group has not acknowledged; while it has no group, all of them,
    or None when `retained`: a retention, not a reader, bounds it then."""
    pipe = client.pipeline(transaction=False)
    pipe.xlen(stream)
    pipe.xinfo_groups(stream)
    length, groups = await pipe.execute(raise_on_error=False)
    if not isinstance(groups, list) or not groups:
        if retained:
            return None
        return length if isinstance(length, int) else 0
    if not isinstance(length, int) or not length:
        return 0
    # Lag is unknown after XDEL in the unread range; the length is then the bound (trimming keeps only the rest).
    return max(length if g.get("lag") is None else int(g["lag"]) + int(g["pending"]) for g in groups)


@dataclass(eq=False)
class _Gauge:
    """The lanes that fill the same output streams, paused and resumed together against their share of the marks."""

    name: str  # for the log: OUTPUT_QUEUE, or the one partition of it these lanes feed
    lanes: tuple[int, ...]  # indexes in the stage's routes
    streams: tuple[str, ...]  # where their results wait for the next stage
    outboxes: tuple[str, ...]  # where their relayed results wait for the relay: always counted
    report_keys: tuple[str, ...]
    high: int
    low: int
    # True while the streams are bounded by OUTPUT_RETENTION rather than read: forwards then count for nothing.
    uncounted: bool
    measured: int = 0
    forwarded_since: int = 0
    paused: bool = False


def _gauges(settings: WorkerSettings, routes: Sequence[Route]) -> tuple[_Gauge, ...]:
    """One gauge per output stream when each lane forwards to a partition of its own, else one for the stage; one
    for a stage of named outputs, over every stream of them all (what the stage feeds, wherever it routes)."""
    s, output = settings, Output.of(settings)
    if s.outputs:
        streams = tuple(stream for named in Output.named(s.outputs).values() for stream in named.streams)
        gauge = _Gauge(
            name=", ".join(s.outputs),
            lanes=tuple(range(len(routes))),
            streams=streams,
            outboxes=tuple(r.keys.outbox for r in routes if r.relayed),
            report_keys=tuple(r.keys.backpressure for r in routes),
            high=s.output_high_water,
            low=max(1, s.output_low_water or 0),
            uncounted=False,
        )
        return (gauge,)
    everything = output.streams
    by_target: dict[str | None, list[int]] = {}
    for index, route in enumerate(routes):
        by_target.setdefault(output.target_of_lane(route.keys), []).append(index)
    gauges = []
    for target, members in by_target.items():
        streams = (target,) if target else everything
        share = len(streams) / len(everything) if everything else 1.0
        gauges.append(
            _Gauge(
                name=target or s.output_queue,
                lanes=tuple(members),
                streams=streams,
                outboxes=tuple(routes[i].keys.outbox for i in members if routes[i].relayed),
                report_keys=tuple(routes[i].keys.backpressure for i in members),
                high=math.ceil(s.output_high_water * share),
                # At least 1: "below 0" would never resume (a small mark, or its share of K partitions).
                low=max(1, math.floor((s.output_low_water or 0) * share)),
                uncounted=bool(s.output_retention),  # assumed until the first measurement tells
            )
        )
    return tuple(gauges)


class Backpressure:
    """Holds a lane's intake back while what it feeds is over OUTPUT_HIGH_WATER, until below the low mark."""

    def __init__(self, client: Redis, settings: WorkerSettings, routes: Sequence[Route]) -> None:
        """Measures every stream the stage's results wait in: the output (each partition of a partitioned next
        stage) and the outbox of each relayed lane of `routes`."""
        s = settings
        self._client = client
        self._retained = bool(s.output_retention)
        self._gauges = _gauges(s, routes)
        self._gauge_of_lane = {lane: gauge for gauge in self._gauges for lane in gauge.lanes}
        self._report_ttl = max(_MIN_REPORT_TTL_SECONDS, round(_REPORT_TTL_INTERVALS * s.backpressure_interval))
        self.enabled = bool((s.output_queue or s.outputs) and s.output_high_water)
        self._resumed = asyncio.Event()
        self._m_paused = metrics.BACKPRESSURE.labels(s.service_name)
        self._m_unfinished = metrics.OUTPUT_UNFINISHED.labels(s.service_name)
        self._m_paused.set(0)

    def holds(self, lane: int) -> bool:
        """The lane reads nothing new: what it feeds is over its mark."""
        return self._gauge_of_lane[lane].paused

    @property
    def holds_all(self) -> bool:
        return all(gauge.paused for gauge in self._gauges)

    def note_forwarded(self, lane: int, count: int) -> None:
        """Entries the lane just added to the output: counted until the next measurement sees them."""
        gauge = self._gauge_of_lane[lane]
        gauge.forwarded_since += count
        if not self.enabled or gauge.uncounted or gauge.paused:
            return
        if gauge.measured + gauge.forwarded_since >= gauge.high:
            self._pause(gauge, gauge.measured + gauge.forwarded_since)

    async def wait_resumed(self, timeout: float) -> None:
        """Wait until a lane reads again (the intake loop, while every lane is held)."""
        if self.holds_all:
            self._resumed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resumed.wait(), timeout)

    async def measure(self) -> None:
        """The background job: measure, pause or resume each gauge, and refresh the reports of the paused ones."""
        for gauge in self._gauges:
            await self._measure(gauge)
        self._m_unfinished.set(sum(gauge.measured for gauge in self._gauges))
        self._m_paused.set(int(any(gauge.paused for gauge in self._gauges)))

    async def _measure(self, gauge: _Gauge) -> None:
        # Forwards noted before the measurement are committed, hence in it; those noted meanwhile may not be.
        counted = gauge.forwarded_since
        client = self._client
        measured = [await unfinished_entries(client, stream, retained=self._retained) for stream in gauge.streams]
        # An outbox always counts: what it holds is not yet where it goes.
        outboxes = [await unfinished_entries(client, outbox) or 0 for outbox in gauge.outboxes]
        gauge.uncounted = all(m is None for m in measured)
        unfinished = sum(m or 0 for m in measured) + sum(outboxes)
        gauge.measured = unfinished
        gauge.forwarded_since -= counted
        if gauge.paused and unfinished < gauge.low:
            gauge.paused = False
            self._resumed.set()
            for key in gauge.report_keys:
                await client.delete(key)
            log.info("backpressure_resumed", output=gauge.name, unfinished=unfinished, low_water=gauge.low)
        elif not gauge.paused and unfinished >= gauge.high:
            self._pause(gauge, unfinished)
        if gauge.paused:
            for key in gauge.report_keys:
                await client.set(key, unfinished, ex=self._report_ttl)

    def _pause(self, gauge: _Gauge, unfinished: int) -> None:
        gauge.paused = True
        self._m_paused.set(1)
        log.warning(
            "backpressure_paused",
            output=gauge.name,
            unfinished=unfinished,
            high_water=gauge.high,
            low_water=gauge.low,
        )
