"""Streams shrink as work finishes: a stage trims its input up to what every consumer group acknowledged.

Forwards never trim (an XADD with MAXLEN cut unread entries of a slow or stopped stage); memory is bounded by
backpressure instead (backpressure.py). This runs in the background every TRIM_INTERVAL, not per message.
"""

from __future__ import annotations

import structlog
from redis.asyncio import Redis

from phoenix.keys import dlq_trimmed_key
from phoenix.worker_runtime import lua, metrics
from phoenix.worker_runtime.settings import WorkerSettings

log = structlog.get_logger("phoenix.trim")


class Trimmer:
    def __init__(self, client: Redis, settings: WorkerSettings) -> None:
        self._script = lua.register(client, "trim.lua")
        s = settings
        self._keys = [s.input_queue, s.dlq_name, dlq_trimmed_key(s.dlq_name)]
        self._args = [s.dlq_maxlen]
        self._dlq_maxlen = s.dlq_maxlen
        self._m_dlq_trimmed = metrics.DLQ_TRIMMED.labels(s.service_name)

    async def trim(self) -> None:
        _, dlq_trimmed = await self._script(keys=self._keys, args=self._args)
        if dlq_trimmed:
            self._m_dlq_trimmed.inc(dlq_trimmed)
            # Evidence is being discarded: say so every time, with how much.
            log.warning("dlq_trimmed", count=dlq_trimmed, dlq_maxlen=self._dlq_maxlen)
