"""Backpressure: a stage whose output holds too many unfinished entries stops reading until it drains.

A background job measures the output stream every BACKPRESSURE_INTERVAL (one round trip); between two
measurements the worker adds what it forwarded itself, so it stops close to OUTPUT_HIGH_WATER even at tens of
thousands of messages a second. The intake loop only looks at a flag. In-flight work still commits.
While paused, the worker publishes the figure at `StageKeys.backpressure` (with a TTL, so a dead worker's
report vanishes), which the operator shows as the Backpressure condition.
An output that no consumer group reads is the exception: nothing ever finishes its entries, so with
OUTPUT_RETENTION set they do not count (the retention bounds the stream, trim.py); without it they all do, and the
stage pauses at the high-water mark until a group reads the stream (the Trimmer warns about it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

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


class Backpressure:
    def __init__(self, client: Redis, settings: WorkerSettings, routes: Sequence[Route]) -> None:
        """Measures every stream the stage's results wait in: the output (each partition of a partitioned next
        stage) and the outbox of each relayed lane of `routes`, summed against the marks."""
        s = settings
        self._client = client
        self._output = s.output_queue
        self._streams = Output.of(s).streams
        self._outboxes = tuple(r.keys.outbox for r in routes if r.relayed)
        self._retained = bool(s.output_retention)
        # True while the output is bounded by OUTPUT_RETENTION rather than read: forwards then count for nothing.
        # Assumed from the start when a retention is set, until the first measurement tells.
        self._uncounted = self._retained
        self._high = s.output_high_water
        self._low = s.output_low_water or 0
        # Each lane's report key (the operator reads any): the pause holds for the stage as a whole.
        self._report_keys = tuple(r.keys.backpressure for r in routes)
        self._report_ttl = max(_MIN_REPORT_TTL_SECONDS, round(_REPORT_TTL_INTERVALS * s.backpressure_interval))
        self.enabled = bool(s.output_queue and s.output_high_water)
        self._measured = 0
        self._forwarded_since = 0
        self.paused = False
        self._resumed = asyncio.Event()
        self._m_paused = metrics.BACKPRESSURE.labels(s.service_name)
        self._m_unfinished = metrics.OUTPUT_UNFINISHED.labels(s.service_name)
        self._m_paused.set(0)

    def note_forwarded(self, count: int) -> None:
        """Entries this worker just added to the output: counted until the next measurement sees them."""
        self._forwarded_since += count
        if (
            self.enabled
            and not self._uncounted
            and not self.paused
            and self._measured + self._forwarded_since >= self._high
        ):
            self._pause(self._measured + self._forwarded_since)

    async def wait_resumed(self, timeout: float) -> None:
        if self.paused:
            self._resumed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._resumed.wait(), timeout)

    async def measure(self) -> None:
        """The background job: measure, pause or resume, and refresh the report while paused."""
        # Forwards noted before the measurement are committed, hence in it; those noted meanwhile may not be.
        counted = self._forwarded_since
        measured = [await unfinished_entries(self._client, stream, retained=self._retained) for stream in self._streams]
        # An outbox always counts: what it holds is not yet where it goes.
        outboxes = [await unfinished_entries(self._client, outbox) or 0 for outbox in self._outboxes]
        self._uncounted = all(m is None for m in measured)
        unfinished = sum(m or 0 for m in measured) + sum(outboxes)
        self._measured = unfinished
        self._forwarded_since -= counted
        self._m_unfinished.set(unfinished)
        if self.paused and unfinished < self._low:
            self.paused = False
            self._m_paused.set(0)
            self._resumed.set()
            for key in self._report_keys:
                await self._client.delete(key)
            log.info("backpressure_resumed", output=self._output, unfinished=unfinished, low_water=self._low)
        elif not self.paused and unfinished >= self._high:
            self._pause(unfinished)
        if self.paused:
            for key in self._report_keys:
                await self._client.set(key, unfinished, ex=self._report_ttl)

    def _pause(self, unfinished: int) -> None:
        self.paused = True
        self._m_paused.set(1)
        log.warning(
            "backpressure_paused",
            output=self._output,
            unfinished=unfinished,
            high_water=self._high,
            low_water=self._low,
        )
