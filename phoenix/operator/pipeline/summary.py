"""A pipeline's status from its stages' own (pure): ready/total, the sums of backlog, in flight and DLQ, the oldest
unfinished entry anywhere, each stage's line, and the conditions Ready, StagesReady and Paused."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from phoenix.crds import Condition, ConditionType
from phoenix.crds.pipeline import PipelineStageStatus
from phoenix.operator.pipeline.lifecycle import drained, stopped
from phoenix.operator.status.conditions import find_condition, new_condition, set_condition
from phoenix.operator.status.latency import pipeline_latency

MISSING, NOT_OWNED, PAUSED, READY, NOT_READY = "Missing", "NotOwned", "Paused", "Ready", "NotReady"
# Stages named in a condition's message, at most.
_NAMED = 5


@dataclass(frozen=True)
class StageView:
    """One entry of the pipeline and what is in the cluster under its name: its PhoenixStage when the pipeline
    owns it (None: not there yet, or `not_owned`)."""

    name: str
    stage: Mapping[str, Any] | None
    not_owned: bool = False


def _ready_condition(stage: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return find_condition(((stage or {}).get("status") or {}).get("conditions") or [], ConditionType.READY) or {}


def stage_line(view: StageView) -> PipelineStageStatus:
    """The stage's line in the pipeline's status."""
    if view.not_owned:
        return PipelineStageStatus(name=view.name, state=NOT_OWNED)
    if view.stage is None:
        return PipelineStageStatus(name=view.name, state=MISSING)
    status = view.stage.get("status") or {}
    queue = status.get("queue") or {}
    ready = _ready_condition(view.stage).get("status") == "True"
    state = PAUSED if stopped(view.stage) else READY if ready else NOT_READY
    return PipelineStageStatus(
        name=view.name,
        state=state,
        input=(status.get("streams") or {}).get("input"),
        backlog=queue.get("lag"),
        in_flight=queue.get("pending"),
        dlq=queue.get("dlqLength"),
        oldest_unfinished_seconds=queue.get("oldestUnfinishedSeconds"),
    )


def _total(values: Iterable[int | None]) -> int | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def _named(names: Sequence[str]) -> str:
    return ", ".join(names[:_NAMED]) + (f" and {len(names) - _NAMED} more" if len(names) > _NAMED else "")


def _why_not_ready(view: StageView) -> str:
    if view.not_owned:
        return f"{view.name} (a PhoenixStage of this name not made by the pipeline)"
    if view.stage is None:
        return f"{view.name} (not made yet)"
    reason = _ready_condition(view.stage).get("reason") or "Reconciling"
    return f"{view.name} ({reason})"


def pipeline_conditions(
    views: Sequence[StageView], lines: Sequence[PipelineStageStatus], paused: bool, error: Condition | None
) -> list[Condition]:
    """StagesReady, Ready (False with `error`'s reason and message while the pipeline cannot be carried out) and
    Paused."""
    ready = [line.name for line in lines if line.state in (READY, PAUSED)]
    waiting = [_why_not_ready(view) for view, line in zip(views, lines, strict=True) if line.name not in ready]
    all_ready = not waiting
    counted = f"{len(ready)} of {len(lines)} stages ready"
    stages_ready = new_condition(
        ConditionType.STAGES_READY,
        all_ready,
        "AllStagesReady" if all_ready else "StagesNotReady",
        counted if all_ready else f"{counted}; not ready: {_named(waiting)}",
    )
    if error is not None:
        ready_condition = new_condition(ConditionType.READY, False, error.reason, error.message)
    else:
        ready_condition = new_condition(
            ConditionType.READY, all_ready, "PipelineReady" if all_ready else "StagesNotReady", stages_ready.message
        )
    return [ready_condition, stages_ready, _paused_condition(views, paused)]


def _paused_condition(views: Sequence[StageView], paused: bool) -> Condition:
    if not paused:
        return new_condition(ConditionType.PAUSED, False, "Running", "spec.paused is false")
    done = [view.name for view in views if stopped(view.stage)]
    if len(done) == len(views):
        return new_condition(ConditionType.PAUSED, True, "Paused", "every stage is paused and has no worker")
    pending = []
    for view in views:
        if view.name in done:
            continue
        queue = ((view.stage or {}).get("status") or {}).get("queue") or {}
        draining = "" if drained(view.stage) else f": backlog {queue.get('lag')}, in flight {queue.get('pending')}"
        pending.append(f"{view.name}{draining}")
    message = f"paused: {_named(done) or 'none yet'}; waiting for {_named(pending)}"
    return new_condition(ConditionType.PAUSED, False, "Pausing", message)


def pipeline_status(
    current: Mapping[str, Any],
    views: Sequence[StageView],
    paused: bool,
    error: Condition | None,
    generation: int | None,
) -> dict[str, Any]:
    """The pipeline's status (wire form), its conditions merged into `current`'s so that an unchanged condition
    keeps its lastTransitionTime; the fields of `current` this function does not own (handledRestart, ...) kept."""
    lines = [stage_line(view) for view in views]
    conditions: list[dict[str, Any]] = list(current.get("conditions") or [])
    for condition in pipeline_conditions(views, lines, paused, error):
        conditions = set_condition(conditions, condition)
    ready = sum(line.state in (READY, PAUSED) for line in lines)
    oldest = [line.oldest_unfinished_seconds for line in lines if line.oldest_unfinished_seconds is not None]
    figures = {
        "observedGeneration": generation,
        "conditions": conditions,
        "ready": f"{ready}/{len(lines)}",
        "backlog": _total(line.backlog for line in lines),
        "inFlight": _total(line.in_flight for line in lines),
        "dlq": _total(line.dlq for line in lines),
        "oldestUnfinishedSeconds": max(oldest) if oldest else None,
        "latency": pipeline_latency((view.stage or {}).get("status") or {} for view in views),
        "stages": [line.to_k8s() for line in lines],
    }
    status = {**current, **figures}
    return {key: value for key, value in status.items() if value is not None}
