"""The outbox relay: moves the committed results a lane's commit could not forward in its own script (lanes.py) to
their streams.

Each worker of the stage relays, sharing the work through a consumer group on every relayed lane's outbox (the
stage's group name): it reads a batch (its own pending entries first, idle ones of dead workers every
CLAIM_INTERVAL), XADDs each entry unchanged to its record's stream, then acknowledges and deletes the batch in
one script (relay_done.lua). A worker killed between the XADDs and that script leaves the batch pending: it is
relayed again, and the downstream stage's record markers absorb the repeat; nothing is acknowledged before it is
written, so nothing is lost. With MIN_REPLICAS_ACK the XADDs are followed by a WAIT on their own connection (one per
node on a cluster) before the batch is deleted from the outbox: otherwise the deletion could replicate while the
relayed entry, on another primary, did not, and a failover of that primary would lose the record. A short count is
logged (`replicas_behind`, hop `relay`) as the settler's is. At shutdown a worker relays what is left (`finish`),
so a stage scaled to zero leaves nothing waiting in its outboxes. Memory is bounded by the batch, and the outbox by
backpressure (it counts there); only relayed entries are deleted, so nothing leaves it unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix.backoff import Backoff
from phoenix.redis_spec import is_cluster
from phoenix.replica_wait import run_then_wait
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
        self._replicas, self._replicas_timeout_ms = s.min_replicas_ack, s.min_replicas_timeout_ms

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

    async def finish(self, seconds: float) -> None:
        """At shutdown, once the last commit is written (and the relay loop cancelled): relay what is left in the
        outboxes, this worker's pending batch first, for at most `seconds`. What is left then waits for the next
        worker; without this a stage scaled to zero would leave its last results in the outbox until new work."""
        self._own_history.update(self._outboxes)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                if not await asyncio.wait_for(self.relay_once(), seconds):
                    break
        except (RedisError, TimeoutError) as exc:
            log.warning("relay_unfinished", error=str(exc) or type(exc).__name__)

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
        if live and self._replicas:
            await self._write_then_wait([(self._output.target(f[_RECORD_ID].decode()), f) for _, f in live])
        elif live:
            async with self._client.pipeline(transaction=False) as pipe:
                for _, fields in live:
                    pipe.xadd(self._output.target(fields[_RECORD_ID].decode()), fields)  # type: ignore[arg-type]
                await pipe.execute()
        await self._done(keys=[outbox], args=[self._settings.consumer_group, *(entry_id for entry_id, _ in entries)])
        self._m_relayed.inc(len(live))
        return len(entries)

    async def _write_then_wait(self, writes: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
        """The XADDs, each group followed by WAIT on its own connection: one group on a single Redis, one per node
        holding a target's slot on a cluster. Errors are raised (the batch stays pending and is relayed again)."""
        groups: dict[str, list[tuple[str, dict[bytes, bytes]]]] = {}
        if is_cluster(self._client):
            cluster: Any = self._client
            await cluster.initialize()  # a slot map before get_node_from_key (run_then_wait's own note)
            for stream, fields in writes:
                groups.setdefault(cluster.get_node_from_key(stream).name, []).append((stream, fields))
        else:
            groups[""] = list(writes)
        for group in groups.values():
            commands = [
                ("XADD", stream, "*", *(part for item in fields.items() for part in item)) for stream, fields in group
            ]
            _, acked = await run_then_wait(
                self._client, group[0][0], commands, self._replicas, self._replicas_timeout_ms
            )
            if acked < self._replicas:
                log.warning(
                    "replicas_behind",
                    hop="relay",
                    acknowledged_by=acked,
                    wanted=self._replicas,
                    batch=len(group),
                    timeout_ms=self._replicas_timeout_ms,
                )
