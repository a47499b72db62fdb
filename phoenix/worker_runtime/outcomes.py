"""What happens next to a record: its `Outcome`, decided here once for every way a record can end a turn.

The worker reads, claims and calls the processor; `RecordPolicy` turns what it found into an Outcome and the
settler (settle.py) only writes it. Every decision has one place:

- at intake, before any lock (`screen`, `duplicate`, `trimmed`): a malformed entry or one delivered more than
  MAX_DELIVERIES times (poison) goes to the DLQ, a duplicate is acknowledged, an entry trimmed while pending is
  only acknowledged;
- after the processor call (`of_result`, `of_raised`, `of_failure`): a dict or None commits, a Routed (a stage of
  named outputs) commits with every forward it names, a PermanentError, an unserializable result or a route to an
  output the stage does not have is dead-lettered, any other failure is retried with backoff (retry.py) until a retry
  limit dead-letters it, a timeout is a failure, the worker's own cancellation leaves the record;
- without a call (`deferred`): the circuit is open or the shutdown is past its grace, the entry stays pending.

Each decision also counts its outcome (`phoenix_messages_total`) and logs it, as it did inside the Worker.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from phoenix.worker_runtime import metrics
from phoenix.worker_runtime.circuit_breaker import CircuitBreaker
from phoenix.worker_runtime.dlq import dead_letter_fields
from phoenix.worker_runtime.messages import (
    MalformedEntry,
    Message,
    RawFields,
    failure_history,
    output_values,
    parse_entry,
    routed_values,
)
from phoenix.worker_runtime.processor import BatchResult, PermanentError, Routed
from phoenix.worker_runtime.retry import retry_member
from phoenix.worker_runtime.scrub import scrub
from phoenix.worker_runtime.settings import WorkerSettings

if TYPE_CHECKING:
    from phoenix.worker_runtime.tracing import RecordTrace

log = structlog.get_logger("phoenix.worker")

FieldValue = str | bytes | int
# What a processor's Redis calls raise while Redis cannot be reached (MasterNotFoundError is a ConnectionError).
_REDIS_UNREACHABLE = (RedisConnectionError, RedisTimeoutError)


class Disposition(enum.StrEnum):
    """What the settle does with a record; the values are settle.lua's action codes."""

    COMMIT = "C"
    DEAD_LETTER = "D"
    RETRY = "R"
    LEAVE = "L"
    SKIP = "S"  # acknowledge only: the claim found the record committed (written "s": it never holds a lock)


@dataclass(slots=True)
class Outcome:
    """One record's decided end of this turn, from the decision to the settle that writes it (settle.lua).

    `holds_lock` says whether this worker took the record's lock (the settle releases or converts it); entries
    settled without a claim (an intake dead letter, a duplicate) hold none. `fields` depends on the disposition:
    COMMIT, the forwarded entry's values but record_id (messages.output_values; `routed`: a Routed's forwards,
    messages.routed_values); DEAD_LETTER, the DLQ entry's
    fields; RETRY, the delay in ms and the retry-set member. The worker and the settler fill in the rest.
    """

    disposition: Disposition
    entry_id: str
    record_id: str
    fields: Sequence[FieldValue] = ()
    _: KW_ONLY
    holds_lock: bool
    started_at: float = 0.0
    duplicate: bool = False  # set after the write: a commit found the record committed by another worker
    routed: bool = False  # a commit forwarding to named outputs (settle.lua's F)
    lane: int = 0  # the lane (partition) of the entry: its batch is settled with that lane's keys
    trace: RecordTrace | None = None  # the record's process span, when traces are recorded (tracing.py)


@dataclass(slots=True)
class Unprocessable:
    """An entry found unfit at intake (malformed, or poison): it goes to the DLQ without a lock or a call."""

    entry_id: str
    raw: RawFields
    reason: str
    error_type: str
    attempts: int


