"""A record's state in one key, `phoenix:{<namespace>}:<stage>:record:<record id>` (StageKeys.record_prefix):
locked by the worker processing it, then its idempotency marker once committed.

One key instead of a lock and a marker: the claim is one SET NX GET, the commit one SET GET that turns the lock
into the marker, so a record costs Redis one key and two writes where it cost two keys and four calls. The value
says which state it is, readable with redis-cli:
- `lock <token>`: taken by the claim (locks_acquire.lua) with LOCK_TIMEOUT, renewed while processing;
- `done <entry id>`: written by the commit (settle.lua) with IDEMPOTENCY_TTL; the entry id names the message
  whose commit processed the record.
"""

from __future__ import annotations

import enum
import math
import uuid
from collections.abc import Sequence

from redis.asyncio import Redis

from phoenix import lua
from phoenix.keys import StageKeys
from phoenix.record_format import DONE, LOCKED
from phoenix.worker_runtime.messages import Message
from phoenix.worker_runtime.settings import WorkerSettings


class Claim(enum.IntEnum):
    """Why a claim did not take a record's lock (locks_acquire.lua's codes)."""

    DUPLICATE = 1  # marker present: already processed; the worker has the entry acknowledged
    LOCKED = 2  # another worker holds the lock: left pending, reclaim retries it later


def lock_token(consumer_name: str) -> str:
    """An owner token: the consumer name tells a person at 3 a.m. who holds a lock; the suffix makes it unique."""
    return f"{consumer_name}:{uuid.uuid4().hex[:12]}"


class RecordLocks:
    """The claim and the lock renewal of records, one script call per batch (the record key's states: above).

    `acquire` locks a read's records with this worker's `lock_value` and says which it could not (a duplicate, or
    locked by another worker); `renew` extends the locks of the records in flight. The settle (settle.lua) turns
    a lock into the marker or releases it; a lock of a worker that died expires after LOCK_TIMEOUT.
    """

    def __init__(self, client: Redis, settings: WorkerSettings) -> None:
        self._settings = settings
        # Our lock, as the record key holds it: compared by value in every script that releases or renews it.
        self.lock_value = LOCKED + lock_token(settings.consumer_name)
        self._acquire = lua.register(client, "locks_acquire.lua", __package__)
        self._renew = lua.register(client, "locks_renew.lua", __package__)

    async def acquire(self, messages: Sequence[Message], lane: StageKeys) -> dict[int, int]:
        """Lock the messages' records (all of `lane`); returns those not locked, by position in `messages`: a Claim
        member."""
        s = self._settings
        prefix = lane.record_prefix
        keys = [prefix + m.record_id for m in messages]
        args = (self.lock_value, math.ceil(s.lock_timeout), math.ceil(s.idempotency_ttl), DONE)
        refused = await self._acquire(keys=keys, args=args)
        return {refused[i] - 1: refused[i + 1] for i in range(0, len(refused), 2)}

    async def renew(self, messages: Sequence[Message], lane: StageKeys) -> list[str]:
        """Extend the locks still ours and reset their entries' idle time (all of `lane`); returns record ids whose
        lock is gone."""
        s = self._settings
        prefix = lane.record_prefix
        keys = [lane.input, *(prefix + m.record_id for m in messages)]
        args: list[str | int] = [s.consumer_group, s.consumer_name, self.lock_value, math.ceil(s.lock_timeout), DONE]
        for m in messages:
            args += (m.entry_id, m.record_id)
        lost = await self._renew(keys=keys, args=args)
        return [r.decode() if isinstance(r, bytes) else r for r in lost]
