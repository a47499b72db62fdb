"""Prometheus metrics of the operator, on a registry of its own (served by `phoenix operator --metrics-port`).

The per-stage gauges are a snapshot of the last status refresh cycle, replaced whole each cycle: a deleted stage
leaves no stale series behind. Alerts in manifests/monitoring/ are written against exactly these names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from phoenix.crds import ConditionType
from phoenix.operator.record import StageRecord
from phoenix.operator.status.conditions import find_condition
from phoenix.operator.status.readiness import replica_status
from phoenix.tools.queue_stats import QueueStats

REGISTRY = CollectorRegistry()

RECONCILES = Counter(
    "phoenix_operator_reconciles",
    "Reconciles of a PhoenixStage by outcome: success, retry (temporary error), failed (permanent error), error "
    "(unexpected exception, retried by kopf).",
    ["outcome"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "phoenix_operator_reconcile_duration_seconds",
    "Time one reconcile of a PhoenixStage took, whatever its outcome.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
DRIFT_REPAIRS = Counter(
    "phoenix_operator_drift_repairs",
    "Children of a stage found deleted or changed out of band and put back, by kind (Deployment, ScaledObject, "
    "TriggerAuthentication, ConsumerGroup, DLQ).",
    ["namespace", "stage", "kind"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "phoenix_operator_leader",
    "1 while this replica runs the handlers (holds the leader Lease), else 0.",
    registry=REGISTRY,
)


def record_drift_repair(namespace: str, stage: str, kind: str) -> None:
    """Count one child of stage `namespace/stage` of `kind` put back after it was deleted or changed out of band."""
    DRIFT_REPAIRS.labels(namespace, stage, kind).inc()


def _count_reconcile(outcome: str, started: float) -> None:
    RECONCILES.labels(outcome).inc()
    RECONCILE_SECONDS.observe(time.perf_counter() - started)


@contextmanager
def observed_reconcile() -> Iterator[None]:
    """Count and time the reconcile run in the block by how it ended (kopf's retry signals decide the outcome).
    A cancellation (the operator stopping) is not an outcome and is not counted."""
    started = time.perf_counter()
    try:
        yield
    except kopf.TemporaryError:
        _count_reconcile("retry", started)
        raise
    except kopf.PermanentError:
        _count_reconcile("failed", started)
        raise
    except Exception:
        _count_reconcile("error", started)
        raise
    _count_reconcile("success", started)


@dataclass(frozen=True)
class StageFigures:
    """One stage's figures as the last refresh saw them; None: not known (no Redis sample, say)."""

    namespace: str
    stage: str
    ready: bool
    ready_replicas: int
    desired_replicas: int
    backlog: int | None = None
    pending: int | None = None
    dlq_length: int | None = None
    oldest_unfinished_seconds: float | None = None


# StageFigures field -> (metric name, help): every field but namespace and stage, which are the labels.
STAGE_GAUGES: dict[str, tuple[str, str]] = {
    "ready": ("phoenix_operator_stage_ready", "1 while the stage's Ready condition is True, else 0."),
    "ready_replicas": ("phoenix_operator_stage_ready_replicas", "Ready worker pods of the stage."),
    "desired_replicas": ("phoenix_operator_stage_desired_replicas", "Worker pods the stage's Deployment wants."),
    "backlog": ("phoenix_operator_stage_backlog", "Entries of the input stream not yet delivered to a worker (lag)."),
    "pending": ("phoenix_operator_stage_pending", "Entries delivered to a worker and not yet acknowledged."),
    "dlq_length": ("phoenix_operator_stage_dlq_length", "Entries in the stage's dead-letter stream."),
    "oldest_unfinished_seconds": (
        "phoenix_operator_stage_oldest_unfinished_seconds",
        "Age of the oldest entry the stage has not finished.",
    ),
}
_LABELS = ("namespace", "stage")


def stage_figures(record: StageRecord, stats: QueueStats | None, deployment: Mapping[str, Any] | None) -> StageFigures:
    """A stage's figures from what one refresh cycle read: its queue sample, its Deployment, its status."""
    replicas = replica_status(deployment)
    ready = find_condition(record.status.get("conditions") or [], ConditionType.READY)
    queue: dict[str, Any] = {}
    if stats is not None:
        queue = {
            "backlog": stats.lag,
            "pending": stats.pending,
            "dlq_length": stats.dlq_length,
            "oldest_unfinished_seconds": stats.oldest_unfinished_seconds,
        }
    return StageFigures(
        record.namespace,
        record.name,
        ready=ready is not None and ready.get("status") == "True",
        ready_replicas=replicas.ready,
        desired_replicas=replicas.desired,
        **queue,
    )


class StageGauges(Collector):
    """The per-stage gauges, served from the latest snapshot."""

    def __init__(self) -> None:
        self._figures: tuple[StageFigures, ...] = ()

    def update(self, figures: Iterable[StageFigures]) -> None:
        self._figures = tuple(figures)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            name: GaugeMetricFamily(metric, help_text, labels=_LABELS)
            for name, (metric, help_text) in STAGE_GAUGES.items()
        }
        for figures in self._figures:
            labels = [figures.namespace, figures.stage]
            for name, family in families.items():
                value = getattr(figures, name)
                if value is not None:
                    family.add_metric(labels, float(value))
        yield from families.values()


STAGES = StageGauges()
REGISTRY.register(STAGES)
