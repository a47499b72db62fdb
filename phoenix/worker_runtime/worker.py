"""The stage loop: read, claim, process, settle — keeping every guarantee of a worker that took one message at a
time with a round trip per step (docs/performance.md), without its round trips.

Round trips are amortised over batches: one XREADGROUP, one claim script (locks + idempotency markers)
and, for everything that finished meanwhile, one settle script. Per message the runtime adds no round trip.
A partitioned stage (PARTITIONS) has one Lane per partition: each has its own intake state and Redis calls (one
slot each), and all share the CONCURRENCY slots, the circuit breaker, the processor and the settler.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections import ChainMap
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix.backoff import Backoff
from phoenix.keys import StageKeys
from phoenix.worker_runtime import lanes, metrics, ownership
from phoenix.worker_runtime.backpressure import Backpressure
from phoenix.worker_runtime.billing import ApiKeyProvider, api_key_scope
from phoenix.worker_runtime.blocking import BLOCKING_THREADS
from phoenix.worker_runtime.circuit_breaker import CircuitBreaker, CircuitState
from phoenix.worker_runtime.history_read import HistoryReadGuard
from phoenix.worker_runtime.locks import Claim, RecordLocks
from phoenix.worker_runtime.log import CURRENT_MESSAGE, log_info_lines
from phoenix.worker_runtime.messages import Message
from phoenix.worker_runtime.outcomes import Disposition, Outcome, RecordPolicy, Unprocessable
from phoenix.worker_runtime.processor import BaseProcessor, BatchResult
from phoenix.worker_runtime.reclaim import Reclaimer
from phoenix.worker_runtime.redis_client import Entry, read_group, read_groups
from phoenix.worker_runtime.redis_risk import assess_redis
from phoenix.worker_runtime.relay import Relay
from phoenix.worker_runtime.retry import RetryScheduler
from phoenix.worker_runtime.settings import REDIS_RETRY_MAX_DELAY, WorkerSettings
from phoenix.worker_runtime.settle import Settler, refused_by_item
from phoenix.worker_runtime.tracing import MessageTracing, RecordTrace
from phoenix.worker_runtime.trim import Trimmer

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = structlog.get_logger("phoenix.worker")
# Around a processor call when no span is recorded: one shared object, nothing allocated per message.
_NO_SPAN = contextlib.nullcontext()

if sys.version_info >= (3, 12):

    def _start_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run the coroutine at once, up to its first real wait: a processor call that never waits (a cache
        hit, a no-op) then finishes without a trip through the event loop's queue."""
        return asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)
