"""Streams shrink as work finishes: a stage trims its input up to what every consumer group acknowledged.

Forwards never trim (an XADD with MAXLEN cut unread entries of a slow or stopped stage); memory is bounded by
backpressure instead (backpressure.py). This runs in the background every TRIM_INTERVAL, not per message.
The same script tells whether any consumer group reads the stage's output: one that none reads is never
trimmed by acknowledgements, so it is reported (a line when that starts, a warning without OUTPUT_RETENTION, the
phoenix_output_unread gauge) and kept to OUTPUT_RETENTION when the owner chose one.
"""

from __future__ import annotations

import structlog
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from phoenix.worker_runtime import lua, metrics
from phoenix.worker_runtime.settings import WorkerSettings

log = structlog.get_logger("phoenix.trim")


class Trimmer:
    def __init__(self, client: Redis, settings: WorkerSettings) -> None:
        self._script = lua.register(client, "trim.lua")
        self._client = client
        s = settings
        self._keys = [s.input_queue, s.dlq_name, s.keys.dlq_trimmed]
        self._args: list[str | int] = [s.dlq_maxlen, "", 0]
        if s.output_queue:
            self._keys.append(s.output_queue)
        self._retention = s.retention
        if self._retention is not None:
            self._args[1:] = self._retention.script_args()
        self._output = s.output_queue
        self._high_water = s.output_high_water
        self._dlq_maxlen = s.dlq_maxlen
        # None until the first trim has looked: then whether no consumer group reads the output.
        self.output_unread: bool | None = None
        self._m_dlq_trimmed = metrics.DLQ_TRIMMED.labels(s.service_name)
        self._m_unread = metrics.OUTPUT_UNREAD.labels(s.service_name)
        self._m_retention_trimmed = metrics.OUTPUT_RETENTION_TRIMMED.labels(s.service_name)

    async def trim(self) -> None:
        _, dlq_trimmed, unread, output_trimmed = await self._script(keys=self._keys, args=self._args)
        if dlq_trimmed:
            self._m_dlq_trimmed.inc(dlq_trimmed)
            # Evidence is being discarded: say so every time, with how much.
            log.warning("dlq_trimmed", count=dlq_trimmed, dlq_maxlen=self._dlq_maxlen)
        if output_trimmed:
            self._m_retention_trimmed.inc(output_trimmed)
        if self._output and bool(unread) != self.output_unread:
            self._note_unread(bool(unread))

    async def look_at_output(self) -> None:
        """Whether a consumer group reads the output, trimming nothing: the start-up line. A start must not trim
        ahead of TRIM_INTERVAL (a stage may keep what it acknowledged on purpose, for a long interval)."""
        if not self._output:
            return
        try:
            groups = await self._client.xinfo_groups(self._output)
        except ResponseError:  # no stream yet: nobody reads it, as trim.lua counts it
            groups = []
        self._note_unread(not groups)

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
