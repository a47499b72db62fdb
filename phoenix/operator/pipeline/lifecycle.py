"""Which stages of a pipeline are paused (pure): a pipeline's pause stops intake first, then each next stage once
what feeds it has stopped and it has drained, so that nothing is left half-way that a resume cannot finish; a
resume is at once."""

from __future__ import annotations

from collections.abc import Mapping
from graphlib import TopologicalSorter
from typing import Any

from phoenix.crds.pipeline import PhoenixPipelineSpec
from phoenix.operator.status.readiness import queue_drained


def _spec(stage: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (stage or {}).get("spec") or {}


def _status(stage: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (stage or {}).get("status") or {}


def stopped(stage: Mapping[str, Any] | None) -> bool:
    """The stage is paused and its workers are gone: its spec says paused, the operator has reconciled that
    generation, and no pod of it is ready (one still finishing its last records may yet forward them)."""
    if stage is None or not _spec(stage).get("paused"):
        return False
    status = _status(stage)
    reconciled = status.get("observedGeneration") == stage.get("metadata", {}).get("generation")
    return reconciled and int((status.get("replicas") or {}).get("ready", 0) or 0) == 0


def drained(stage: Mapping[str, Any] | None) -> bool:
    """Nothing waits in the stage's input: no backlog and nothing in flight, as its status last sampled them."""
    return queue_drained(_status(stage).get("queue") or {})


def paused_stages(spec: PhoenixPipelineSpec, stages: Mapping[str, Mapping[str, Any]]) -> dict[str, bool]:
    """Each stage's spec.paused, given its PhoenixStage as it is now (`stages`, by name; absent: not made yet).

    Not paused: each entry's own spec.paused. Paused: a first stage (nothing feeds it) at once; any other once it
    is paused already (a pause is kept until the resume), or every stage feeding it has stopped and it has
    drained."""
    if not spec.paused:
        return {entry.name: entry.spec.paused for entry in spec.stages}
    upstream = spec.upstream()
    paused: dict[str, bool] = {}
    for name in TopologicalSorter(upstream).static_order():  # a stage after those feeding it
        stage = stages.get(name)
        feeders = upstream[name]
        paused[name] = (
            not feeders
            or bool(_spec(stage).get("paused"))
            or (all(paused[f] and stopped(stages.get(f)) for f in feeders) and drained(stage))
        )
    return paused
