"""Every decision of outcomes.RecordPolicy, without Redis: what happens next to a record at intake, after its
processor call, and when it is not called at all (circuit open, shutdown). The settle that writes these outcomes
is tested against Valkey in test_worker_inprocess, test_worker_errors and test_worker_outcomes."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence

import pytest
from prometheus_client import REGISTRY
from redis.exceptions import ConnectionError as RedisConnectionError

from phoenix.worker_runtime import scrub
from phoenix.worker_runtime.circuit_breaker import CircuitBreaker, CircuitState
from phoenix.worker_runtime.messages import Message, RawFields, parse_entry
from phoenix.worker_runtime.outcomes import Disposition, Outcome, RecordPolicy, Unprocessable, error_text
from phoenix.worker_runtime.processor import PermanentError, RecordNotFoundError
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.sample_stage import finished

RAW: RawFields = {b"record_id": b"r1", b"user_id": b"u1", b"data": b'{"n": 1}'}


def _policy(**settings: object) -> tuple[RecordPolicy, CircuitBreaker, str]:
    """A policy of a stage of its own (its counters start at 0), with a breaker opening at the third failure."""
    stage = f"policy-{uuid.uuid4().hex[:8]}"
    s = WorkerSettings(service_name=stage, processor="p", output_queue="next", **settings)  # type: ignore[arg-type]
    breaker = CircuitBreaker(3, 60, 1)
    return RecordPolicy(s, breaker), breaker, stage


def _message(retry_count: int = 0, first_failed_at: float | None = None) -> Message:
    raw = dict(RAW)
    if retry_count:
        raw[b"retry_count"] = str(retry_count).encode()
        raw[b"first_failed_at"] = repr(first_failed_at or time.time()).encode()
    m = parse_entry("1700000000000-0", raw, 1_000_000, 1000)
    assert isinstance(m, Message)
    return m


def _dlq_fields(outcome: Outcome) -> dict[str, str]:
    values = [v.decode() if isinstance(v, bytes) else str(v) for v in outcome.fields]
    keys: Sequence[str] = values[::2]
    return dict(zip(keys, values[1::2], strict=True))


# -- after the processor call -------------------------------------------------------------------------------------


def test_a_dict_commits_with_the_values_forwarded_and_the_breaker_told() -> None:
    policy, breaker, _ = _policy()
    breaker.record_failure()
    outcome = policy.of_result(_message(), {"ok": True}, time.time(), "00-trace")
    assert (outcome.disposition, outcome.entry_id, outcome.record_id) == (Disposition.COMMIT, "1700000000000-0", "r1")
    # entered_at: the entry id's time (the entry has none); no deadline.
    assert list(outcome.fields) == ["u1", '{"ok":true}', "1700000000000", "", "00-trace"] and outcome.holds_lock
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is CircuitState.CLOSED  # the success reset the count: two failures since


def test_none_commits_without_forwarding_anything() -> None:
    policy, _, _ = _policy()
    outcome = policy.of_result(_message(), None, time.time(), None)
    assert (outcome.disposition, tuple(outcome.fields)) == (Disposition.COMMIT, ())


def test_a_result_json_cannot_hold_is_dead_lettered_at_once() -> None:
    policy, _, stage = _policy()
    outcome = policy.of_result(_message(retry_count=2), {(1, 2): "tuple key"}, time.time(), None)  # type: ignore[dict-item]
    assert outcome.disposition is Disposition.DEAD_LETTER and outcome.holds_lock
    fields = _dlq_fields(outcome)
    assert fields["error_type"] == "UnserializableResult" and fields["attempts"] == "3"
    assert fields["error"].startswith("the result cannot be written as JSON: TypeError")
    assert finished("dead_lettered", stage) == 1


@pytest.mark.parametrize("result", [ValueError("returned, not raised"), "not a dict"])
def test_an_exception_or_a_non_dict_returned_is_a_failure(result: object) -> None:
    policy, _, _ = _policy()
    outcome = policy.of_result(_message(), result, time.time(), None)  # type: ignore[arg-type]
    assert outcome.disposition is Disposition.RETRY


def test_a_transient_failure_is_retried_after_base_x_2_to_the_retries_so_far() -> None:
    policy, _, stage = _policy(retry_base_seconds=1.5, retry_max_seconds=100)
    delays = [policy.of_failure(_message(retry_count=n), OSError("down"), time.time()).fields[0] for n in range(8)]
    assert delays == [1500, 3000, 6000, 12000, 24000, 48000, 96000, 100000]
    assert finished("retried", stage) == 8


def test_a_retry_carries_the_failure_history_into_its_retry_set_member() -> None:
    policy, _, _ = _policy()
    outcome = policy.of_failure(_message(retry_count=1, first_failed_at=1000.0), OSError("disk gone"), time.time())
    assert outcome.disposition is Disposition.RETRY and outcome.holds_lock
    member = json.loads(str(outcome.fields[1]))
    history = dict(zip(member[::2], member[1::2], strict=True))
    assert (history["record_id"], history["retry_count"], history["first_failed_at"]) == ("r1", "2", "1000.0")
    assert history["last_error"] == "OSError: disk gone"


def test_failures_open_the_circuit_but_redis_being_unreachable_does_not() -> None:
    policy, breaker, _ = _policy()
    for _ in range(3):
        assert policy.of_failure(_message(), RedisConnectionError("failover"), time.time()).disposition is (
            Disposition.RETRY
        )
    assert breaker.state is CircuitState.CLOSED
    for _ in range(3):
        policy.of_failure(_message(), OSError("the model is down"), time.time())
    assert breaker.state is CircuitState.OPEN


@pytest.mark.parametrize("error", [PermanentError("bad input"), RecordNotFoundError("no r1")])
def test_a_permanent_error_is_dead_lettered_at_once_named_by_its_type(error: PermanentError) -> None:
    policy, breaker, stage = _policy()
    outcome = policy.of_failure(_message(retry_count=4), error, time.time())
    assert outcome.disposition is Disposition.DEAD_LETTER and outcome.holds_lock
    fields = _dlq_fields(outcome)
    assert (fields["error_type"], fields["error"], fields["attempts"]) == (type(error).__name__, str(error), "5")
    assert (fields["record_id"], fields["stage"], fields["original_id"]) == ("r1", stage, "1700000000000-0")
    assert finished("dead_lettered", stage) == 1 and finished("retried", stage) == 0
    for _ in range(3):  # the record's fault, not the processor's dependency's: the circuit stays closed
        policy.of_failure(_message(), error, time.time())
    assert breaker.state is CircuitState.CLOSED


class _BilledError(Exception):
    max_attempts = 3


@pytest.mark.parametrize(
    ("settings", "error", "retry_count", "first_failed_ago", "limit"),
    [
        ({"max_attempts": 4}, OSError("x"), 3, 1, "MAX_ATTEMPTS=4"),
        ({"max_retry_age": 60}, OSError("x"), 1, 61, "MAX_RETRY_AGE=60s"),
        ({}, _BilledError("x"), 2, 1, "_BilledError.max_attempts=3"),
    ],
)
def test_a_failure_past_a_retry_limit_is_dead_lettered_with_its_history(
    settings: dict[str, float], error: Exception, retry_count: int, first_failed_ago: float, limit: str
) -> None:
    policy, _, _ = _policy(**settings)
    m = _message(retry_count=retry_count, first_failed_at=time.time() - first_failed_ago)
    outcome = policy.of_failure(m, error, time.time())
    assert outcome.disposition is Disposition.DEAD_LETTER
    fields = _dlq_fields(outcome)
    assert fields["error_type"] == "RetriesExhausted" and f"reached {limit}; last error: " in fields["error"]
    assert fields["retry_count"] == str(retry_count + 1) and fields["attempts"] == str(retry_count + 1)


def test_one_attempt_short_of_the_limits_is_still_retried() -> None:
    policy, _, _ = _policy(max_attempts=4, max_retry_age=60)
    m = _message(retry_count=2, first_failed_at=time.time() - 30)
    assert policy.of_failure(m, OSError("x"), time.time()).disposition is Disposition.RETRY
    assert policy.of_failure(_message(retry_count=1), _BilledError("x"), time.time()).disposition is Disposition.RETRY


def test_a_timeout_is_a_failure_and_the_shutdown_leaves_the_record() -> None:
    policy, _, stage = _policy(processing_timeout=7)
    cancelled = asyncio.CancelledError()
    timed_out = policy.of_raised(_message(), cancelled, time.time(), cancelled_by_worker=True, timed_out=True)
    assert timed_out.disposition is Disposition.RETRY
    assert "TimeoutError: processing exceeded PROCESSING_TIMEOUT=7s" in str(timed_out.fields[1])
    left = policy.of_raised(_message(), cancelled, time.time(), cancelled_by_worker=True, timed_out=False)
    assert (left.disposition, left.holds_lock, tuple(left.fields)) == (Disposition.LEAVE, True, ())
    assert finished("deferred", stage) == 1


@pytest.mark.parametrize("error", [asyncio.CancelledError(), SystemExit(3)])
def test_a_cancellation_of_the_processors_own_or_system_exit_fails_the_record(error: BaseException) -> None:
    policy, _, _ = _policy()
    outcome = policy.of_raised(_message(), error, time.time(), cancelled_by_worker=False, timed_out=False)
    assert outcome.disposition is Disposition.RETRY


# -- without a call ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("circuit_open", [True, False])
def test_an_open_circuit_and_the_shutdown_leave_the_entry_pending(circuit_open: bool) -> None:
    policy, _, stage = _policy()
    outcome = policy.deferred(_message(), circuit_open=circuit_open)
    assert (outcome.disposition, outcome.record_id, outcome.holds_lock) == (Disposition.LEAVE, "r1", True)
    assert finished("deferred", stage) == 1


# -- at intake ----------------------------------------------------------------------------------------------------


def test_a_huge_failure_message_is_cut_and_a_secret_at_the_cut_still_masked() -> None:
    """A processor's exception of megabytes made log lines of megabytes; a dead letter keeps 2,000 characters."""
    secret = f"sekrit-{uuid.uuid4().hex}"
    scrub.register(secret)
    text = error_text(ValueError("m" * 1990 + secret + "m" * 3_000_000))
    assert text == "m" * 1990 + scrub.MASK + "m" * 7


