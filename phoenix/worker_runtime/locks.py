"""Per-record locks with owner tokens, checked together with the idempotency marker in one round trip.

`lock:{service}:{record_id}` holds the owner's token while a worker processes the record;
`processed:{service}:{record_id}` (the idempotency marker) is written by the commit in settle.lua.
"""

from __future__ import annotations

import enum
import math
import uuid
from collections.abc import Sequence

from redis.asyncio import Redis

from phoenix.worker_runtime import lua
from phoenix.worker_runtime.messages import Message
from phoenix.worker_runtime.settings import WorkerSettings


class Claim(enum.IntEnum):
    ACQUIRED = 0
    DUPLICATE = 1  # marker present: already processed, acknowledged by the script
    LOCKED = 2  # another worker holds the lock: left pending, reclaim retries it later


def lock_token(consumer_name: str) -> str:
    """An owner token: the consumer name tells a person at 3 a.m. who holds a lock; the suffix makes it unique."""
    return f"{consumer_name}:{uuid.uuid4().hex[:12]}"


def lock_holder(token: str) -> str:
    """The consumer name inside an owner token made by lock_token."""
    return token.rpartition(":")[0]


class RecordLocks:
    def __init__(self, client: Redis, settings: WorkerSettings) -> None:
        self._settings = settings
        self.token = lock_token(settings.consumer_name)
        self._acquire = lua.register(client, "locks_acquire.lua")
        self._renew = lua.register(client, "locks_renew.lua")

    async def acquire(self, messages: Sequence[Message]) -> list[int]:
        s = self._settings
        args: list[str | int] = [
            s.consumer_group,
            self.token,
            math.ceil(s.lock_timeout),
            math.ceil(s.idempotency_ttl),
            s.lock_prefix,
            s.marker_prefix,
        ]
        for m in messages:
            args += (m.entry_id, m.record_id)
        return await self._acquire(keys=[s.input_queue], args=args)  # ints, compared with Claim members

    async def renew(self, messages: Sequence[Message]) -> list[str]:
        """Extend the locks still ours and reset their entries' idle time; returns record ids whose lock is gone."""
        s = self._settings
        args: list[str | int] = [
            s.consumer_group,
            s.consumer_name,
            self.token,
            math.ceil(s.lock_timeout),
            s.lock_prefix,
        ]
        for m in messages:
            args += (m.entry_id, m.record_id)
        lost = await self._renew(keys=[s.input_queue], args=args)
        return [r.decode() if isinstance(r, bytes) else r for r in lost]
