"""The exceptions that refuse a stage (the operator's StageError, the ownership refusals shared with the worker)
keep their type through a context manager: the reconcile runs inside one (its span), and the kopf handler turns
only a StageError into a retry with backoff or a permanent error."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import kopf
import pytest

from phoenix.operator.errors import StageError, retry_delay
from phoenix.operator.stage.reconcile import kopf_retry
from phoenix.worker_runtime.ownership import KeyOfAnotherType, KeysHeld, LayoutDiffers
from phoenix.worker_runtime.tracing import operation_span

REFUSALS = [
    StageError("KubernetesApiError", "404 Not Found"),
    KeysHeld("other/router", "phoenix:{t}:router:input"),
    KeyOfAnotherType("phoenix:{t}:router:input", "string"),
    LayoutDiffers("router", 1, 4),
]


@contextlib.contextmanager
def around() -> Iterator[None]:
    yield


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda refusal: type(refusal).__name__)
def test_a_refusal_passes_through_a_context_manager_as_itself(refusal: Exception) -> None:
    with pytest.raises(type(refusal)) as raised, around():
        raise refusal
    assert raised.value is refusal


def test_a_failed_reconcile_in_its_span_is_retried_with_backoff_not_kopf_s_default() -> None:
    # A frozen StageError became a FrozenInstanceError in the span's exit, which kopf retried after its default
    # 60 s instead of the backoff (a stage waiting for KEDA's removal to show took a minute to say so).
    error = StageError("KubernetesApiError", "404 Not Found")
    with pytest.raises(StageError) as raised, operation_span("reconcile", {"phoenix.stage": "router"}):
        raise error
    retry = kopf_retry(raised.value, retry=0)
    assert isinstance(retry, kopf.TemporaryError)
    assert retry.delay == retry_delay(0) == 5.0
