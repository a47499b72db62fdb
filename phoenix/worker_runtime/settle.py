"""Group commit: outcomes of many concurrent messages settle in one atomic script call.

The settler decides nothing about a record (outcomes.py does); it writes what was decided, and when the script
fails on one item, falls back for that item alone (a minimal dead letter, else leave)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix import lua
from phoenix.backoff import delay
from phoenix.record_format import DONE, LUA_UNPACK_LIMIT, OUTPUT_FIELDS, ROUTE_FIELD
from phoenix.replica_wait import run_then_wait
from phoenix.worker_runtime.dlq import minimal_dead_letter
from phoenix.worker_runtime.lanes import Route
from phoenix.worker_runtime.lanes import routes as routes_of
from phoenix.worker_runtime.outcomes import Disposition, FieldValue, Outcome
from phoenix.worker_runtime.settings import REDIS_RETRY_MAX_DELAY, WorkerSettings

log = structlog.get_logger("phoenix.settle")

if TYPE_CHECKING:
    from phoenix.worker_runtime.tracing import MessageTracing


# settle.lua's code of a commit, by how many values it forwards: none, user_id and data, and a traceparent.
_COMMIT_CODES = {0: "M", 2: "C", 3: "T"}
# Error codes of a Redis that refuses every write for now (memory, failover, persistence, replicas, a busy script):
# waited out like a lost connection. Any other reply error is the script failing on what it was given.
_REDIS_REFUSALS = (
    "BUSY",
    "CLUSTERDOWN",
    "LOADING",
    "MASTERDOWN",
    "MISCONF",
    "NOREPLICAS",
    "OOM",
    "READONLY",
    "TRYAGAIN",
)


def refused_by_item(exc: RedisError) -> bool:
    """True when the call itself failed on its arguments or keys (e.g. a field list Lua cannot unpack): the same
    batch would fail again forever, so the failing item is isolated instead. Subclasses of ResponseError are
    Redis refusing (out of memory, read-only replica, no permission), never one item; nor is a lost connection.
    The intake's liveness asks the same: anything else means Redis cannot be worked with for now."""
    return type(exc) is ResponseError and not str(exc).removeprefix("ERR ").startswith(_REDIS_REFUSALS)


