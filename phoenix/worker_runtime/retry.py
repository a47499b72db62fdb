"""Exponential backoff, held durably in Redis: failed messages wait in a sorted set, not in memory."""

from __future__ import annotations

import json

from redis.asyncio import Redis

from phoenix.worker_runtime import lua
from phoenix.worker_runtime.messages import Message, retry_fields
from phoenix.worker_runtime.scrub import scrub
from phoenix.worker_runtime.settings import WorkerSettings


def backoff_seconds(attempt: int, base: float, cap: float) -> float:
    """The original design's delay: min(2^attempt x base, cap); attempt 0 is the first retry."""
    return min(2 ** min(attempt, 62) * base, cap)


def retry_member(message: Message, first_failed_at: float, error: str, settings: WorkerSettings) -> tuple[int, str]:
    """(delay in ms, retry-set member) for settle.lua's R action; known secrets are masked out of `error`."""
    delay = backoff_seconds(message.retry_count, settings.retry_base_seconds, settings.retry_max_seconds)
    return int(delay * 1000), json.dumps(retry_fields(message, first_failed_at, scrub(error)))


def retry_member_fields(member: str | bytes) -> dict[str, str]:
    """The fields of a message waiting in the retry set, as retry_member stored them."""
    pairs = json.loads(member)
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


class RetryScheduler:
    """Moves due retries back into the input stream; every worker of a stage runs it, the script is atomic."""

    _BATCH = 500

    def __init__(self, client: Redis, settings: WorkerSettings) -> None:
        self._settings = settings
        self._promote = lua.register(client, "retry_promote.lua")

    async def promote_due(self) -> int:
        s = self._settings
        moved = 0
        while True:
            n = await self._promote(keys=[s.retry_queue, s.input_queue], args=[self._BATCH])
            moved += n
            if n < self._BATCH:
                return moved