else:  # Python 3.11 has no eager tasks: an ordinary task

    def _start_task(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(coro)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel and await; a task that had already died is reported, since the worker relied on it."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception():
            log.error("worker_loop_crashed", task=task.get_name(), error=repr(task.exception()))
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(slots=True)
class InFlight:
    """A message whose lock this worker holds, from claim to settle."""

    message: Message
    deadline: float  # monotonic; the watchdog cancels the processor call past it (PROCESSING_TIMEOUT)
    lane: int = 0
    task: asyncio.Task[None] | None = None
    timed_out: bool = False
    # Its outcome went to the settler: once only, so a call given up past its timeout cannot commit when it ends.
    submitted: bool = False


@dataclass(slots=True, eq=False)
class Lane:
    """The intake state of one partition of the stage: its input's cursor and history reads, its idle claims."""

    index: int
    keys: StageKeys
    reclaimer: Reclaimer
    cursor: str = "0"
    reread_own_pending: bool = True  # at start: own pending entries first (id 0), then new ones (>)
    next_claim: float = 0.0  # monotonic; at start a claim is due, so a replacement pod picks up its predecessor's work
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    history: HistoryReadGuard = field(default_factory=HistoryReadGuard)  # what a history read must pass by


_RECLAIM_BATCH = 100
# Reads stay small enough that the next batch is read and claimed while earlier ones are processed and
# settled: Redis and Python then work at the same time instead of taking turns. Hence also at most half of
# CONCURRENCY per read: with one read filling every slot, the next read would wait for its whole settle.
_READ_BATCH = 200
# A partitioned stage on Redis Cluster waits for new entries on one lane at a time (a read is single-slot): this long,
# so an entry arriving on another lane waits for it at most.
_LANE_BLOCK_MS = 100
# The longest a stopping worker relays what its last commits left in its stage's outboxes (relay.py, finish).
_RELAY_FINISH_SECONDS = 5.0


class Worker:
    """One stage's worker: reads its input, claims each record, calls the processor and settles the outcome.

    Parameters: `settings` (the stage, its keys and limits), `processor` (the team's library: process or
    process_batch), `client` (Redis, returning bytes), `billing` (each user's API key around the call;
    `swap_env_key` puts it in the environment too), `tracer_provider` (where spans go).

    What it owns: `locks` (RecordLocks: claim and renewal), `policy` (RecordPolicy: each record's Outcome),
    `breaker` (CircuitBreaker around the processor), `settler` (Settler: group commit of the outcomes),
    `retries` (RetryScheduler: due retries back into the input), `lanes` (one Lane per partition: cursor, flights,
    Reclaimer, HistoryReadGuard), and what depends on where commits forward (`_route`): `backpressure`,
    `trimmer`, `relay`.

    What `run` runs until `request_stop`: the intake loop (`_intake_loop`: read, claim, start) and the retry
    promotion (every RETRY_POLL_INTERVAL), stopped first at shutdown; then, kept running while in-flight work
    drains: the settler, the lock renewer, the PROCESSING_TIMEOUT watchdog, the trimmer (TRIM_INTERVAL), the
    outbox relay (when a lane's commits go through an outbox) and the backpressure measure (OUTPUT_HIGH_WATER).
    `alive` and `ready` answer /healthz and /readyz.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        processor: BaseProcessor,
        client: Redis,
        billing: ApiKeyProvider,
        *,
        swap_env_key: bool = False,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        """`client` must return bytes (decode_responses=False): entries are decoded here, one by one.
        `tracer_provider`: where the spans go; the global one (configure_tracing, or a processor's) by default."""
        self.settings = settings
        self.processor = processor
        self.billing = billing
        self._swap_env_key = swap_env_key
        self.redis = client
        self.locks = RecordLocks(client, settings)
        # Built after the processor's initialize(), where a team may configure an OpenTelemetry SDK of its own.
        self._tracing = MessageTracing(settings, tracer_provider)
        self.retries = RetryScheduler(client, settings)
        self.lanes = [
            Lane(i, keys, Reclaimer(client, settings, keys.input)) for i, keys in enumerate(settings.keys.lanes)
        ]
        self._lane_of_stream = {lane.keys.input.encode(): lane for lane in self.lanes}
        self._turn = 0  # the lane whose turn it is to read
        self._turn_started = 0  # entries the current intake turn started (each holds a slot until settled)
        self._route(slots_matter=False)  # again once Redis tells whether it is a cluster (_wait_for_redis)
        stage = settings.service_name
        self.breaker = CircuitBreaker(
            settings.circuit_failure_threshold,
            settings.circuit_reset_timeout,
            settings.circuit_half_open_calls,
            on_change=self._on_circuit_change,
        )
        # A processor that overrides process_batch gets each read's records in one call.
        self._batches = type(processor).process_batch is not BaseProcessor.process_batch
        # READ_MEMORY_BYTES: a read asks for no more entries of MAX_MESSAGE_BYTES than fit in it (docs/durability.md).
        by_memory = settings.read_memory_bytes // settings.max_message_bytes
        self._read_batch = max(1, min(_READ_BATCH, (settings.concurrency + 1) // 2, by_memory))
        self._slots_used = 0
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        # Per-message success lines are info; skipping their arguments matters at tens of thousands a second.
        self._log_each_message = settings.log_level in ("debug", "info")
        # The intake's last sign of health: an iteration whose Redis calls returned, or that waited on purpose.
        self.last_beat = time.monotonic()
        self._liveness_timeout = settings.liveness_timeout or 0.0  # always derived when unset (settings.py)
        self._liveness_failed = False  # the failure is logged once, when /healthz first reports it
        self.policy = RecordPolicy(settings, self.breaker)
        # The outcomes counted once settled; the policy counts the others when it decides them.
        self._m_processed = metrics.MESSAGES.labels(stage, "processed")
        self._m_duplicate = metrics.MESSAGES.labels(stage, "skipped_duplicate")
        self._m_wait = metrics.QUEUE_WAIT_SECONDS.labels(stage)
        self._m_in_flight = metrics.IN_FLIGHT.labels(stage)
        self._m_circuit = metrics.CIRCUIT_STATE.labels(stage)
        self._m_reclaimed = metrics.RECLAIMED.labels(stage)
        self._m_contention = metrics.LOCK_CONTENTION.labels(stage)
        metrics.LEAKED_THREADS.labels(stage).set_function(lambda: BLOCKING_THREADS.leaked)
        self._m_circuit.set(CircuitState.CLOSED)

    def _route(self, *, slots_matter: bool) -> None:
        """Build what depends on where each lane's commits forward (lanes.py): the settler, backpressure, the
        trimmer and the outbox relay."""
        s, client = self.settings, self.redis
        self._slots_matter = slots_matter
        routes = lanes.routes(s.keys, s.output_partitions, slots_matter=slots_matter)
        self.settler = Settler(client, s, self.locks.lock_value, self._on_settled, routes, self._tracing)
        self.backpressure = Backpressure(client, s, routes)
        self.trimmer = Trimmer(client, s, routes)
        self.relay = Relay(client, s, routes)

    @property
    def in_flight(self) -> Mapping[str, InFlight]:
        """The messages in flight by entry id: of the one lane, or a view over every lane's (ids may repeat across
        lanes: count with `_flights`)."""
        if len(self.lanes) == 1:
            return self.lanes[0].in_flight
        return ChainMap(*(lane.in_flight for lane in self.lanes))

    def _flights(self) -> Iterator[InFlight]:
        for lane in self.lanes:
            yield from lane.in_flight.values()

    def _in_flight_count(self) -> int:
        return sum(len(lane.in_flight) for lane in self.lanes)

    def _reread_own_pending(self) -> None:
        """Every lane reads its own pending entries again before new ones."""
        for lane in self.lanes:
            lane.reread_own_pending = True

    # -- lifecycle -------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    def alive(self) -> tuple[bool, str]:
        """/healthz: False, with the reasons, when only a restart helps; the first failure is logged."""
        now, limit = time.monotonic(), self._liveness_timeout
        reasons = []
        if (quiet := now - self.last_beat) >= limit:
            reasons.append(f"intake stalled: no Redis read has returned for {quiet:.0f}s (LIVENESS_TIMEOUT={limit:g}s)")
        if (stalled := self.settler.stalled_for(now)) >= limit:
            reasons.append(
                f"settle stalled: no commit has succeeded for {stalled:.0f}s while outcomes wait "
                f"(LIVENESS_TIMEOUT={limit:g}s)"
            )
        if (leaked := BLOCKING_THREADS.leaked) >= self.settings.max_leaked_threads:
            limit_threads = self.settings.max_leaked_threads
            reasons.append(f"{leaked} run_blocking threads outlived their calls (MAX_LEAKED_THREADS={limit_threads})")
        if not reasons:
            self._liveness_failed = False
            return True, "ok"
        reason = "; ".join(reasons)
        if not self._liveness_failed:
            self._liveness_failed = True
            log.error("liveness_failed", reason=reason, in_flight=self._in_flight_count())
        return False, reason

    async def ready(self) -> tuple[bool, str]:
        if self.breaker.state is CircuitState.OPEN:
            return False, "circuit open"
        try:
            await asyncio.wait_for(self.redis.ping(), 2)
        except (RedisError, TimeoutError, OSError) as exc:
            return False, f"redis unreachable: {type(exc).__name__}"
        return True, "ok"

    async def ensure_group(self) -> None:
        """Create the group at id 0 with MKSTREAM so entries added before the first worker are not skipped.

        A worker of an operator-managed stage (STAGE_UID) claims the stage's keys with it (ownership.py): a group
        lost in a Redis flush comes back with its marker. Raises KeysHeld when another stage holds them.
        Each lane's keys are claimed (created) apart, in their own slot (after the layout is checked); then the
        relay's groups on the outboxes."""
        s = self.settings
        if s.stage_uid:
            try:
                # The layout checked, then each lane claimed in its own slot (ownership.claim).
                claimed = await ownership.claim(self.redis, s.keys, s.stage_uid, adopt=False)
            except ownership.KeyOfAnotherType as exc:
                raise ResponseError(str(exc)) from None  # as XGROUP CREATE says it: retried like Redis errors
            if claimed.group:
                log.info("consumer_group_created", stream=s.keys.input, group=s.consumer_group)
        else:
            for lane in self.lanes:
                try:
                    await self.redis.xgroup_create(lane.keys.input, s.consumer_group, id="0", mkstream=True)
                    log.info("consumer_group_created", stream=lane.keys.input, group=s.consumer_group)
                except ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):
                        raise
        await self.relay.ensure_groups()

    async def _wait_for_redis(self) -> bool:
        """Create the group, retrying while Redis is unreachable; False if asked to stop meanwhile. Raises KeysHeld
        when the stage's keys are another's (a worker run by hand: when any PhoenixStage holds them), LayoutDiffers
        when PARTITIONS differs from the stage's layout, OutputLayoutDiffers when OUTPUT_PARTITIONS differs from the
        next stage's, UnmarkableTarget when a relayed output's relay markers cannot be put in its slot."""
        backoff = Backoff(0.5, 10.0)
        while not self._stopping.is_set():
            try:
                s = self.settings
                if not s.stage_uid:
                    for lane in self.lanes:
                        if holder := await ownership.holder_at_start(self.redis, lane.keys):
                            raise ownership.KeysHeld(holder, lane.keys.input)
                    await ownership.check_layout(self.redis, s.keys)  # a stage's own worker: with its claim
                await lanes.check_output_layout(self.redis, s)
                if await lanes.cluster_enabled(self.redis, s.redis.mode):
                    self._route(slots_matter=True)  # a forward to another slot goes through the outbox
                await self.ensure_group()
                return True
            except RedisError as exc:
                redis, wait = self.settings.redis, backoff.failed()
                log.warning("redis_unavailable", error=redis.explain(exc), redis=redis.redacted, retry_in=wait)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), wait)
        return False

    async def run(self) -> None:
        """Until `request_stop`: then finish in-flight work within SHUTDOWN_GRACE and return."""
        if not await self._wait_for_redis():
            return
        s = self.settings
        log.info(
            "worker_started",
            input=s.input_queue,
            partitions=s.partitions,
            output=s.output_queue or None,
            output_partitions=s.output_partitions,
            group=s.consumer_group,
            consumer=s.consumer_name,
            concurrency=s.concurrency,
            redis=s.redis.redacted,
        )
        await self._report_redis_risk()
        # Now, not after TRIM_INTERVAL: an output no group reads is warned about among the start lines.
        await self.trimmer.look_at_output()
        # Lock renewal, the timeout watchdog and the committer keep running while in-flight work drains.
        background = [
            asyncio.create_task(self.settler.run(), name="settler"),
            asyncio.create_task(self._every(self._renew_interval(), self._renew_locks), name="renewer"),
            asyncio.create_task(
                self._every(min(1.0, s.processing_timeout / 10), self._enforce_timeouts), name="watchdog"
            ),
            asyncio.create_task(self._every(s.trim_interval, self.trimmer.trim), name="trimmer"),
        ]
        relay = [asyncio.create_task(self.relay.run(), name="relay")] if self.relay.enabled else []
        if self.backpressure.enabled:
            background.append(
                asyncio.create_task(
                    self._every(s.backpressure_interval, self.backpressure.measure), name="backpressure"
                )
            )
        intake = [
            asyncio.create_task(self._intake_loop(), name="intake"),
            asyncio.create_task(self._every(s.retry_poll_interval, self._promote_retries), name="retries"),
        ]
        stop = asyncio.create_task(self._stopping.wait())
        await asyncio.wait([stop, *intake, *relay, *background], return_when=asyncio.FIRST_COMPLETED)
        await _cancel([stop, *intake])
        await self._drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settler.flush(), 30)
        if relay:
            # The last commits may have gone to an outbox: relayed now, not left for a worker that may never come
            # (a stage scaled to zero). The loop first, so that no two relays of this worker read its pending batch.
            await _cancel(relay)
            await self.relay.finish(_RELAY_FINISH_SECONDS)
        await _cancel(background)
        log.info("worker_stopped")

    async def _report_redis_risk(self) -> None:
        """One line at start: a Redis that may lose acknowledged data undoes every guarantee above it."""
        risk = await assess_redis(self.redis)
        if risk.at_risk:
            log.warning("redis_may_lose_data", reason=risk.describe())
        else:
            log.info("redis_settings_checked", settings=risk.settings)

    async def _drain(self) -> None:
        """Let in-flight messages finish; past the grace period, cancel them: they stay pending, locks released."""
        # The flights hold their tasks (asyncio keeps only weak references): a task is done before its
        # outcome settles and the flight goes, so no per-task bookkeeping is needed besides.
        tasks = {f.task for f in self._flights() if f.task is not None and not f.task.done()}
        if tasks:
            log.info("draining", in_flight=len(tasks), grace_seconds=self.settings.shutdown_grace)
            _, unfinished = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace)
            for task in unfinished:
                task.cancel()
            if unfinished:
                log.warning("shutdown_left_pending", count=len(unfinished))
                # TIMEOUT_GRACE to end, as after a timeout; at most 10 s, well within app.py's exit deadline.
                await asyncio.wait(unfinished, timeout=min(self.settings.timeout_grace, 10))
        # A call that ignored its cancellation: its entry stays pending, its lock released for the next worker.
        for flight in list(self._flights()):
            if not flight.submitted:
                self._give_up(flight, self.policy.deferred(flight.message, circuit_open=False))

    def _renew_interval(self) -> float:
        s = self.settings
        return min(s.lock_timeout, s.claim_idle_ms / 1000) / 3

    async def _every(self, seconds: float, job: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.current_task()
        # cancelling(): a cancellation swallowed somewhere inside a client library still ends the loop.
        while task is None or not task.cancelling():
            await asyncio.sleep(seconds)
            try:
                await job()
            except RedisError as exc:
                log.warning("background_job_failed", job=getattr(job, "__name__", "?"), error=str(exc))

    # -- capacity: at most CONCURRENCY messages between read and settle ---------------------------------------

    def _free_slots(self) -> int:
        return self.settings.concurrency - self._slots_used

    async def _reserve(self, limit: int) -> int:
        """Reserve up to `limit` slots, waiting briefly for one; 0 if none freed up (the caller loops)."""
        if self._free_slots() <= 0:
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), 1.0)
        n = max(0, min(limit, self._free_slots()))
        self._slots_used += n
        return n

    def _release(self, n: int) -> None:
        if n:
            self._slots_used -= n
            self._slot_freed.set()
        self._m_in_flight.set(self._in_flight_count())

    # -- reading ---------------------------------------------------------------------------------------------

    async def _intake_loop(self) -> None:
        """The one way work comes in: per lane, own pending entries first, idle entries of dead workers whenever a
        claim is due (every CLAIM_INTERVAL, and at start so a replacement pod picks up its predecessor's work), else
        new entries. Whatever the source, it is read into slots reserved beforehand, so CONCURRENCY holds."""
        backoff = Backoff(0.1, REDIS_RETRY_MAX_DELAY)
        failed = False
        while not self._stopping.is_set():
            if not failed:  # a read Redis keeps not answering (a socket timeout, retried) is no beat
                self.last_beat = time.monotonic()
            failed = False
            trial_slots = self.breaker.trial_slots()
            if trial_slots == 0:
                # Open, or all half-open trials running: pull no new work until the breaker lets calls through.
                await asyncio.sleep(min(1.0, self.breaker.seconds_until_half_open() or 0.2))
                continue
            if self.backpressure.holds_all:
                # What every lane feeds is over OUTPUT_HIGH_WATER: read nothing until the next stage catches up.
                await self.backpressure.wait_resumed(1.0)
                continue
            n = await self._reserve(self._read_batch if trial_slots is None else min(self._read_batch, trial_slots))
            if n == 0:
                continue
            self._turn_started = 0
            try:
                await self._intake_turn(n)
                backoff.succeeded()
            except RedisError as exc:
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    # Someone deleted the stream or group (a stage reset): recreate it and go on.
                    with contextlib.suppress(RedisError):
                        await self.ensure_group()
                    continue
                # Redis down, or the key is not a stream: say so and keep trying, never crash-loop.
                # Redis not answering, or refusing every call for now (a read-only replica after a failover): no
                # beat. An error about the call itself (the key is no stream) is an answer; a restart cannot cure it.
                failed = not refused_by_item(exc)
                wait = backoff.failed()
                log.warning("redis_read_failed", error=str(exc), retry_in=wait)
                if not isinstance(exc, ResponseError):
                    # A broken connection (a failover): a read may have delivered entries whose reply never came,
                    # or the claim after a read failed. They are pending on this consumer: read them again first,
                    # as at start, instead of leaving them to a reclaim after CLAIM_IDLE_MS.
                    self._reread_own_pending()
                await asyncio.sleep(wait)
            finally:
                self._release(n - self._turn_started)

    async def _intake_turn(self, n: int) -> None:
        """Read into `n` reserved slots: the lanes take turns (a busy lane reads once per round, so it cannot
        starve another), and the first lane with something to do uses the turn. With one lane the read of new
        entries blocks (BLOCK_MS); with several they are read without blocking, and only when no lane had any
        does the worker wait for the first new entry (_wait_for_new)."""
        s, all_lanes = self.settings, self.lanes
        single = len(all_lanes) == 1
        for _ in all_lanes:
            lane = all_lanes[self._turn]
            self._turn = (self._turn + 1) % len(all_lanes)
            if self.backpressure.holds(lane.index):
                continue  # the partition of the output it feeds is over its mark
            if lane.reread_own_pending:
                lane.reread_own_pending, lane.cursor = False, "0"
            if lane.cursor != ">":
                lane.cursor = await self._read_history(lane, n)
                return
            if time.monotonic() >= lane.next_claim:
                if await self._claim_idle(lane, n):
                    lane.next_claim = time.monotonic() + s.claim_interval
                return
            block = s.block_ms if single else None
            new = await read_group(self.redis, s.consumer_group, s.consumer_name, lane.keys.input, ">", n, block)
            if new or single:
                await self._dispatch(lane, new, None)
                return
        await self._wait_for_new(n)

    async def _wait_for_new(self, n: int) -> None:
        """Every lane not held by backpressure was empty: block until new entries come. On a single Redis one
        XREADGROUP waits on every such lane at once (n // lanes entries of each at most, so CONCURRENCY holds); on a
        cluster, or with fewer slots than lanes, one lane waits _LANE_BLOCK_MS, the next lane next time."""
        s, all_lanes, backpressure = self.settings, self.lanes, self.backpressure
        open_lanes = [lane for lane in all_lanes if not backpressure.holds(lane.index)]
        if not open_lanes:
            return  # held since the turn began: the intake loop waits for a resume
        if not self._slots_matter and n >= len(open_lanes):
            streams = [lane.keys.input for lane in open_lanes]
            count = n // len(open_lanes)
            for stream, entries in await read_groups(
                self.redis, s.consumer_group, s.consumer_name, streams, count, s.block_ms
            ):
                await self._dispatch(self._lane_of_stream[stream], entries, None)
            return
        while backpressure.holds((lane := all_lanes[self._turn]).index):
            self._turn = (self._turn + 1) % len(all_lanes)
        self._turn = (self._turn + 1) % len(all_lanes)
        block = min(s.block_ms, _LANE_BLOCK_MS)
        new = await read_group(self.redis, s.consumer_group, s.consumer_name, lane.keys.input, ">", n, block)
        await self._dispatch(lane, new, None)

    async def _read_history(self, lane: Lane, n: int) -> str:
        """XREADGROUP of the lane's own pending entries from its cursor; returns the next cursor (">" once all were
        read again: from then on only new entries)."""
        s = self.settings
        with lane.history.reading() as settled:
            entries = await read_group(self.redis, s.consumer_group, s.consumer_name, lane.keys.input, lane.cursor, n)
            if not entries:
                return ">"
            counts = await lane.reclaimer.delivery_counts([e[0].decode() for e in entries])
        unsettled = [e for e in entries if e[0].decode() not in settled]
        await self._dispatch(lane, unsettled, counts)
        return entries[-1][0].decode()

    async def _claim_idle(self, lane: Lane, n: int) -> bool:
        """XAUTOCLAIM a slice of the lane's idle entries. Returns whether its whole pending list was walked."""
        entries, trimmed = await lane.reclaimer.claim(n)
        if trimmed:  # XAUTOCLAIM acknowledged them
            self.policy.trimmed(trimmed)
        if entries:
            self._m_reclaimed.inc(len(entries))
            log.warning("stale_messages_claimed", count=len(entries), idle_ms=self.settings.claim_idle_ms)
            counts = await lane.reclaimer.delivery_counts([e[0].decode() for e in entries])
            await self._dispatch(lane, entries, counts)
        if not lane.reclaimer.exhausted:
            return False
        gone = await lane.reclaimer.forget_dead_consumers()
        if gone:
            log.info("dead_consumers_removed", consumers=gone)
        return True

    async def _promote_retries(self) -> None:
        moved = await self.retries.promote_due()
        if moved:
            log.info("retries_requeued", count=moved)

    async def _renew_locks(self) -> None:
        for lane in self.lanes:
            if not lane.in_flight:
                continue
            lost = await self.locks.renew([f.message for f in lane.in_flight.values()], lane.keys)
            for record_id in lost:
                # The commit still refuses to forward a record twice (it checks the marker), so this is a warning.
                log.warning("lock_lost", record_id=record_id)

    async def _enforce_timeouts(self) -> None:
        """PROCESSING_TIMEOUT, enforced by one periodic scan instead of a timer per message. A call still running
        TIMEOUT_GRACE after its cancellation (it swallowed the CancelledError) is given up: retried, its slot and
        lock freed; whatever it returns later is ignored."""
        now = time.monotonic()
        s = self.settings
        for flight in list(self._flights()):
            if flight.submitted or flight.deadline >= now:
                continue
            if not flight.timed_out:
                flight.timed_out = True
                if flight.task:
                    flight.task.cancel()
            elif flight.deadline + s.timeout_grace < now:
                limits = f"PROCESSING_TIMEOUT={s.processing_timeout:g}s + TIMEOUT_GRACE={s.timeout_grace:g}s"
                error = TimeoutError(f"processing outlived {limits} and was given up")
                running = now - flight.deadline + s.processing_timeout
                CURRENT_MESSAGE.set(flight.message)
                log.error("processing_given_up", seconds=round(running, 1))
                self._give_up(flight, self.policy.of_failure(flight.message, error, time.time() - running))
                CURRENT_MESSAGE.set(None)

    # -- dispatch: parse, poison check, claim, start ------------------------------------------------------------

    async def _dispatch(self, lane: Lane, entries: Sequence[Entry], counts: dict[str, int] | None) -> None:
        """Parse, poison-check, claim and start entries of `lane`; adds how many now hold a slot until settled to
        the turn's count.

        Every Redis call comes before anything is started, so an error here leaves no slot taken.
        """
        s, policy = self.settings, self.policy
        in_flight, settling = lane.in_flight, lane.history.settling_without_flight
        candidates: list[Message] = []
        unfit: list[Unprocessable] = []
        trimmed: list[str] = []
        for raw_id, raw in entries:
            entry_id = raw_id.decode()
            if entry_id in in_flight or entry_id in settling:
                continue  # our own unsettled entry seen again in a history read
            if raw is None:
                trimmed.append(entry_id)  # trimmed from the stream while pending: nothing left to process
                continue
            screened = policy.screen(entry_id, raw, counts.get(entry_id, 1) if counts else 1)
            if isinstance(screened, Unprocessable):
                unfit.append(screened)
            else:
                candidates.append(screened)
        if trimmed:
            await self.redis.xack(lane.keys.input, s.consumer_group, *trimmed)
            policy.trimmed(len(trimmed))
        refused = await self.locks.acquire(candidates, lane.keys) if candidates else {}
        for entry in unfit:
            self._settle_without_flight(lane, policy.unprocessable(entry))
        skipped = 0
        for index, claim in refused.items():
            message = candidates[index]
            if claim == Claim.DUPLICATE:
                skipped += 1
                skip = policy.duplicate(message)
                if self._tracing.recording:
                    self._tracing.duplicate(message, skip)
                self._settle_without_flight(lane, skip)
            else:
                self._m_contention.inc()
                log.info("record_locked_elsewhere", record_id=message.record_id, message_id=message.entry_id)
        acquired = [m for index, m in enumerate(candidates) if index not in refused] if refused else candidates
        deadline = time.monotonic() + s.processing_timeout
        index = lane.index
        flights = [InFlight(message, deadline, index) for message in acquired]
        for flight in flights:
            in_flight[flight.message.entry_id] = flight
        self._turn_started += len(unfit) + skipped + len(flights)
        if self._batches and flights:
            self._start(self._handle_batch(flights), flights)
        else:
            for flight in flights:
                self._start(self._handle(flight), (flight,))

    def _start(self, coro: Coroutine[Any, Any, None], flights: Sequence[InFlight]) -> None:
        task = _start_task(coro)
        for flight in flights:
            flight.task = task  # what the timeout watchdog and the shutdown cancel

    def _on_settled(self, batch: list[Outcome]) -> None:
        """Called by the settler once a batch is durable: count, log, free the slots."""
        done = time.time()
        commit = Disposition.COMMIT  # an enum member read from its class is a Python call on 3.11: once per batch
        processed = duplicates = 0
        traced = self._tracing.recording
        lines: list[dict[str, Any]] = []
        lane = self.lanes[batch[0].lane]  # a batch is of one lane
        lane.history.settled(batch)
        in_flight = lane.in_flight
        for outcome in batch:
            flight = in_flight.pop(outcome.entry_id, None)
            if outcome.disposition is not commit:
                continue  # dead letters, retries and deferrals were counted and logged when decided
            if outcome.duplicate:
                duplicates += 1
            else:
                processed += 1
            if self._log_each_message:
                line = {
                    "event": "duplicate_discarded" if outcome.duplicate else "processing_complete",
                    "record_id": outcome.record_id,
                    "message_id": outcome.entry_id,
                    "user_id": flight.message.user_id if flight else "",
                    "duration_seconds": round(done - outcome.started_at, 6),
                }
                if traced and outcome.trace is not None and outcome.trace.commit_ids:
                    line.update(outcome.trace.commit_ids)  # the line of the record's commit span
                lines.append(line)
        if lines:
            log_info_lines(lines)
        self._m_processed.inc(processed)
        self.backpressure.note_forwarded(lane.index, processed)
        self._m_duplicate.inc(duplicates)
        self._release(len(batch))

    # -- one message ---------------------------------------------------------------------------------------------

    async def _handle(self, flight: InFlight) -> None:
        """One message from claim to settle: the processor call under the breaker, the timeout watchdog, the
        user's API key and the trace context. One coroutine, since it runs for every message."""
        m = flight.message
        CURRENT_MESSAGE.set(m)  # this task's log lines carry the message's ids
        started = time.time()
        self._m_wait.observe(max(0.0, started - m.enqueued_at_ms / 1000))
        if not self.breaker.try_acquire():
            outcome = self.policy.deferred(m, circuit_open=True)
        else:
            tracing = self._tracing
            record_trace = tracing.begin(m, started) if tracing.recording else None
            # The next stage continues this stage's span; unrecorded, the context passes through unchanged.
            traceparent = m.traceparent if record_trace is None else record_trace.traceparent
            # The outcome is decided inside the span too: the failure's log line carries the trace's ids.
            with _NO_SPAN if record_trace is None else tracing.current(record_trace):
                try:
                    if self.billing.enabled:
                        with await self._user_key_scope(m.user_id):
                            result = await self.processor.process(m.record_id, m.user_id, m.data)
                    else:
                        result = await self.processor.process(m.record_id, m.user_id, m.data)
                except BaseException as exc:  # SystemExit and the like too: they fail the record, not the worker
                    outcome = self._raised_outcome(flight, exc, started)
                else:
                    outcome = self.policy.of_result(m, result, started, traceparent)
            if record_trace is not None:
                tracing.end(record_trace, outcome)
        outcome.started_at = started
        self._submit(flight, outcome)

    async def _handle_batch(self, flights: list[InFlight]) -> None:
        """The records of one read in one process_batch call; each still gets its own outcome, as in _handle.
        Each record gets its own process span, none of them current during the call (one call cannot be inside
        every record's); each is current while its record's outcome is decided."""
        started = time.time()
        tracing = self._tracing
        admitted: list[InFlight] = []
        outcomes: list[tuple[InFlight, Outcome]] = []
        traces: dict[str, RecordTrace] = {}
        for flight in flights:
            m = flight.message
            self._m_wait.observe(max(0.0, started - m.enqueued_at_ms / 1000))
            if self.breaker.try_acquire():
                admitted.append(flight)
                if tracing.recording:
                    traces[flight.message.entry_id] = tracing.begin(flight.message, started)
            else:
                CURRENT_MESSAGE.set(m)
                outcomes.append((flight, self.policy.deferred(m, circuit_open=True)))
        CURRENT_MESSAGE.set(None)  # the processor's lines during a batch belong to no single record
        # Each record's outcome is decided inside its own process span, as in _handle: the line of its failure
        # (processing_failed_will_retry, message_dead_lettered) carries its trace's ids.
        try:
            results = await self._process_batch([f.message for f in admitted]) if admitted else []
        except BaseException as exc:  # the call itself failed: so did every record in it
            for f in admitted:
                CURRENT_MESSAGE.set(f.message)
                record_trace = traces.get(f.message.entry_id) if traces else None
                with _NO_SPAN if record_trace is None else tracing.current(record_trace):
                    outcomes.append((f, self._raised_outcome(f, exc, started)))
        else:
            for f, result in zip(admitted, results, strict=True):
                CURRENT_MESSAGE.set(f.message)
                m = f.message
                record_trace = traces.get(m.entry_id) if traces else None
                if record_trace is None:
                    outcomes.append((f, self.policy.of_result(m, result, started, m.traceparent)))
                else:
                    with tracing.current(record_trace):
                        outcomes.append((f, self.policy.of_result(m, result, started, record_trace.traceparent)))
        CURRENT_MESSAGE.set(None)
        for flight, outcome in outcomes:
            if traces and (record_trace := traces.get(outcome.entry_id)) is not None:
                tracing.end(record_trace, outcome)
            outcome.started_at = started
            self._submit(flight, outcome)

    async def _process_batch(self, messages: list[Message]) -> list[BatchResult]:
        """process_batch over the messages, one call per user when each user's API key must be in scope."""
        if not self.billing.enabled:
            results = await self.processor.process_batch(messages)
            _check_batch_results(results, len(messages))
            return results
        by_user: dict[str, list[Message]] = {}
        for m in messages:
            by_user.setdefault(m.user_id, []).append(m)
        by_entry: dict[str, BatchResult] = {}
        for user_id, group in by_user.items():
            with await self._user_key_scope(user_id):
                results = await self.processor.process_batch(group)
            _check_batch_results(results, len(group))
            by_entry.update(zip((m.entry_id for m in group), results, strict=True))
        return [by_entry[m.entry_id] for m in messages]

    async def _user_key_scope(self, user_id: str) -> contextlib.AbstractContextManager[object]:
        # A billing outage raises BillingUnavailableError here: transient, retried like any other failure.
        key = await self.billing.key_for(user_id)
        if key is None:
            return contextlib.nullcontext()
        return api_key_scope(key, swap_env=self._swap_env_key)

    def _submit(self, flight: InFlight, outcome: Outcome) -> None:
        """Hand the flight's outcome to the settler, unless one was already: a call given up past its timeout that
        ends after all must not commit a record that was retried meanwhile."""
        if flight.submitted:
            log.warning("late_outcome_ignored", record_id=flight.message.record_id, outcome=outcome.disposition.name)
            return
        flight.submitted = True
        outcome.lane = flight.lane
        self.settler.submit(outcome)

    def _give_up(self, flight: InFlight, outcome: Outcome) -> None:
        """Settle a flight whose call is still running, and cancel that call once more."""
        self._submit(flight, outcome)
        if flight.task:
            flight.task.cancel()

    def _raised_outcome(self, flight: InFlight, exc: BaseException, started: float) -> Outcome:
        """What the processor call raised: the worker's own cancellation (the timeout watchdog, the shutdown) is
        told apart here, where the task is; the policy decides the rest."""
        task = asyncio.current_task()
        by_worker = isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0
        return self.policy.of_raised(
            flight.message, exc, started, cancelled_by_worker=by_worker, timed_out=flight.timed_out
        )

    def _settle_without_flight(self, lane: Lane, outcome: Outcome) -> None:
        """Hand the settler an entry that never was in flight; until settled, a history read passes it by."""
        lane.history.handed_over(outcome.entry_id)
        outcome.lane = lane.index
        self.settler.submit(outcome)

    def _on_circuit_change(self, state: CircuitState) -> None:
        self._m_circuit.set(state)
        if state is CircuitState.HALF_OPEN:
            # Messages left pending while open are ours: offer them to the trial calls first.
            self._reread_own_pending()


def _check_batch_results(results: object, expected: int) -> None:
    if not isinstance(results, list) or len(results) != expected:
        got = f"{len(results)} results" if isinstance(results, list) else type(results).__name__
        raise TypeError(f"process_batch() must return a list of one result per record ({expected}), not {got}")
