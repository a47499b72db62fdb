"""The outbox relay: moves the committed results a lane's commit could not forward in its own script (lanes.py) to
their streams.

Each worker of the stage relays, sharing the work through a consumer group on every relayed lane's outbox (the
stage's group name): it reads a batch (its own pending entries first, idle ones of dead workers every
CLAIM_INTERVAL), XADDs each entry unchanged to its record's stream, then acknowledges and deletes the batch in
one script (relay_done.lua). A worker killed between the XADDs and that script leaves the batch pending: it is
relayed again, and the downstream stage's record markers absorb the repeat; nothing is acknowledged before it is
written, so nothing is lost. Memory is bounded by the batch, and the outbox by backpressure (it counts there);
only relayed entries are deleted, so nothing leaves it unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix.backoff import Backoff
from phoenix.worker_runtime import lua, metrics
from phoenix.worker_runtime.lanes import Output, Route
from phoenix.worker_runtime.messages import OUTPUT_FIELDS
from phoenix.worker_runtime.reclaim import Reclaimer
from phoenix.worker_runtime.redis_client import Entry, read_group
from phoenix.worker_runtime.settings import REDIS_RETRY_MAX_DELAY, WorkerSettings

log = structlog.get_logger("phoenix.relay")

# Entries per outbox and step: what one relay holds in memory, and what a crash may repeat.
_BATCH = 200
# An outbox found empty is looked at again this much later: the relayed hop's added latency at most.
_IDLE_SECONDS = 0.05
_RECORD_ID = OUTPUT_FIELDS[0].encode()


class Relay:
    def __init__(self, client: Redis, settings: WorkerSettings, routes: Sequence[Route]) -> None:
        s = settings
        self._client = client
        self._settings = s
        self._outboxes = tuple(r.keys.outbox for r in routes if r.relayed)
        self._output = Output(s)
        self._done = lua.register(client, "relay_done.lua")
        self._reclaimers = {outbox: Reclaimer(client, s, outbox) for outbox in self._outboxes}
        # Outboxes whose own pending entries (a batch whose relay failed half-way) are read first.
        self._own_history = set(self._outboxes)
        self._next_claim = 0.0
        self._m_backlog = metrics.OUTBOX_BACKLOG.labels(s.service_name)
        self._m_relayed = metrics.OUTBOX_RELAYED.labels(s.service_name)

    @property
    def enabled(self) -> bool:
        return bool(self._outboxes)

    async def ensure_groups(self) -> None:
        """The relay's group on each outbox, from id 0 so an entry committed before any relay ran is relayed."""
        s = self._settings
        for outbox in self._outboxes:
            try:
                await self._client.xgroup_create(outbox, s.consumer_group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    async def run(self) -> None:
        """Relay until cancelled; an outbox with a full batch is read again at once, else after a short rest."""
        backoff = Backoff(0.1, REDIS_RETRY_MAX_DELAY)
        task = asyncio.current_task()
        # cancelling(): a cancellation swallowed inside a client library still ends the loop (as Worker._every).
        while task is None or not task.cancelling():
            try:
                moved = await self.relay_once()
                backoff.succeeded()
            except RedisError as exc:
                wait = backoff.failed()
                log.warning("relay_failed", error=str(exc), retry_in=wait)
                self._own_history.update(self._outboxes)  # a batch may be pending on us: read it again first
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):  # the outbox was deleted (a reset)
                    with contextlib.suppress(RedisError):
                        await self.ensure_groups()
                await asyncio.sleep(wait)
                continue
            if moved < _BATCH:
                await asyncio.sleep(_IDLE_SECONDS)

    async def relay_once(self) -> int:
        """One step over every relayed outbox; returns the most entries moved from one of them."""
        s = self._settings
        claim_due = time.monotonic() >= self._next_claim
        most = 0
        backlog = 0
        for outbox in self._outboxes:
            entries: list[Entry] = []
            if claim_due:
                entries, _ = await self._reclaimers[outbox].claim(_BATCH)
            if not entries and outbox in self._own_history:
                entries = await read_group(self._client, s.consumer_group, s.consumer_name, outbox, "0", _BATCH)
                if not entries:
                    self._own_history.discard(outbox)
            if not entries:
                entries = await read_group(self._client, s.consumer_group, s.consumer_name, outbox, ">", _BATCH)
            most = max(most, await self._move(outbox, entries))
            backlog += await self._client.xlen(outbox)
        if claim_due:
            self._next_claim = time.monotonic() + s.claim_interval
        self._m_backlog.set(backlog)
        return most

    async def _move(self, outbox: str, entries: Sequence[Entry]) -> int:
        if not entries:
            return 0
        # An entry deleted while pending (fields None) has nothing to relay: it is only acknowledged.
        live = [(entry_id, fields) for entry_id, fields in entries if fields]
        if live:
            async with self._client.pipeline(transaction=False) as pipe:
                for _, fields in live:
                    pipe.xadd(self._output.target(fields[_RECORD_ID].decode()), fields)  # type: ignore[arg-type]
                await pipe.execute()
        await self._done(keys=[outbox], args=[self._settings.consumer_group, *(entry_id for entry_id, _ in entries)])
        self._m_relayed.inc(len(live))
        return len(entries)
