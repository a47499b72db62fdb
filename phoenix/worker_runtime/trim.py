"""Streams shrink as work finishes: a stage trims its input up to what every consumer group acknowledged.

Forwards never trim (an XADD with MAXLEN cut unread entries of a slow or stopped stage); memory is bounded by
backpressure instead (backpressure.py). This runs in the background every TRIM_INTERVAL, not per message.
The same script tells whether any consumer group reads the stage's output: one that none reads is never
trimmed by acknowledgements, so it is reported (a line when that starts, a warning without OUTPUT_RETENTION, the
phoenix_output_unread gauge) and kept to OUTPUT_RETENTION when the owner chose one.
"""

from __future__ import annotations

from collections.abc import Sequence

import structlog
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from phoenix import lua
from phoenix.worker_runtime import metrics
from phoenix.worker_runtime.lanes import Output, Route
from phoenix.worker_runtime.settings import WorkerSettings

log = structlog.get_logger("phoenix.trim")


class Trimmer:
    """Applies OUTPUT_RETENTION to the stage's output: trims what every group has read, never more."""

    def __init__(self, client: Redis, settings: WorkerSettings, routes: Sequence[Route]) -> None:
        """One trim.lua call per lane of `routes`, each with the lane's keys only (one slot): the output is given
        to a lane's call when its commits forward to it in the lane's own script (to the outbox: the relay
        deletes what it moved)."""
        self._script = lua.register(client, "trim.lua", __package__)
        self._client = client
        s = settings
        self._calls = [
            [r.keys.input, r.keys.dlq, r.keys.dlq_trimmed, *([r.forward] if r.forward and not r.relayed else [])]
            for r in routes
        ]
        self._args: list[str | int] = [s.dlq_maxlen, "", 0]
        self._retention = s.retention
        if self._retention is not None:
            self._args[1:] = self._retention.script_args()
        self._outputs = Output.of(s).streams
        self._output = s.output_queue
        self._high_water = s.output_high_water
        self._dlq_maxlen = s.dlq_maxlen
        # None until the first trim has looked: then whether no consumer group reads the output.
        self.output_unread: bool | None = None
        self._m_dlq_trimmed = metrics.DLQ_TRIMMED.labels(s.service_name)
        self._m_unread = metrics.OUTPUT_UNREAD.labels(s.service_name)
        self._m_retention_trimmed = metrics.OUTPUT_RETENTION_TRIMMED.labels(s.service_name)

    async def trim(self) -> None:
        dlq_trimmed = output_trimmed = 0
        unread: bool | None = None  # only a call given the output tells
        for keys in self._calls:
            _, dlq_count, output_unread, output_count = await self._script(keys=keys, args=self._args)
            dlq_trimmed += dlq_count
            output_trimmed += output_count
            if len(keys) == 4:
                unread = bool(unread) or bool(output_unread)
        if dlq_trimmed:
            self._m_dlq_trimmed.inc(dlq_trimmed)
            # Evidence is being discarded: say so every time, with how much.
            log.warning("dlq_trimmed", count=dlq_trimmed, dlq_maxlen=self._dlq_maxlen)
        if output_trimmed:
            self._m_retention_trimmed.inc(output_trimmed)
        if self._output and unread is not None and unread != self.output_unread:
            self._note_unread(unread)

    async def look_at_output(self) -> None:
        """Whether a consumer group reads the output, trimming nothing: the start-up line. A start must not trim
        ahead of TRIM_INTERVAL (a stage may keep what it acknowledged on purpose, for a long interval)."""
        if not self._output:
            return
        unread = False
        for stream in self._outputs:  # each partition of the next stage: unread when any is
            try:
                groups = await self._client.xinfo_groups(stream)
            except ResponseError:  # no stream yet: nobody reads it, as trim.lua counts it
                groups = []
            unread = unread or not groups
        self._note_unread(unread)

    def _note_unread(self, unread: bool) -> None:
        """Log when the output starts or stops being read by a consumer group (a group may come later)."""
        first = self.output_unread is None
        self.output_unread = unread
        self._m_unread.set(int(unread))
        if unread and self._retention is not None:
            # The owner chose what such a stream keeps: worth a line, not a warning.
            log.info("output_unread", output=self._output, retention=self._retention.text)
        elif unread:
            # Without a retention nothing ever shrinks it: the stage will stop at the high-water mark for good.
            log.warning(
                "output_unread",
                output=self._output,
                retention=None,
                high_water=self._high_water,
                hint="no consumer group reads it, so it is never trimmed and the stage pauses at "
                "OUTPUT_HIGH_WATER; set OUTPUT_RETENTION (maxlen:N or age:7d) for a stream read with XREAD",
            )
        elif not first:
            log.info("output_read", output=self._output)
