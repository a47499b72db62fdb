"""RATE_LIMITS: the stage's limits (phoenix/rate_limits.py), held together by every pod in Redis (rate_limit.lua).

The intake asks once per read batch, after the claim and before anything starts: each record takes a unit from
every bucket it needs (the stage's, its user's, a downstream's), in one script call with whatever usage and pauses
were reported since the last one. A record whose buckets have room within HOLD_MS is reserved its unit and started
when its time comes (it keeps its slot meanwhile); one further off is not a failure: it goes to the retry set due
when its bucket has room (no retry count, nothing told to the circuit breaker), counted `throttled`, and kept in the
stage's held set until it is due (what status.queue.throttled shows: the records held back now).

`report_cost` (a processor's call cost, for limits of `cost: tokens`) and `pause` (a provider's 429 Retry-After, and
the record it sent back) are applied with the next call, or within FLUSH_SECONDS when no record comes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from redis.asyncio import Redis

from phoenix import lua
from phoenix.keys import rate_limit_key
from phoenix.rate_limits import RateLimit
from phoenix.worker_runtime.log import CURRENT_MESSAGE
from phoenix.worker_runtime.messages import Message
from phoenix.worker_runtime.settings import WorkerSettings

# The longest reported usage or a pause waits for a record to carry it to Redis.
FLUSH_SECONDS = 1.0
# A record its limits have room for within this long waits in its worker, its unit reserved; past it, in the retry
# set. Long enough that a pod always holds the next records of a busy limit (no unit goes unused between two reads),
# short enough that what waits in slots stays a second of the limit's rate.
HOLD_MS = 1000
# Users whose bucket keys are kept between calls: a bound, not a cache that must hold every user.
_USER_KEYS_KEPT = 10_000


class RateLimiter:
    """The stage's limits for one worker process. `current` is the one a processor's `report_cost` reports to."""

    current: ClassVar[RateLimiter | None] = None

    def __init__(self, client: Redis, settings: WorkerSettings) -> None:
        self._script = lua.register(client, "rate_limit.lua", __package__)
        self._limits = settings.rate_limits
        self._namespace, self._stage = settings.key_namespace, settings.service_name
        self._held_key = settings.keys.held
        # The buckets every record takes from (stage and downstream scope), by limit index.
        self._shared = {i: self._bucket(i, limit, "") for i, limit in enumerate(self._limits) if limit.scope != "user"}
        # Each user's buckets, made once (a read batch asks for them per record), at most _USER_KEYS_KEPT users.
        self._buckets_of: dict[str, tuple[tuple[RateLimit, str], ...]] = {}
        self._limit_of: dict[str, RateLimit] = {}  # every bucket key made, for the charges and pauses sent alone
        self._charges: dict[str, float] = {}
        self._pauses: dict[str, float] = {}
        self._held: dict[str, float] = {}  # record id -> when it is due (time.monotonic()), sent back by a 429
        RateLimiter.current = self

    def _bucket(self, index: int, limit: RateLimit, user_id: str) -> str:
        if limit.scope == "downstream":
            return rate_limit_key(self._namespace, f"downstream:{limit.downstream}")
        if limit.scope == "stage":
            return rate_limit_key(self._namespace, f"stage:{self._stage}:{index}")
        return rate_limit_key(self._namespace, f"user:{self._stage}:{index}:{user_id}")

    def _keys_of(self, user_id: str) -> tuple[tuple[RateLimit, str], ...]:
        """The record's buckets: every shared one and, per limit of scope user, its user's."""
        found = self._buckets_of.get(user_id)
        if found is None:
            if len(self._buckets_of) >= _USER_KEYS_KEPT:
                self._buckets_of.clear()
                # Kept: the buckets with a charge or a pause still to send.
                self._limit_of = {key: self._limit_of[key] for key in {*self._charges, *self._pauses}}
            found = tuple(
                (limit, self._shared.get(i) or self._bucket(i, limit, user_id)) for i, limit in enumerate(self._limits)
            )
            self._buckets_of[user_id] = found
            self._limit_of.update((key, limit) for limit, key in found)
        return found

    def charge(self, units: float, user_id: str) -> None:
        """What a call cost, for every `cost: tokens` limit the record is under (its user's too, when known)."""
        for limit, key in self._keys_of(user_id):
            if limit.cost == "tokens" and (limit.scope != "user" or user_id):
                self._charges[key] = self._charges.get(key, 0.0) + units

    def pause(self, seconds: float, user_id: str, record_id: str) -> None:
        """A provider said to wait (429 Retry-After): the shared buckets, and the user's, grant nothing meanwhile;
        the record it refused waits as long, held back."""
        self._held[record_id] = time.monotonic() + seconds
        for limit, key in self._keys_of(user_id):
            if limit.scope != "user" or user_id:
                self._pauses[key] = max(self._pauses.get(key, 0.0), seconds * 1000)

    async def admit(self, messages: Sequence[Message]) -> list[int]:
        """Per message: 0 to start now, w > 0 to start in w ms (its units reserved), -w to come back in w ms (the
        retry set); one script call, carrying the usage and pauses reported since the last."""
        keys: dict[str, int] = {}
        params: list[float | int | str] = []
        records: list[int | str] = []
        # Each user's bucket count and positions in this call, found once: a batch's records share their users.
        placed: dict[str, list[int]] = {}
        for m in messages:
            if (positions := placed.get(m.user_id)) is None:
                buckets = self._keys_of(m.user_id)
                positions = placed[m.user_id] = [len(buckets)]
                for limit, key in buckets:
                    if (position := keys.get(key)) is None:
                        position = keys[key] = len(keys) + 1
                        params += self._params(key, limit)
                    positions.append(position)
            records.append(m.record_id)
            records += positions
        for key in {*self._charges, *self._pauses} - keys.keys():  # reported for buckets no record here needs
            keys[key] = len(keys) + 1
            params += self._params(key, self._limit_of[key])
        if not keys and not self._held:
            return [0] * len(messages)
        now, held = time.monotonic(), list[int | str]()
        for record_id, due in self._held.items():
            if due > now:
                held += (record_id, round((due - now) * 1000))
        self._held.clear()
        args = [HOLD_MS, len(keys), *params, len(messages), *records, len(held) // 2, *held]
        waits = await self._script(keys=[*keys, self._held_key], args=args)
        return [int(w) for w in waits]

    def _params(self, key: str, limit: RateLimit) -> tuple[float, int, str, float, float]:
        """rate_limit.lua's five values of a bucket; its reported charge and pause taken."""
        kind = "t" if limit.cost == "tokens" else "r"
        return limit.interval_ms, limit.capacity, kind, self._charges.pop(key, 0.0), self._pauses.pop(key, 0.0)

    async def flush(self) -> None:
        """Send what was reported, when no record carried it within FLUSH_SECONDS."""
        if self._charges or self._pauses or self._held:
            await self.admit(())


def report_cost(units: float, user_id: str | None = None) -> None:
    """Tell the stage's `cost: tokens` limits what the current record's call cost (e.g. the tokens of an LLM call);
    `user_id` for a call of a process_batch, else the current record's user. Nothing when the stage has no limits."""
    limiter = RateLimiter.current
    if limiter is None or units <= 0:
        return
    if user_id is None:
        message = CURRENT_MESSAGE.get()
        user_id = message.user_id if message is not None else ""
    limiter.charge(units, user_id)
