"""The operator's own metrics: reconcile outcomes and duration, drift repairs, per-stage gauges from a refresh."""

from __future__ import annotations

import asyncio
import contextlib

import kopf
import pytest
from prometheus_client import CollectorRegistry

from phoenix.operator.metrics import (
    REGISTRY,
    STAGE_GAUGES,
    StageGauges,
    observed_reconcile,
    record_drift_repair,
    stage_figures,
)
from phoenix.operator.record import StageRecord
from phoenix.tools.queue_stats import QueueStats

LABELS = {"namespace": "team-a", "stage": "parser"}
OUTCOMES = ("success", "retry", "failed", "error")


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def _ready_record(ready: str) -> StageRecord:
    return StageRecord("team-a", "parser", status={"conditions": [{"type": "Ready", "status": ready}]})


@pytest.mark.parametrize(
    ("raised", "outcome"),
    [
        (None, "success"),
        (kopf.TemporaryError("later"), "retry"),
        (kopf.PermanentError("never"), "failed"),
        (RuntimeError("bug"), "error"),
    ],
)
def test_a_reconcile_is_counted_by_outcome_and_timed(raised: Exception | None, outcome: str) -> None:
    before = _sample("phoenix_operator_reconciles_total", {"outcome": outcome})
    timed = _sample("phoenix_operator_reconcile_duration_seconds_count")
    with contextlib.suppress(Exception), observed_reconcile():
        if raised is not None:
            raise raised
    assert _sample("phoenix_operator_reconciles_total", {"outcome": outcome}) == before + 1
    assert _sample("phoenix_operator_reconcile_duration_seconds_count") == timed + 1


def test_a_cancelled_reconcile_is_no_outcome() -> None:
    def counted() -> float:
        return sum(_sample("phoenix_operator_reconciles_total", {"outcome": o}) for o in OUTCOMES)

    before = counted()
    with pytest.raises(asyncio.CancelledError), observed_reconcile():
        raise asyncio.CancelledError
    assert counted() == before


def test_drift_repairs_are_counted_per_stage_and_kind() -> None:
    labels = {**LABELS, "kind": "Deployment"}
    before = _sample("phoenix_operator_drift_repairs_total", labels)
    record_drift_repair("team-a", "parser", "Deployment")
    record_drift_repair("team-a", "parser", "Deployment")
    assert _sample("phoenix_operator_drift_repairs_total", labels) == before + 2


def _registry_with(gauges: StageGauges) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(gauges)
    return registry


def test_stage_gauges_carry_the_refresh_figures() -> None:
    stats = QueueStats(
        length=10, pending=2, lag=7, oldest_pending_seconds=12.5, dlq_length=1, consumers=1, group_exists=True
    )
    deployment = {"metadata": {}, "spec": {"replicas": 3}, "status": {"readyReplicas": 2}}
    gauges = StageGauges()
    registry = _registry_with(gauges)
    gauges.update([stage_figures(_ready_record("True"), stats, deployment)])
    expected = {
        "phoenix_operator_stage_ready": 1,
        "phoenix_operator_stage_ready_replicas": 2,
        "phoenix_operator_stage_desired_replicas": 3,
        "phoenix_operator_stage_backlog": 7,
        "phoenix_operator_stage_pending": 2,
        "phoenix_operator_stage_dlq_length": 1,
        "phoenix_operator_stage_oldest_unfinished_seconds": 12.5,
    }
    assert {name for name, _ in STAGE_GAUGES.values()} == set(expected)
    assert {name: registry.get_sample_value(name, LABELS) for name in expected} == expected


def test_a_stage_without_queue_figures_still_reports_readiness_and_replicas() -> None:
    """A stage whose reconcile failed (no Redis sample) is exactly the one the not-Ready alert is about."""
    gauges = StageGauges()
    registry = _registry_with(gauges)
    gauges.update([stage_figures(_ready_record("False"), None, None)])
    assert registry.get_sample_value("phoenix_operator_stage_ready", LABELS) == 0
    assert registry.get_sample_value("phoenix_operator_stage_desired_replicas", LABELS) == 0
    assert registry.get_sample_value("phoenix_operator_stage_backlog", LABELS) is None


def test_unknown_lag_is_left_out_and_a_forgotten_stage_disappears() -> None:
    stats = QueueStats(
        length=3, pending=0, lag=None, oldest_pending_seconds=None, dlq_length=0, consumers=0, group_exists=True
    )
    gauges = StageGauges()
    registry = _registry_with(gauges)
    gauges.update([stage_figures(_ready_record("True"), stats, None)])
    assert registry.get_sample_value("phoenix_operator_stage_backlog", LABELS) is None
    assert registry.get_sample_value("phoenix_operator_stage_oldest_unfinished_seconds", LABELS) is None
    assert registry.get_sample_value("phoenix_operator_stage_pending", LABELS) == 0
    gauges.update([])
    assert registry.get_sample_value("phoenix_operator_stage_pending", LABELS) is None
