"""Exponential backoff, held durably in Redis: failed messages wait in a sorted set, not in memory."""

from __future__ import annotations

import json

from redis.asyncio import Redis

from phoenix import lua
from phoenix.backoff import delay
from phoenix.record_format import LUA_UNPACK_LIMIT, PACKED_FIELDS
from phoenix.worker_runtime.messages import Message, retry_fields
from phoenix.worker_runtime.settings import WorkerSettings


def retry_member(message: Message, first_failed_at: float, error: str, settings: WorkerSettings) -> tuple[int, str]:
    """(delay in ms, retry-set member) for settle.lua's R action; known secrets are masked out of `error`
    (messages.failure_history). The delay is RETRY_BASE_SECONDS x 2^retries so far, at most RETRY_MAX_SECONDS."""
    wait = delay(message.retry_count, settings.retry_base_seconds, settings.retry_max_seconds)
    return int(wait * 1000), json.dumps(retry_fields(message, first_failed_at, error))


class RetryScheduler:
    """Moves due retries back into the input stream; every worker of a stage runs it, the script is atomic."""

    _BATCH = 500

    def __init__(self, client: Redis, settings: WorkerSettings) -> None:
        self._settings = settings
        self._promote = lua.register(client, "retry_promote.lua", __package__)

    async def promote_due(self) -> int:
        """Every lane's due retries, each into its own lane's input (one script call per lane and batch)."""
        moved = 0
        for lane in self._settings.keys.lanes:
            while True:
                n = await self._promote(
                    keys=[lane.retry, lane.input], args=[self._BATCH, LUA_UNPACK_LIMIT, PACKED_FIELDS]
                )
                moved += n
                if n < self._BATCH:
                    break
        return moved