class RecordPolicy:
    """Decides each record's Outcome (see the module docstring); the worker calls it, the settler writes it.

    `breaker`: the worker's circuit breaker, told of each success and failure of a processor call (a failure of
    Redis itself is none: the settler waits for Redis anyway).
    """

    def __init__(self, settings: WorkerSettings, breaker: CircuitBreaker) -> None:
        self._settings = settings
        self._breaker = breaker
        # The named outputs (OUTPUTS) by name: their numbers in settle.lua's F items, from 1.
        self._outputs = {name: number for number, name in enumerate(settings.outputs, 1)}
        stage = settings.service_name
        self._m_retried = metrics.MESSAGES.labels(stage, "retried")
        self._m_dead_lettered = metrics.MESSAGES.labels(stage, "dead_lettered")
        self._m_deferred = metrics.MESSAGES.labels(stage, "deferred")
        self._m_duplicate = metrics.MESSAGES.labels(stage, "skipped_duplicate")
        self._m_trimmed = metrics.TRIMMED_PENDING.labels(stage)
        self._m_duration = metrics.PROCESSING_SECONDS.labels(stage)

    # -- intake: before any lock ----------------------------------------------------------------------------------

    def screen(self, entry_id: str, raw: RawFields, deliveries: int) -> Message | Unprocessable:
        """The entry parsed, or why it never reaches the processor: malformed, or delivered more than
        MAX_DELIVERIES times without finishing (poison)."""
        s = self._settings
        # The delivery count first: an entry that keeps ending its worker before its settle is dead-lettered, whatever
        # in its content does it.
        if deliveries > s.max_deliveries:
            reason = f"delivered {deliveries} times without finishing (MAX_DELIVERIES={s.max_deliveries})"
            return Unprocessable(entry_id, raw, reason, "PoisonMessage", deliveries)
        try:
            parsed = parse_entry(entry_id, raw, s.max_message_bytes, s.max_entry_fields)
        except Exception as exc:  # an entry that cannot be parsed, for any reason, is malformed
            parsed = MalformedEntry(entry_id, raw, f"entry cannot be read: {error_line(exc)}")
        if isinstance(parsed, MalformedEntry):
            return Unprocessable(entry_id, raw, parsed.reason, "MalformedMessage", 1)
        return parsed

    def unprocessable(self, entry: Unprocessable) -> Outcome:
        """The DLQ entry of an entry `screen` refused; no lock was taken."""
        return self._dead_letter(
            entry.entry_id, "", entry.raw, entry.reason, entry.error_type, entry.attempts, holds_lock=False
        )

    def duplicate(self, m: Message) -> Outcome:
        """The claim found the record committed: the entry is acknowledged only."""
        self._m_duplicate.inc()
        log.info("duplicate_skipped", record_id=m.record_id, message_id=m.entry_id)
        return Outcome(Disposition.SKIP, m.entry_id, m.record_id, holds_lock=False)

    def trimmed(self, count: int) -> None:
        """Entries trimmed from the stream while pending on us: nothing left to process, the caller acknowledges
        them (or XAUTOCLAIM already did)."""
        self._m_trimmed.inc(count)
        log.warning("trimmed_pending_cleared", count=count)

    # -- without a call ---------------------------------------------------------------------------------------

    def deferred(self, m: Message, *, circuit_open: bool) -> Outcome:
        """The entry stays pending for a later attempt, its lock released: the circuit is open (a fast failure),
        or the worker is shutting down past its grace period."""
        self._m_deferred.inc()
        if circuit_open:
            log.warning("circuit_open_fast_fail")
        return Outcome(Disposition.LEAVE, m.entry_id, m.record_id, holds_lock=True)

    # -- after the processor call -------------------------------------------------------------------------------

    def of_result(self, m: Message, result: BatchResult, started: float, traceparent: str | None) -> Outcome:
        """What the processor gave back for one record: a dict or None commits, an exception fails, and a dict
        that cannot be written as JSON (a tuple key, a cycle) is dead-lettered: retrying returns the same. A stage
        of named outputs takes a Routed (or None) instead of a dict."""
        if isinstance(result, Routed):
            return self._of_routed(m, result, started, traceparent)
        if isinstance(result, dict) and self._outputs:
            names = ", ".join(self._outputs)
            error = f"this stage has named outputs ({names}): return Routed({{name: result}}) naming them, not a dict"
            return self._unforwardable(m, started, error, "UnroutedResult")
        if result is not None and not isinstance(result, dict):
            if not isinstance(result, BaseException):
                result = TypeError(f"a processor's result must be a dict or None, not {type(result).__name__}")
            return self.of_failure(m, result, started)
        fields: list[str] | tuple[()] = ()
        if result is not None and self._settings.output_queue:
            try:
                fields = output_values(m, result, traceparent)
            # TypeError, ValueError (a cycle), RecursionError, or anything a __str__ of the result's raises: the
            # encoding awaits nothing, so no cancellation of the worker's can be among them.
            except BaseException as exc:
                return self._unforwardable(m, started, f"the result cannot be written as JSON: {error_line(exc)}")
        self._m_duration.observe(time.time() - started)
        self._breaker.record_success()
        return Outcome(Disposition.COMMIT, m.entry_id, m.record_id, fields, holds_lock=True)

    def _of_routed(self, m: Message, result: Routed, started: float, traceparent: str | None) -> Outcome:
        """A Routed: committed with a forward to each output it names (none: committed as done), or dead-lettered
        with the reason when it names an output the stage does not have or holds what cannot be forwarded."""
        chosen = result.outputs
        if not isinstance(chosen, Mapping):
            error = f"Routed.outputs must map output names to dicts, not {type(chosen).__name__}"
            return self._unforwardable(m, started, error, "UnroutedResult")
        if unknown := [name for name in chosen if name not in self._outputs]:
            names = ", ".join(self._outputs) or "none: return a dict or None"
            error = f"routed to {', '.join(map(repr, unknown))}, not an output of this stage (its outputs: {names})"
            return self._unforwardable(m, started, error, "UnknownOutput")
        if odd := [name for name, value in chosen.items() if not isinstance(value, dict)]:
            error = f"Routed.outputs must map output names to dicts: {', '.join(odd)} got another type"
            return self._unforwardable(m, started, error, "UnroutedResult")
        fields: list[str] = []
        if chosen:
            try:
                fields = routed_values(m, [(self._outputs[n], v) for n, v in chosen.items()], traceparent)
            except BaseException as exc:  # as of_result's: the encoding awaits nothing
                return self._unforwardable(m, started, f"the result cannot be written as JSON: {error_line(exc)}")
        self._m_duration.observe(time.time() - started)
        self._breaker.record_success()
        return Outcome(Disposition.COMMIT, m.entry_id, m.record_id, fields, holds_lock=True, routed=bool(chosen))

    def _unforwardable(
        self, m: Message, started: float, error: str, error_type: str = "UnserializableResult"
    ) -> Outcome:
        """A result that can never be forwarded as it is (retrying returns the same): to the DLQ with why."""
        self._m_duration.observe(time.time() - started)
        return self._dead_letter(m.entry_id, m.record_id, m.raw, error, error_type, m.retry_count + 1, holds_lock=True)

    def of_raised(
        self, m: Message, exc: BaseException, started: float, *, cancelled_by_worker: bool, timed_out: bool
    ) -> Outcome:
        """What the processor call raised. Only the worker's own cancellation (`cancelled_by_worker`: the timeout
        watchdog, the shutdown) is a cancellation: past PROCESSING_TIMEOUT a failure, else the record is left.
        Anything else, a CancelledError of the processor's own or SystemExit included, is a failure."""
        if not cancelled_by_worker:
            return self.of_failure(m, exc, started)
        if timed_out:
            error = TimeoutError(f"processing exceeded PROCESSING_TIMEOUT={self._settings.processing_timeout:g}s")
            return self.of_failure(m, error, started)
        return self.deferred(m, circuit_open=False)

    def of_failure(self, m: Message, exc: BaseException, started: float) -> Outcome:
        """PermanentError: DLQ at once, named by its type. Anything else: transient, retried with backoff."""
        self._m_duration.observe(time.time() - started)
        if isinstance(exc, PermanentError):
            return self._dead_letter(
                m.entry_id, m.record_id, m.raw, error_text(exc), type(exc).__name__, m.retry_count + 1, holds_lock=True
            )
        # Redis unreachable (a failover's election) is not the processor's dependency failing: the settler waits
        # for Redis anyway, and an open circuit would idle the worker for CIRCUIT_RESET_TIMEOUT once it is back.
        if not isinstance(exc, _REDIS_UNREACHABLE):
            self._breaker.record_failure()
        return self._retry(m, exc)

    def retries_exhausted(self, m: Message, exc: BaseException, first: float, now: float) -> str | None:
        """Which retry limit this failure reached, if any: MAX_ATTEMPTS, MAX_RETRY_AGE, or the exception's own
        `max_attempts` (processor.PermanentError tells library authors about it)."""
        s = self._settings
        attempts = m.retry_count + 1
        own = _own_limit(exc)
        if isinstance(own, int) and 0 < own <= attempts:
            return f"{type(exc).__name__}.max_attempts={own}"
        if 0 < s.max_attempts <= attempts:
            return f"MAX_ATTEMPTS={s.max_attempts}"
        if 0 < s.max_retry_age <= now - first:
            return f"MAX_RETRY_AGE={s.max_retry_age:g}s"
        return None

    def _retry(self, m: Message, exc: BaseException) -> Outcome:
        s = self._settings
        now = time.time()
        first = m.first_failed_at or now
        error = error_text(exc)
        last_error = f"{type(exc).__name__}: {error}"
        attempts = m.retry_count + 1
        if limit := self.retries_exhausted(m, exc, first, now):
            reason = f"{attempts} attempts in {now - first:.0f}s reached {limit}; last error: {last_error}"
            history = failure_history(m, first, last_error)
            return self._dead_letter(
                m.entry_id, m.record_id, history, reason, "RetriesExhausted", attempts, holds_lock=True
            )
        delay_ms, member = retry_member(m, first, last_error, s)
        self._m_retried.inc()
        log.warning(
            "processing_failed_will_retry",
            error=error,
            error_type=type(exc).__name__,
            retry_count=attempts,
            retry_in_seconds=delay_ms / 1000,
        )
        if now - first >= s.retry_warn_after:
            log.warning("message_retrying_long", retrying_for_seconds=round(now - first), retry_count=attempts)
        return Outcome(Disposition.RETRY, m.entry_id, m.record_id, (delay_ms, member), holds_lock=True)

    def _dead_letter(
        self,
        entry_id: str,
        record_id: str,
        raw: RawFields,
        error: str,
        error_type: str,
        attempts: int,
        *,
        holds_lock: bool,
    ) -> Outcome:
        """The one way to the DLQ: the entry's fields (`raw`) with why and where it failed."""
        self._m_dead_lettered.inc()
        log.warning("message_dead_lettered", message_id=entry_id, error=error, error_type=error_type)
        fields = dead_letter_fields(
            raw, entry_id, error=error, error_type=error_type, stage=self._settings.service_name, attempts=attempts
        )
        return Outcome(Disposition.DEAD_LETTER, entry_id, record_id, fields, holds_lock=holds_lock)


# The most of an exception's text kept: what a dead letter keeps (dlq.py), and a log line stays a line.
_ERROR_CHARS = 2000


def error_text(exc: BaseException) -> str:
    """An exception's text for the DLQ, the retry set and the logs: never raising (a __str__ may raise anything),
    always UTF-8, at most _ERROR_CHARS (known secrets masked first, so that no secret's beginning is left at the
    cut)."""
    try:
        text = str(exc)
    except BaseException:  # a processor's object: even a KeyboardInterrupt of its __str__ is no interrupt of ours
        text = ""
    text = text or type(exc).__name__
    if len(text) > _ERROR_CHARS:
        text = scrub(text)[:_ERROR_CHARS]
    return text.encode(errors="backslashreplace").decode()


def error_line(exc: BaseException) -> str:
    """`Type: text`, as the logs and a dead letter's reason name a failure."""
    return f"{type(exc).__name__}: {error_text(exc)}"


def _own_limit(exc: BaseException) -> object:
    """The exception's own `max_attempts`, if reading it works (a property of the processor's may raise)."""
    try:
        return getattr(exc, "max_attempts", 0)
    except BaseException:
        return 0