class Settler:
    """Queues outcomes and writes everything queued since the last write in one script call per lane.

    `on_settled` gets each written batch (all of one lane), once it is durable in Redis; the worker frees slots
    there. `routes`: each lane's keys and forward stream (lanes.py); unset, the stage's one lane forwarding to its
    output.
    `stalled_for` tells liveness how long work has waited without any commit succeeding.
    """

    _MAX_BATCH = 512

    def __init__(
        self,
        client: Redis,
        settings: WorkerSettings,
        lock_value: str,
        on_settled: Callable[[list[Outcome]], None],
        routes: Sequence[Route] | None = None,
        tracing: MessageTracing | None = None,
    ) -> None:
        self._script = lua.register(client, "settle.lua", __package__)
        s = settings
        routes = routes or routes_of(s.keys, s.output_partitions, slots_matter=False, named=s.outputs)
        # Per lane: settle.lua's four stage keys and each named output's stream (all in the lane's slot), and its
        # record key prefix.
        self._keys = [
            [r.keys.input, r.forward or r.keys.input, r.keys.dlq, r.keys.retry, *(f.stream for f in r.named)]
            for r in routes
        ]
        self._record_prefixes = [r.keys.record_prefix for r in routes]
        # Per lane: the script's head, with the names of the named outputs its outbox carries.
        self._heads: list[list[FieldValue]] = [
            [
                s.consumer_group,
                lock_value,
                math.ceil(s.idempotency_ttl),
                DONE,
                *OUTPUT_FIELDS,
                ROUTE_FIELD,
                len(r.named),
                *(f.name if f.relayed else "" for f in r.named),
            ]
            for r in routes
        ]
        self._on_settled = on_settled
        self._tracing = tracing if tracing is not None and tracing.recording else None
        self._client = client
        self._replicas, self._replicas_timeout_ms = s.min_replicas_ack, s.min_replicas_timeout_ms
        self._queues: list[list[Outcome]] = [[] for _ in routes]
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # While work waits: when the settler last made progress (a commit returned, or work came to an idle settler).
        self._progress_at = time.monotonic()

    def submit(self, outcome: Outcome) -> None:
        queue = self._queues[outcome.lane]
        queue.append(outcome)
        if len(queue) == 1:  # the first since the committer took the queue: it may be asleep
            if self._idle.is_set():  # work after a rest: its wait starts now, not at the last commit
                self._progress_at = time.monotonic()
            self._idle.clear()
            self._wake.set()

    def stalled_for(self, now: float) -> float:
        """Seconds work has waited while no commit succeeded (its calls hang or keep failing); 0 when idle."""
        return 0.0 if self._idle.is_set() else now - self._progress_at

    async def flush(self) -> None:
        """Wait until everything submitted so far is written."""
        await self._idle.wait()

    async def run(self) -> None:
        """The committer task."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            queues = self._queues
            while any(queues):
                # A batch of each lane in turn: a busy lane delays another by one script call at most.
                for lane, queue in enumerate(queues):
                    if not queue:
                        continue
                    batch, queues[lane] = queue[: self._MAX_BATCH], queue[self._MAX_BATCH :]
                    if self._tracing is None:
                        await self._write_batch(lane, batch)
                    else:
                        with self._tracing.settling(batch):
                            await self._write_batch(lane, batch)
                    self._on_settled(batch)
            self._idle.set()

    async def _write_batch(self, lane: int, batch: list[Outcome]) -> None:
        for position in await self._write(lane, batch):
            batch[position - 1].duplicate = True

    async def _commit(self, lane: int, outcomes: list[Outcome]) -> list[int]:
        # settle.lua's KEYS: the lane's four, then each item's record key (every key a script touches is declared).
        prefix = self._record_prefixes[lane]
        keys = self._keys[lane] + [prefix + o.record_id for o in outcomes]
        args = self._args(lane, outcomes)
        if not self._replicas:
            return await self._script(keys=keys, args=args)
        # MIN_REPLICAS_ACK: WAIT follows the script on its connection. The commit stands either way (Redis cannot
        # undo it); a short count is logged, since a failover now could lose this batch.
        commit = ("EVALSHA", self._script.sha, len(keys), *keys, *args)
        (result,), acked = await run_then_wait(
            self._client, keys[0], [commit], self._replicas, self._replicas_timeout_ms, script=self._script
        )
        if acked < self._replicas:
            log.warning(
                "replicas_behind",
                acknowledged_by=acked,
                wanted=self._replicas,
                batch=len(outcomes),
                timeout_ms=self._replicas_timeout_ms,
            )
        return result

    async def _write(self, lane: int, outcomes: list[Outcome]) -> list[int]:
        """Returns the positions (from 1) of the commits that found their record committed already.

        A script error is about what the batch holds (the same batch would fail forever): halves are written
        apart until the item that fails alone is found, which then gets its fallback (_write_alone). A script
        stops at its error without undoing the writes before it; writing those items again is safe, since a
        commit finds its own marker (not forwarded twice) and a retry or dead letter its entry acknowledged
        (settle.lua writes neither twice)."""
        error = await self._try(lane, outcomes)
        if isinstance(error, list):
            return error
        if len(outcomes) == 1:
            await self._write_alone(lane, outcomes[0], error)
            return []
        half = len(outcomes) // 2
        first = await self._write(lane, outcomes[:half])
        return first + [half + position for position in await self._write(lane, outcomes[half:])]

    async def _try(self, lane: int, outcomes: list[Outcome]) -> list[int] | Exception:
        """The script's reply, or the error of what the batch holds (a script error, a value the client cannot
        send); connection errors and Redis refusing writes are waited out (the entries stay pending, and settle.lua
        writes nothing twice: waiting loses nothing)."""
        failures = 0  # a count, not a Backoff: this runs for every batch, and nothing is built unless it fails
        while True:
            try:
                written = await self._commit(lane, outcomes)
                self._progress_at = time.monotonic()  # the one liveness cost: a clock read per script call
                return written
            except RedisError as exc:
                if refused_by_item(exc):
                    return exc
                wait = delay(failures, 0.1, REDIS_RETRY_MAX_DELAY)
                failures += 1
                log.warning("settle_failed", error=str(exc), batch=len(outcomes), retry_in=wait)
                await asyncio.sleep(wait)
            except Exception as exc:  # an item's value the client cannot send: the item's, like a script error
                return exc

    async def _write_alone(self, lane: int, outcome: Outcome, error: Exception) -> None:
        """An item the script fails on alone: a dead letter is written again in its minimal form; anything else,
        or a minimal dead letter that fails too, is left pending (lock released) for a later attempt, and logged."""
        if outcome.disposition is Disposition.DEAD_LETTER:
            outcome.fields = minimal_dead_letter(outcome.fields, str(error))
            again = await self._try(lane, [outcome])
            if isinstance(again, list):
                log.error("dead_letter_rewritten", message_id=outcome.entry_id, error=str(error))
                return
            error = again
        log.error(
            "settle_item_failed_left_pending",
            message_id=outcome.entry_id,
            record_id=outcome.record_id,
            action=outcome.disposition.name.lower(),
            error=str(error),
        )
        outcome.disposition, outcome.fields = Disposition.LEAVE, ()
        await self._try(lane, [outcome])  # pending either way; this releases the lock (a leave cannot fail on its item)

    def _args(self, lane: int, outcomes: list[Outcome]) -> list[FieldValue]:
        args = list(self._heads[lane])
        # An enum member read from its class is a Python call on 3.11: once per batch.
        commit, dead_letter, commit_codes = Disposition.COMMIT, Disposition.DEAD_LETTER, _COMMIT_CODES
        for o in outcomes:
            if o.disposition is commit:
                args += ("F" if o.routed else commit_codes[len(o.fields)], o.entry_id, o.record_id)
            else:
                # A StrEnum packs as its value; lower case: no lock to release (settle.lua).
                args += (o.disposition if o.holds_lock else o.disposition.lower(), o.entry_id, o.record_id)
                if o.disposition is dead_letter:
                    if len(o.fields) > LUA_UNPACK_LIMIT:  # settle.lua unpacks them for the DLQ's XADD
                        o.fields = minimal_dead_letter(o.fields, f"{len(o.fields)} values, over {LUA_UNPACK_LIMIT}")
                    args.append(len(o.fields))
            args.extend(o.fields)
        return args
