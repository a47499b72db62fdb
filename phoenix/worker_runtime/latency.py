"""A final stage's end-to-end latency carried to the operator through Redis, which the operator reads instead of
Prometheus: every FLUSH_SECONDS, the counts phoenix_pipeline_latency_seconds's buckets gained since the last flush
go into the hash of the current window (keys.StageKeys.latency_window) with one script call (latency_flush.lua).
Nothing is added per record: the histogram already counts per bucket."""

from __future__ import annotations

import time

from prometheus_client.utils import floatToGoString
from redis.asyncio import Redis

from phoenix import lua
from phoenix.keys import LATENCY_WINDOW_SECONDS, LATENCY_WINDOWS, StageKeys
from phoenix.worker_runtime.metrics import StageHistogramChild

# At most this old are the counts of a window when the operator reads it (a flush may land in the next window).
FLUSH_SECONDS = 5.0
# A window's hash outlives the last read of it by one window.
KEEP_SECONDS = LATENCY_WINDOW_SECONDS * (LATENCY_WINDOWS + 1)


class LatencyWindows:
    """The counts of one stage's latency histogram not yet written to Redis (the histogram's minus those flushed)."""

    def __init__(self, client: Redis, keys: StageKeys, histogram: StageHistogramChild) -> None:
        self._script = lua.register(client, "latency_flush.lua", __package__)
        self._keys = keys
        self._histogram = histogram
        self._fields = [floatToGoString(bound) for bound in histogram.bounds]  # the `le` labels of /metrics
        # The histogram is the process's (a worker before this one in the process may have counted in it).
        self._flushed = list(histogram.counts)

    async def flush(self) -> None:
        """Write the counts added since the last flush; after a failure they go with the next one."""
        counts = list(self._histogram.counts)
        args: list[str | int] = [KEEP_SECONDS]
        for field, now, before in zip(self._fields, counts, self._flushed, strict=True):
            if now > before:
                args += (field, now - before)
        if len(args) == 1:
            return
        await self._script(keys=[self._keys.latency_window(time.time())], args=args)
        self._flushed = counts
