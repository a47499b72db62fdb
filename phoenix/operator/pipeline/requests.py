"""A restart or DLQ replay asked of a pipeline (the stages' own annotations, kube_names) passed on to each stage,
which carries it out as if asked directly (stage/requests.py).

A restart is kept on the pipeline like a stage's: `status.handledRestart` names the value already passed on, and
passing it again is harmless (each stage acts on a value once). A replay moves entries, so it is passed on at most
once: the pipeline's annotation is removed first (only while it still holds the value asked), then set on every
stage; an operator stopped between the two leaves the stages without it (nothing moves; ask again)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from phoenix.crds.pipeline import PIPELINE_PLURAL
from phoenix.kube_names import REPLAY_ANNOTATION, RESTART_ANNOTATION
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.record import PipelineRecord
from phoenix.operator.stage.children import ActionTaken

HANDLED_RESTART_FIELD = "handledRestart"


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("annotations") or {}


async def _annotate(kube: KubeApi, namespace: str, stages: Sequence[str], key: str, value: str) -> None:
    for name in stages:
        await kube.annotate_stage(namespace, name, key, value)


async def fan_out(
    kube: KubeApi, record: PipelineRecord, body: Mapping[str, Any], stages: Sequence[str]
) -> tuple[dict[str, Any], list[ActionTaken]]:
    """Pass the pipeline's pending restart and replay to `stages` (every stage of it, each made and owned): the
    status fields to write and the actions for Events."""
    annotations, status = _annotations(body), record.status
    changes: dict[str, Any] = {}
    actions: list[ActionTaken] = []
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    restart = annotations.get(RESTART_ANNOTATION)
    if restart is not None and restart != status.get(HANDLED_RESTART_FIELD):
        await _annotate(kube, record.namespace, stages, RESTART_ANNOTATION, restart)
        changes.update({HANDLED_RESTART_FIELD: restart, "lastFanOut": now})
        actions.append(ActionTaken("RestartRequested", f"asked every stage to restart ({', '.join(stages)})"))
    replay = annotations.get(REPLAY_ANNOTATION)
    if replay is not None and await kube.remove_stage_annotation(
        record.namespace, record.name, REPLAY_ANNOTATION, replay, PIPELINE_PLURAL
    ):
        await _annotate(kube, record.namespace, stages, REPLAY_ANNOTATION, replay)
        changes["lastFanOut"] = now
        actions.append(ActionTaken("ReplayRequested", f"asked every stage to replay {replay} of its DLQ"))
    return changes, actions
