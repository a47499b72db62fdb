"""The stage loop: read, claim, process, settle — with every guarantee of the original design.

Round trips are amortised over batches: one XREADGROUP, one claim script (locks + idempotency markers)
and, for everything that finished meanwhile, one settle script. Per message the runtime adds no round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix.worker_runtime import metrics
from phoenix.worker_runtime.billing import ApiKeyProvider, api_key_scope
from phoenix.worker_runtime.circuit_breaker import CircuitBreaker, CircuitState
from phoenix.worker_runtime.dlq import dead_letter_fields
from phoenix.worker_runtime.locks import Claim, RecordLocks
from phoenix.worker_runtime.messages import MalformedEntry, Message, output_fields, parse_entry
from phoenix.worker_runtime.processor import BaseProcessor, PermanentError
from phoenix.worker_runtime.reclaim import Entry, Reclaimer
from phoenix.worker_runtime.retry import RetryScheduler, retry_member
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.settle import Action, Outcome, Settler
from phoenix.worker_runtime.tracing import MessageTracing

log = structlog.get_logger("phoenix.worker")


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
    task: asyncio.Task[None] | None = None
    timed_out: bool = False

_RECLAIM_BATCH = 100
# Reads stay small enough that the next batch is read and claimed while earlier ones are processed and
# settled: Redis and Python then work at the same time instead of taking turns.
_READ_BATCH = 200
_ALIVE_WITHIN_SECONDS = 60.0


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        processor: BaseProcessor,
        client: Redis,
        billing: ApiKeyProvider,
        *,
        swap_env_key: bool = False,
    ) -> None:
        """`client` must return bytes (decode_responses=False): entries are decoded here, one by one."""
        self.settings = settings
        self.processor = processor
        self.billing = billing
        self._swap_env_key = swap_env_key
        self.redis = client
        self.locks = RecordLocks(client, settings)
        self.settler = Settler(client, settings, self.locks.token, self._on_settled)
        self.retries = RetryScheduler(client, settings)
        self.reclaimer = Reclaimer(client, settings)
        # Built after the processor's initialize(), which is where a team configures an OpenTelemetry SDK.
        self._tracing = MessageTracing(settings.service_name)
        stage = settings.service_name
        self.breaker = CircuitBreaker(
            settings.circuit_failure_threshold,
            settings.circuit_reset_timeout,
            settings.circuit_half_open_calls,
            on_change=self._on_circuit_change,
        )
        self.in_flight: dict[str, InFlight] = {}
        self._dead_letters_unsettled: set[str] = set()  # so a history read cannot dead-letter them twice
        self._slots_used = 0
        self._slot_freed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        # Per-message success lines are info; skipping their arguments matters at tens of thousands a second.
        self._log_each_message = settings.log_level in ("debug", "info")
        self._reread_own_pending = True  # at start: own pending entries first (id 0), then new ones (>)
        self.last_beat = time.monotonic()
        self._m_outcome = {o: metrics.MESSAGES.labels(stage, o) for o in
                           ("processed", "skipped_duplicate", "retried", "dead_lettered", "deferred")}
        self._m_duration = metrics.PROCESSING_SECONDS.labels(stage)
        self._m_wait = metrics.QUEUE_WAIT_SECONDS.labels(stage)
        self._m_in_flight = metrics.IN_FLIGHT.labels(stage)
        self._m_circuit = metrics.CIRCUIT_STATE.labels(stage)
        self._m_reclaimed = metrics.RECLAIMED.labels(stage)
        self._m_trimmed = metrics.TRIMMED_PENDING.labels(stage)
        self._m_contention = metrics.LOCK_CONTENTION.labels(stage)
        self._m_circuit.set(CircuitState.CLOSED)

    # -- lifecycle -------------------------------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stopping.set()

    @property
    def stop_requested(self) -> bool:
        return self._stopping.is_set()

    def alive(self) -> bool:
        return time.monotonic() - self.last_beat < _ALIVE_WITHIN_SECONDS

    async def ready(self) -> tuple[bool, str]:
        if self.breaker.state is CircuitState.OPEN:
            return False, "circuit open"
        try:
            await asyncio.wait_for(self.redis.ping(), 2)
        except (RedisError, TimeoutError, OSError) as exc:
            return False, f"redis unreachable: {type(exc).__name__}"
        return True, "ok"

    async def ensure_group(self) -> None:
        """Create the group at id 0 with MKSTREAM so entries added before the first worker are not skipped."""
        s = self.settings
        try:
            await self.redis.xgroup_create(s.input_queue, s.consumer_group, id="0", mkstream=True)
            log.info("consumer_group_created", stream=s.input_queue, group=s.consumer_group)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def _wait_for_redis(self) -> bool:
        """Create the group, retrying while Redis is unreachable; False if asked to stop meanwhile."""
        delay = 0.5
        while not self._stopping.is_set():
            try:
                await self.ensure_group()
                return True
            except RedisError as exc:
                log.warning("redis_unavailable", error=str(exc), redis=self.settings.redis_url_redacted,
                            retry_in=delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                delay = min(delay * 2, 10.0)
        return False

    async def run(self) -> None:
        """Until `request_stop`: then finish in-flight work within SHUTDOWN_GRACE and return."""
        if not await self._wait_for_redis():
            return
        s = self.settings
        log.info("worker_started", input=s.input_queue, output=s.output_queue or None, group=s.consumer_group,
                 consumer=s.consumer_name, concurrency=s.concurrency, redis=s.redis_url_redacted)
        # Lock renewal, the timeout watchdog and the committer keep running while in-flight work drains.
        background = [
            asyncio.create_task(self.settler.run(), name="settler"),
            asyncio.create_task(self._every(self._renew_interval(), self._renew_locks), name="renewer"),
            asyncio.create_task(self._every(min(1.0, s.processing_timeout / 10), self._enforce_timeouts),
                                name="watchdog"),
        ]
        intake = [
            asyncio.create_task(self._intake_loop(), name="intake"),
            asyncio.create_task(self._every(s.retry_poll_interval, self._promote_retries), name="retries"),
        ]
        stop = asyncio.create_task(self._stopping.wait())
        await asyncio.wait([stop, *intake, *background], return_when=asyncio.FIRST_COMPLETED)
        await _cancel([stop, *intake])
        await self._drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settler.flush(), 30)
        await _cancel(background)
        log.info("worker_stopped")

    async def _drain(self) -> None:
        """Let in-flight messages finish; past the grace period, cancel them: they stay pending, locks released."""
        if self._tasks:
            log.info("draining", in_flight=len(self._tasks), grace_seconds=self.settings.shutdown_grace)
            _, unfinished = await asyncio.wait(self._tasks, timeout=self.settings.shutdown_grace)
            for task in unfinished:
                task.cancel()
            if unfinished:
                log.warning("shutdown_left_pending", count=len(unfinished))
                await asyncio.wait(unfinished, timeout=10)

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
        self._m_in_flight.set(len(self.in_flight))

    # -- reading ---------------------------------------------------------------------------------------------

    async def _intake_loop(self) -> None:
        """The one way work comes in: own pending entries first, idle entries of dead workers whenever a claim
        is due (every CLAIM_INTERVAL, and at start so a replacement pod picks up its predecessor's work), else
        new entries. Whatever the source, it is read into slots reserved beforehand, so CONCURRENCY holds."""
        s = self.settings
        cursor = "0"
        next_claim = time.monotonic()
        delay = 0.1
        while not self._stopping.is_set():
            self.last_beat = time.monotonic()
            if self._reread_own_pending:
                self._reread_own_pending, cursor = False, "0"
            trial_slots = self.breaker.trial_slots()
            if trial_slots == 0:
                # Open, or all half-open trials running: pull no new work until the breaker lets calls through.
                await asyncio.sleep(min(1.0, self.breaker.seconds_until_half_open() or 0.2))
                continue
            n = await self._reserve(_READ_BATCH if trial_slots is None else min(_READ_BATCH, trial_slots))
            if n == 0:
                continue
            started = 0
            try:
                if cursor == ">" and time.monotonic() >= next_claim:
                    started, done = await self._claim_idle(n)
                    if done:
                        next_claim = time.monotonic() + s.claim_interval
                else:
                    started, cursor = await self._read(cursor, n)
                delay = 0.1
            except RedisError as exc:
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    # Someone deleted the stream or group (a stage reset): recreate it and go on.
                    with contextlib.suppress(RedisError):
                        await self.ensure_group()
                    continue
                # Redis down, or the key is not a stream: say so and keep trying, never crash-loop.
                log.warning("redis_read_failed", error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
            finally:
                self._release(n - started)

    async def _read(self, cursor: str, n: int) -> tuple[int, str]:
        """XREADGROUP from `cursor` ("0": own pending history, ">": new). Returns (started, next cursor)."""
        s = self.settings
        history = cursor != ">"
        reply = await self.redis.xreadgroup(
            s.consumer_group, s.consumer_name, {s.input_queue: cursor}, count=n,
            block=None if history else s.block_ms,
        )
        entries: list[Entry] = reply[0][1] if reply else []
        if not history:
            return await self._dispatch(entries, None), ">"
        if not entries:
            return 0, ">"  # own history replayed: from now on only new entries
        counts = await self.reclaimer.delivery_counts([e[0].decode() for e in entries])
        return await self._dispatch(entries, counts), entries[-1][0].decode()

    async def _claim_idle(self, n: int) -> tuple[int, bool]:
        """XAUTOCLAIM a slice of the group's idle entries. Returns (started, whole pending list walked)."""
        entries, trimmed = await self.reclaimer.claim(n)
        if trimmed:
            self._m_trimmed.inc(trimmed)
            log.warning("trimmed_pending_cleared", count=trimmed)
        started = 0
        if entries:
            self._m_reclaimed.inc(len(entries))
            log.warning("stale_messages_claimed", count=len(entries), idle_ms=self.settings.claim_idle_ms)
            counts = await self.reclaimer.delivery_counts([e[0].decode() for e in entries])
            started = await self._dispatch(entries, counts)
        if not self.reclaimer.exhausted:
            return started, False
        gone = await self.reclaimer.forget_dead_consumers()
        if gone:
            log.info("dead_consumers_removed", consumers=gone)
        return started, True

    async def _promote_retries(self) -> None:
        moved = await self.retries.promote_due()
        if moved:
            log.info("retries_requeued", count=moved)

    async def _renew_locks(self) -> None:
        if not self.in_flight:
            return
        lost = await self.locks.renew([f.message for f in self.in_flight.values()])
        for record_id in lost:
            # The commit still refuses to forward a record twice (it checks the marker), so this is a warning.
            log.warning("lock_lost", record_id=record_id)

    async def _enforce_timeouts(self) -> None:
        """PROCESSING_TIMEOUT, enforced by one periodic scan instead of a timer per message."""
        now = time.monotonic()
        for flight in self.in_flight.values():
            if flight.deadline < now and flight.task and not flight.task.done() and not flight.timed_out:
                flight.timed_out = True
                flight.task.cancel()

    # -- dispatch: parse, poison check, claim, start ------------------------------------------------------------

    async def _dispatch(self, entries: Sequence[Entry], counts: dict[str, int] | None) -> int:
        """Parse, poison-check, claim and start; returns how many entries now hold a slot until settled.

        Every Redis call comes before anything is started, so an error here leaves no slot taken.
        """
        s = self.settings
        candidates: list[Message] = []
        dead: list[tuple[str, dict[bytes, bytes], str, str, int]] = []
        trimmed: list[str] = []
        for raw_id, raw in entries:
            entry_id = raw_id.decode()
            if entry_id in self.in_flight or entry_id in self._dead_letters_unsettled:
                continue  # our own unsettled entry seen again in a history read
            if raw is None:
                trimmed.append(entry_id)  # trimmed from the stream while pending: nothing left to process
                continue
            parsed = parse_entry(entry_id, raw, s.max_message_bytes)
            deliveries = counts.get(entry_id, 1) if counts else 1
            if isinstance(parsed, MalformedEntry):
                dead.append((entry_id, raw, parsed.reason, "MalformedMessage", 1))
            elif deliveries > s.max_deliveries:
                reason = f"delivered {deliveries} times without finishing (MAX_DELIVERIES={s.max_deliveries})"
                dead.append((entry_id, raw, reason, "PoisonMessage", deliveries))
            else:
                candidates.append(parsed)
        if trimmed:
            await self.redis.xack(s.input_queue, s.consumer_group, *trimmed)
            self._m_trimmed.inc(len(trimmed))
            log.warning("trimmed_pending_cleared", count=len(trimmed))
        claims = await self.locks.acquire(candidates) if candidates else []
        for args in dead:
            self._dead_letter(*args)
        started = len(dead)
        deadline = time.monotonic() + s.processing_timeout
        for message, claim in zip(candidates, claims, strict=True):
            if claim == Claim.ACQUIRED:
                flight = InFlight(message, deadline)
                self.in_flight[message.entry_id] = flight
                flight.task = task = asyncio.create_task(self._handle(flight))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                started += 1
            elif claim == Claim.DUPLICATE:
                self._m_outcome["skipped_duplicate"].inc()
                log.info("duplicate_skipped", record_id=message.record_id, message_id=message.entry_id)
            else:
                self._m_contention.inc()
                log.info("record_locked_elsewhere", record_id=message.record_id, message_id=message.entry_id)
        return started

    def _on_settled(self, batch: list[Outcome]) -> None:
        """Called by the settler once a batch is durable: count, log, free the slots."""
        done = time.time()
        processed = duplicates = 0
        for outcome in batch:
            flight = self.in_flight.pop(outcome.entry_id, None)
            self._dead_letters_unsettled.discard(outcome.entry_id)
            if outcome.action is not Action.COMMIT:
                continue  # dead letters, retries and deferrals were counted and logged when decided
            if outcome.duplicate:
                duplicates += 1
            else:
                processed += 1
            if self._log_each_message:
                log.info("duplicate_discarded" if outcome.duplicate else "processing_complete",
                         record_id=outcome.record_id, message_id=outcome.entry_id,
                         user_id=flight.message.user_id if flight else "",
                         duration_seconds=round(done - outcome.started_at, 6))
        self._m_outcome["processed"].inc(processed)
        self._m_outcome["skipped_duplicate"].inc(duplicates)
        self._release(len(batch))

    # -- one message ---------------------------------------------------------------------------------------------

    async def _handle(self, flight: InFlight) -> None:
        """One message from claim to settle: the processor call under the breaker, the timeout watchdog, the
        user's API key and the trace context. One coroutine, since it runs for every message."""
        m, s = flight.message, self.settings
        structlog.contextvars.bind_contextvars(record_id=m.record_id, user_id=m.user_id, message_id=m.entry_id)
        started = time.time()
        self._m_wait.observe(max(0.0, started - m.enqueued_at_ms / 1000))
        if not self.breaker.try_acquire():
            self._m_outcome["deferred"].inc()
            log.warning("circuit_open_fast_fail")
            outcome = Outcome(Action.LEAVE, m.entry_id, m.record_id, True)
        else:
            try:
                with self._tracing.span(m.record_id, m.traceparent) as traceparent:
                    if self.billing.enabled:
                        result = await self._process_with_user_key(m)
                    else:
                        result = await self.processor.process(m.record_id, m.user_id, m.data)
                if result is not None and not isinstance(result, dict):
                    raise TypeError(f"process() must return a dict or None, not {type(result).__name__}")
            except asyncio.CancelledError:
                if flight.timed_out:
                    error = TimeoutError(f"processing exceeded PROCESSING_TIMEOUT={s.processing_timeout:g}s")
                    outcome = self._failure_outcome(m, error, started)
                else:
                    # Shutdown past the grace period: leave the entry pending for the next worker, free the lock.
                    self._m_outcome["deferred"].inc()
                    outcome = Outcome(Action.LEAVE, m.entry_id, m.record_id, True)
            except Exception as exc:
                outcome = self._failure_outcome(m, exc, started)
            else:
                self._m_duration.observe(time.time() - started)
                self.breaker.record_success()
                fields = output_fields(m, result, traceparent) if result is not None and s.output_queue else ()
                outcome = Outcome(Action.COMMIT, m.entry_id, m.record_id, True, fields)
        outcome.started_at = started
        self.settler.submit(outcome)

    async def _process_with_user_key(self, m: Message) -> dict[str, Any] | None:
        # A billing outage raises BillingUnavailableError here: transient, retried like any other failure.
        key = await self.billing.key_for(m.user_id)
        if key is None:
            return await self.processor.process(m.record_id, m.user_id, m.data)
        with api_key_scope(key, swap_env=self._swap_env_key):
            return await self.processor.process(m.record_id, m.user_id, m.data)

    def _failure_outcome(self, m: Message, exc: Exception, started: float) -> Outcome:
        """PermanentError: DLQ at once, named by its type. Anything else: transient, retried with backoff."""
        self._m_duration.observe(time.time() - started)
        if not isinstance(exc, PermanentError):
            self.breaker.record_failure()
            return self._retry_outcome(m, exc)
        s = self.settings
        self._m_outcome["dead_lettered"].inc()
        log.warning("message_dead_lettered", error=str(exc), error_type=type(exc).__name__)
        fields = dead_letter_fields(m.raw, m.entry_id, error=str(exc) or type(exc).__name__,
                                    error_type=type(exc).__name__, stage=s.service_name,
                                    attempts=m.retry_count + 1)
        return Outcome(Action.DEAD_LETTER, m.entry_id, m.record_id, True, fields)

    def _retry_outcome(self, m: Message, exc: BaseException) -> Outcome:
        s = self.settings
        now = time.time()
        first = m.first_failed_at or now
        error = str(exc) or type(exc).__name__
        delay_ms, member = retry_member(m, first, f"{type(exc).__name__}: {error}", s)
        self._m_outcome["retried"].inc()
        log.warning("processing_failed_will_retry", error=error, error_type=type(exc).__name__,
                    retry_count=m.retry_count + 1, retry_in_seconds=delay_ms / 1000)
        if now - first >= s.retry_warn_after:
            log.warning("message_retrying_long", retrying_for_seconds=round(now - first), retry_count=m.retry_count + 1)
        return Outcome(Action.RETRY, m.entry_id, m.record_id, True, (delay_ms, member))

    def _dead_letter(self, entry_id: str, raw: dict[bytes, bytes], reason: str, error_type: str,
                     attempts: int) -> None:
        """Malformed or poison entries: no lock was taken, nothing to process; the DLQ keeps them with the reason."""
        fields = dead_letter_fields(raw, entry_id, error=reason, error_type=error_type,
                                    stage=self.settings.service_name, attempts=attempts)
        self._dead_letters_unsettled.add(entry_id)
        self.settler.submit(Outcome(Action.DEAD_LETTER, entry_id, "", False, fields))
        self._m_outcome["dead_lettered"].inc()
        log.warning("message_dead_lettered", message_id=entry_id, error=reason, error_type=error_type)

    def _on_circuit_change(self, state: CircuitState) -> None:
        self._m_circuit.set(state)
        if state is CircuitState.HALF_OPEN:
            # Messages left pending while open are ours: offer them to the trial calls first.
            self._reread_own_pending = True
