"""The outbox relay: moves the committed results a lane's commit could not forward in its own script (lanes.py) to
their streams.

Each worker of the stage relays, sharing the work through a consumer group on every relayed lane's outbox (the
stage's group name): it reads a batch (its own pending entries first, idle ones of dead workers every
CLAIM_INTERVAL), writes each entry unchanged to its record's stream, then acknowledges and deletes the batch in
one script (relay_done.lua). A worker killed between the writes and that script leaves the batch pending: it is
relayed again, and nothing is acknowledged before it is written, so nothing is lost. The repeat is written once:
to a stage's input as a plain XADD, whose stage's record markers absorb it; to a stream no stage reads (a plain
stream, found by keys.stage_of_input) through relay_write.lua, which writes an entry and its relay marker
(StageKeys.relay_marker, in the target's slot, kept IDEMPOTENCY_TTL as a record marker is) together and writes
nothing when the marker is there. A target whose marker cannot be put in its slot is refused at start
(UnmarkableTarget). With MIN_REPLICAS_ACK the writes are followed by a WAIT on their own connection (one per node
on a cluster) before the batch is deleted from the outbox: otherwise the deletion could replicate while the
relayed entry, on another primary, did not, and a failover of that primary would lose the record. A short count is
logged (`replicas_behind`, hop `relay`) as the settler's is. At shutdown a worker relays what is left (`finish`),
so a stage scaled to zero leaves nothing waiting in its outboxes. Memory is bounded by the batch, and the outbox by
backpressure (it counts there); only relayed entries are deleted, so nothing leaves it unread. An entry of a stage of
named outputs names its output (ROUTE_FIELD) and is written to that output without the name; a name the stage no
longer has (its outputs changed while the entry waited) sends it to the lane's DLQ with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError

from phoenix import lua
from phoenix.backoff import Backoff
from phoenix.errors import StartRefused
from phoenix.keys import StageKeys, stage_of_input
from phoenix.record_format import OUTPUT_FIELDS, ROUTE_FIELD
from phoenix.redis_spec import is_cluster
from phoenix.replica_wait import run_then_wait
from phoenix.worker_runtime import metrics
from phoenix.worker_runtime.dlq import dead_letter_fields
from phoenix.worker_runtime.lanes import Output, Route
from phoenix.worker_runtime.reclaim import Reclaimer
from phoenix.worker_runtime.redis_client import Entry, read_group
from phoenix.worker_runtime.settings import REDIS_RETRY_MAX_DELAY, WorkerSettings

log = structlog.get_logger("phoenix.relay")

# Entries per outbox and step: what one relay holds in memory, and what a crash may repeat.
_BATCH = 200
# An outbox found empty is looked at again this much later: the relayed hop's added latency at most.
_IDLE_SECONDS = 0.05
_RECORD_ID = OUTPUT_FIELDS[0].encode()
_ROUTE = ROUTE_FIELD.encode()


@dataclass(eq=False)
class UnmarkableTarget(StartRefused):
    """The relayed output `target` is a stream no stage reads whose relay markers cannot be put in its slot."""

    target: str

    def __str__(self) -> str:
        return (
            f"OUTPUT_QUEUE={self.target} is relayed (another slot than the stage's) and no stage reads it, so each "
            "entry is written with a relay marker in its slot, and no marker can be put there: the name has a '}' "
            "but no hash tag; give it a hash tag ('{...}') or a name without '}'"
        )


class Relay:
    """Moves each relayed lane's results from its outbox to the output in another slot, each entry once."""

    def __init__(self, client: Redis, settings: WorkerSettings, routes: Sequence[Route]) -> None:
        """Raises UnmarkableTarget (see there)."""
        s = settings
        self._client = client
        self._settings = s
        self._lanes = {r.keys.outbox: r.keys for r in routes if r.relayed}
        self._outboxes = tuple(self._lanes)
        self._output = Output.of(s)
        self._named = Output.named(s.outputs)
        # A stream no stage reads has no record markers to absorb a repeated relay: the relay marks its writes.
        # (An output that is a stage's input, of any partition, sends every result to that stage.)
        # (Named outputs are stages' inputs: never marked.)
        self._marked = bool(self._outboxes and s.output_queue) and stage_of_input(s.output_queue) is None
        if self._marked:  # a marker's slot is its tag's, the same for every lane: one lane's tells
            lane = next(iter(self._lanes.values()))
            if key_slot(lane.relay_marker(s.output_queue, "0-0").encode()) != key_slot(s.output_queue.encode()):
                raise UnmarkableTarget(s.output_queue)
        self._marker_ttl_ms = int(s.idempotency_ttl * 1000)
        self._done = lua.register(client, "relay_done.lua", __package__)
        self._write_once = lua.register(client, "relay_write.lua", __package__)
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
        lane = self._lanes[outbox]
        writes = [self._write(lane, entry_id, fields) for entry_id, fields in entries if fields]
        if writes and (self._marked or self._replicas):
            await self._write_per_node(writes)
        elif writes:
            # Stages' inputs, whose record markers absorb a repeat: the cluster pipeline splits the XADDs per node.
            async with self._client.pipeline(transaction=False) as pipe:
                for _, command in writes:
                    pipe.execute_command(*command)
                await pipe.execute()
        await self._done(keys=[outbox], args=[self._settings.consumer_group, *(entry_id for entry_id, _ in entries)])
        self._m_relayed.inc(len(writes))
        return len(entries)

    def _write(self, lane: StageKeys, entry_id: bytes, fields: dict[bytes, bytes]) -> tuple[str, tuple[Any, ...]]:
        """The stream an entry goes to and the command writing it: to the output (the named one the entry names,
        without its name), or the lane's DLQ for a name the stage has no output of."""
        record_id = fields[_RECORD_ID].decode()
        route = fields.get(_ROUTE)
        if route is None:
            return self._command(lane, entry_id, self._output.target(record_id), _flat(fields), marked=self._marked)
        rest = {name: value for name, value in fields.items() if name != _ROUTE}
        output = self._named.get(route.decode(errors="replace"))
        if output is not None:
            return self._command(lane, entry_id, output.target(record_id), _flat(rest), marked=False)
        error = f"relayed to output {route.decode(errors='replace')!r}, which this stage no longer has (OUTPUTS)"
        log.error("relay_output_unknown", record_id=record_id, output=route.decode(errors="replace"))
        stage = self._settings.service_name
        dead = dead_letter_fields(
            rest, entry_id.decode(), error=error, error_type="UnknownOutput", stage=stage, attempts=1
        )
        return self._command(lane, entry_id, lane.dlq, dead, marked=False)

    def _command(
        self, lane: StageKeys, entry_id: bytes, stream: str, flat: Iterable[Any], *, marked: bool
    ) -> tuple[str, tuple[Any, ...]]:
        """The write of one entry (its fields `flat`: name, value, ...): relay_write.lua with its marker to a
        stream no stage reads (`marked`), else an XADD."""
        if not marked:
            return stream, ("XADD", stream, "*", *flat)
        marker = lane.relay_marker(stream, entry_id.decode())
        return stream, ("EVALSHA", self._write_once.sha, 2, stream, marker, self._marker_ttl_ms, *flat)

    async def _write_per_node(self, writes: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        """The writes, in one pipeline per node holding a target's slot (one on a single Redis): redis-py's cluster
        pipeline runs no scripts. Each pipeline ends in a WAIT for MIN_REPLICAS_ACK replicas (with none asked,
        WAIT 0 answers at once). Errors are raised (the batch stays pending and is relayed again)."""
        groups: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
        cluster: Any = self._client if is_cluster(self._client) else None
        if cluster is not None:
            await cluster.initialize()  # a slot map before get_node_from_key (run_then_wait's own note)
        for stream, command in writes:
            node = cluster.get_node_from_key(stream).name if cluster is not None else ""
            groups.setdefault(node, []).append((stream, command))
        script = self._write_once if self._marked else None
        for group in groups.values():
            _, acked = await run_then_wait(
                self._client,
                group[0][0],
                [command for _, command in group],
                self._replicas,
                self._replicas_timeout_ms,
                script=script,
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


def _flat(fields: Mapping[bytes, bytes]) -> list[bytes]:
    return [part for item in fields.items() for part in item]