def test_a_well_formed_entry_within_max_deliveries_reaches_the_processor() -> None:
    policy, _, _ = _policy(max_deliveries=3)
    screened = policy.screen("5-0", RAW, 3)
    assert isinstance(screened, Message) and (screened.record_id, screened.data) == ("r1", {"n": 1})


def test_a_malformed_entry_is_dead_lettered_without_a_lock() -> None:
    policy, _, stage = _policy()
    raw = {b"user_id": b"u1"}
    screened = policy.screen("5-0", raw, 1)
    assert screened == Unprocessable("5-0", raw, "missing record_id", "MalformedMessage", 1)
    outcome = policy.unprocessable(screened)
    assert (outcome.disposition, outcome.entry_id, outcome.record_id) == (Disposition.DEAD_LETTER, "5-0", "")
    assert not outcome.holds_lock
    assert _dlq_fields(outcome)["error_type"] == "MalformedMessage" and finished("dead_lettered", stage) == 1


def test_an_entry_delivered_past_max_deliveries_is_poison() -> None:
    policy, _, _ = _policy(max_deliveries=3)
    screened = policy.screen("5-0", RAW, 4)
    assert isinstance(screened, Unprocessable)
    assert (screened.error_type, screened.attempts) == ("PoisonMessage", 4)
    assert screened.reason == "delivered 4 times without finishing (MAX_DELIVERIES=3)"
    assert _dlq_fields(policy.unprocessable(screened))["attempts"] == "4"


def test_a_duplicate_is_acknowledged_only() -> None:
    policy, _, stage = _policy()
    outcome = policy.duplicate(_message())
    assert (outcome.disposition, outcome.record_id, outcome.holds_lock) == (Disposition.SKIP, "r1", False)
    assert finished("skipped_duplicate", stage) == 1


def test_entries_trimmed_while_pending_are_counted() -> None:
    policy, _, stage = _policy()
    policy.trimmed(3)
    policy.trimmed(2)
    assert REGISTRY.get_sample_value("phoenix_trimmed_pending_messages_total", {"stage": stage}) == 5
