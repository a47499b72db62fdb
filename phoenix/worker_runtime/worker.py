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
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix.backoff import Backoff
from phoenix.errors import TaskEnded
from phoenix.worker_runtime import lanes, metrics, ownership
from phoenix.worker_runtime.backpressure import Backpressure
from phoenix.worker_runtime.billing import ApiKeyProvider, api_key_scope
from phoenix.worker_runtime.blocking import BLOCKING_THREADS
from phoenix.worker_runtime.circuit_breaker import CircuitBreaker, CircuitState
from phoenix.worker_runtime.intake import InFlight, Intake, Lane, Slots
from phoenix.worker_runtime.latency import FLUSH_SECONDS as LATENCY_FLUSH_SECONDS
from phoenix.worker_runtime.latency import LatencyWindows
from phoenix.worker_runtime.locks import RecordLocks
from phoenix.worker_runtime.log import CURRENT_MESSAGE, log_info_lines
from phoenix.worker_runtime.messages import Message
from phoenix.worker_runtime.outcomes import Disposition, Outcome, RecordPolicy, error_line
from phoenix.worker_runtime.processor import BaseProcessor, BatchResult, RateLimited
from phoenix.worker_runtime.rate_limit import FLUSH_SECONDS, RateLimiter
from phoenix.worker_runtime.reclaim import Reclaimer
from phoenix.worker_runtime.redis_risk import assess_redis
from phoenix.worker_runtime.relay import Relay
from phoenix.worker_runtime.retry import RetryScheduler
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.settle import Settler
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
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _how_it_ended(task: asyncio.Task[Any]) -> str:
    """What ended a task the worker runs until it stops: its exception, a cancellation not the worker's, or a
    return."""
    if task.cancelled():
        return f"{task.get_name()} was cancelled"
    if (exc := task.exception()) is not None:
        return f"{task.get_name()} raised {error_line(exc)}"
    return f"{task.get_name()} returned"


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
    Reclaimer, HistoryReadGuard), `intake` (Intake: reads, screens and claims into the CONCURRENCY `slots`), and
    what depends on where commits forward (`_route`): `backpressure`, `trimmer`, `relay`.

    What `run` runs until `request_stop`: the intake (`intake.py`: read, screen, claim, start) and the retry
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
        stage = settings.service_name
        self.breaker = CircuitBreaker(
            settings.circuit_failure_threshold,
            settings.circuit_reset_timeout,
            settings.circuit_half_open_calls,
            on_change=self._on_circuit_change,
        )
        # A processor that overrides process_batch gets each read's records in one call.
        self._batches = type(processor).process_batch is not BaseProcessor.process_batch
        self.slots = Slots(settings.concurrency)
        self._stopping = asyncio.Event()
        # Per-message success lines are info; skipping their arguments matters at tens of thousands a second.
        self._log_each_message = settings.log_level in ("debug", "info")
        self._liveness_timeout = settings.liveness_timeout or 0.0  # always derived when unset (settings.py)
        self._liveness_failed = False  # the failure is logged once, when /healthz first reports it
        self._task_ended = ""  # which of run's tasks ended by itself, and how: /healthz fails from then on
        self.policy = RecordPolicy(settings, self.breaker)
        # RATE_LIMITS: held by every pod together, asked once per read batch (rate_limit.py).
        self.limiter = RateLimiter(client, settings) if settings.rate_limits else None
        self.intake = Intake(
            settings,
            client,
            self.lanes,
            policy=self.policy,
            locks=self.locks,
            breaker=self.breaker,
            tracing=self._tracing,
            slots=self.slots,
            stopping=self._stopping,
            start=self._start,
            ensure_group=self.ensure_group,
            limiter=self.limiter,
        )
        self._route(slots_matter=False)  # again once Redis tells whether it is a cluster (_wait_for_redis)
        # The outcomes counted once settled; the policy counts the others when it decides them.
        self._m_processed = metrics.MESSAGES.labels(stage, "processed")
        self._m_duplicate = metrics.MESSAGES.labels(stage, "skipped_duplicate")
        self._m_wait = metrics.QUEUE_WAIT_SECONDS.labels(stage)
        # Only where a record's path ends: one observe per committed record, nothing on the other stages.
        self._m_latency = metrics.PIPELINE_LATENCY_SECONDS.labels(stage, settings.pipeline) if settings.final else None
        # ... and its counts carried to the operator through Redis (latency.py).
        self.latency = None if self._m_latency is None else LatencyWindows(client, settings.keys, self._m_latency)
        metrics.IN_FLIGHT.labels(stage).set_function(self._in_flight_count)
        self._m_circuit = metrics.CIRCUIT_STATE.labels(stage)
        metrics.LEAKED_THREADS.labels(stage).set_function(lambda: BLOCKING_THREADS.leaked)
        self._m_circuit.set(CircuitState.CLOSED)

    def _route(self, *, slots_matter: bool) -> None:
        """Build what depends on where each lane's commits forward (lanes.py): the settler, backpressure, the
        trimmer and the outbox relay."""
        s, client = self.settings, self.redis
        routes = lanes.routes(s.keys, s.output_partitions, slots_matter=slots_matter, named=s.outputs)
        self.settler = Settler(client, s, self.locks.lock_value, self._on_settled, routes, self._tracing)
        self.backpressure = Backpressure(client, s, routes)
        self.trimmer = Trimmer(client, s, routes)
        self.relay = Relay(client, s, routes)
        self.intake.route(self.settler, self.backpressure, slots_matter=slots_matter)

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

    # -- lifecycle -------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    def alive(self) -> tuple[bool, str]:
        """/healthz: False, with the reasons, when only a restart helps; the first failure is logged."""
        now, limit = time.monotonic(), self._liveness_timeout
        reasons = [self._task_ended] if self._task_ended else []
        if (quiet := now - self.intake.last_beat) >= limit:
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
                claimed = await ownership.claim(self.redis, s.keys, s.stage_uid, adopt=False, cluster=s.stage_cluster)
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
        """Until `request_stop`: then finish in-flight work within SHUTDOWN_GRACE and return. Raises TaskEnded,
        after the same drain, when one of its tasks ended by itself (/healthz failing from that moment)."""
        if not await self._wait_for_redis():
            return
        s = self.settings
        log.info(
            "worker_started",
            input=s.input_queue,
            partitions=s.partitions,
            output=s.output_queue or None,
            output_partitions=s.output_partitions,
            outputs={name: o.queue for name, o in s.outputs.items()} or None,
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
        if self.limiter is not None:
            background.append(asyncio.create_task(self._every(FLUSH_SECONDS, self.limiter.flush), name="limiter"))
        if self.latency is not None:
            background.append(
                asyncio.create_task(self._every(LATENCY_FLUSH_SECONDS, self.latency.flush), name="latency")
            )
        if self.backpressure.enabled:
            background.append(
                asyncio.create_task(
                    self._every(s.backpressure_interval, self.backpressure.measure), name="backpressure"
                )
            )
        intake = [
            asyncio.create_task(self.intake.run(), name="intake"),
            asyncio.create_task(self._every(s.retry_poll_interval, self._promote_retries), name="retries"),
        ]
        stop = asyncio.create_task(self._stopping.wait())
        await asyncio.wait([stop, *intake, *relay, *background], return_when=asyncio.FIRST_COMPLETED)
        self._note_ended([*intake, *relay, *background])
        await _cancel([stop, *intake])
        await self._drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settler.flush(), 30)
        if relay:
            # The last commits may have gone to an outbox: relayed now, not left for a worker that may never come
            # (a stage scaled to zero). The loop first, so that no two relays of this worker read its pending batch.
            self._note_ended(relay)
            await _cancel(relay)
            await self.relay.finish(_RELAY_FINISH_SECONDS)
        self._note_ended(background)  # one may have ended while the work drained
        await _cancel(background)
        if self.latency is not None:  # the last commits' latencies, not left to a window nobody writes again
            try:
                await self.latency.flush()
            except RedisError as exc:
                log.warning("latency_flush_failed", error=error_line(exc))
        log.info("worker_stopped")
        if self._task_ended:
            raise TaskEnded(self._task_ended)

    def _note_ended(self, tasks: list[asyncio.Task[Any]]) -> None:
        """The first of `tasks` found ended by itself (a task of the intake may return once a stop was asked):
        logged in one line, and /healthz fails from now on."""
        if self._task_ended:
            return
        for task in tasks:
            if task.done() and (not self._stopping.is_set() or task.cancelled() or task.exception() is not None):
                self._task_ended = f"worker task {_how_it_ended(task)}"
                log.error("worker_task_ended", reason=self._task_ended, in_flight=self._in_flight_count())
                return

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
            except Exception as exc:  # Redis failing, or anything one record made a job raise: the next round tries
                job_name = getattr(job, "__name__", "?")
                log.warning("background_job_failed", job=job_name, error=error_line(exc))

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

    # -- the records the intake claimed -------------------------------------------------------------------------

    def _start(self, flights: list[InFlight]) -> None:
        """Run the processor over a read's claimed flights: one process_batch call, or one task per record."""
        if self._batches:
            task = _start_task(self._handle_batch(flights))
            for flight in flights:
                flight.task = task  # what the timeout watchdog and the shutdown cancel
            return
        for flight in flights:
            flight.task = _start_task(self._handle(flight))

    def _on_settled(self, batch: list[Outcome]) -> None:
        """Called by the settler once a batch is durable: count, log, free the slots."""
        done = time.time()
        commit = Disposition.COMMIT  # an enum member read from its class is a Python call on 3.11: once per batch
        processed = duplicates = 0
        traced = self._tracing.recording
        latency = self._m_latency
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
                if latency is not None and flight is not None:  # the record's one commit at the end of its path
                    latency.observe(max(0.0, done - flight.message.entered_at_ms / 1000))
            if self._log_each_message:
                line = {
                    "event": "duplicate_discarded" if outcome.duplicate else "processing_complete",
                    "record_id": outcome.record_id,
                    "message_id": outcome.entry_id,
                    "user_id": flight.message.user_id if flight else "",
                    "duration_seconds": round(done - outcome.started_at, 6),
                }
                if traced and outcome.trace is not None:
                    line.update(outcome.trace.ids)  # the line of the record's span
                lines.append(line)
        if lines:
            log_info_lines(lines)
        self._m_processed.inc(processed)
        self.backpressure.note_forwarded(lane.index, processed)
        self._m_duplicate.inc(duplicates)
        self.slots.release(len(batch))

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
                tracing.processed(record_trace, outcome)
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
                tracing.processed(record_trace, outcome)
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
            self._tracing.given_up(outcome)
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
        if isinstance(exc, RateLimited):
            # A provider's 429 is no failure of the record: every pod's shared limits pause, the record waits.
            m = flight.message
            if self.limiter is not None:
                self.limiter.pause(exc.retry_after, m.user_id, m.record_id)
            return self.policy.throttled(m, max(1, round(exc.retry_after * 1000)))
        task = asyncio.current_task()
        by_worker = isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling() > 0
        return self.policy.of_raised(
            flight.message, exc, started, cancelled_by_worker=by_worker, timed_out=flight.timed_out
        )

    def _on_circuit_change(self, state: CircuitState) -> None:
        self._m_circuit.set(state)
        if state is CircuitState.HALF_OPEN:
            # Messages left pending while open are ours: offer them to the trial calls first.
            self.intake.reread_own_pending()


def _check_batch_results(results: object, expected: int) -> None:
    if not isinstance(results, list) or len(results) != expected:
        got = f"{len(results)} results" if isinstance(results, list) else type(results).__name__
        raise TypeError(f"process_batch() must return a list of one result per record ({expected}), not {got}")
