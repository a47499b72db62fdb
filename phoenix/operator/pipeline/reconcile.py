"""Reconcile one PhoenixPipeline: make and keep one PhoenixStage per entry (its spec as the pipeline says, a hand
edit put back, a removed entry's stage deleted), never taking over a PhoenixStage of an entry's name it does not
own; pass restarts and replays on; write its status from the stages' and post its Events.

Stages are named as their entries (`kubectl get phx <name>` finds them) and labelled with the pipeline's name
(kube_names.PIPELINE_LABEL); the pipeline is their controller (ownerReference), so deleting it deletes them (the
garbage collector), each by its deletionPolicy."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from phoenix.crds import Condition, ConditionType
from phoenix.crds.pipeline import PhoenixPipeline
from phoenix.operator.builders import Owner
from phoenix.operator.builders.pipeline import owned_by, pipeline_stage, stage_changes, wanted_stage_spec
from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError, api_error
from phoenix.operator.pipeline.lifecycle import paused_stages
from phoenix.operator.pipeline.requests import fan_out
from phoenix.operator.pipeline.summary import StageView, pipeline_status
from phoenix.operator.record import PipelineRecord
from phoenix.operator.stage.children import ActionTaken
from phoenix.operator.stage.drift import describe, differences
from phoenix.operator.status.conditions import new_condition
from phoenix.operator.status.writer import status_patch

logger = logging.getLogger(__name__)

# Sources of the pipeline's Warnings, each posted once per cause (events.EventRecorder.warning).
SPEC, OWNERSHIP, API = "spec", "ownership", "api"
NOT_OWNED = "StageNotOwned"
Json = dict[str, Any]


def invalid_spec(exc: ValidationError) -> StageError:
    """The models' refusal of a pipeline the API server admitted (a cycle, a stage's own rule) as one condition."""
    problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
    return StageError("InvalidSpec", problems, permanent=True)


def _entry_names(body: Mapping[str, Any]) -> list[str]:
    """The entries' names as written, also of a spec the models refuse."""
    stages = (body.get("spec") or {}).get("stages") or []
    return [str(entry.get("name", "")) for entry in stages if isinstance(entry, Mapping)]


async def reconcile_pipeline(ctx: OperatorContext, record: PipelineRecord) -> None:
    """One pass over the pipeline `record` last saw; an API failure is a Warning and the next pass tries again."""
    body = record.body
    # Being deleted (foreground: until the garbage collector has deleted its stages): nothing is made again.
    if body is None or body.get("metadata", {}).get("deletionTimestamp"):
        return
    try:
        async with ctx.events.reporting(record, API):
            await _reconcile(ctx, record, body)
    except StageError as error:
        logger.warning("pipeline %s/%s: %s", record.namespace, record.name, error)


async def _reconcile(ctx: OperatorContext, record: PipelineRecord, body: Mapping[str, Any]) -> None:
    owner = Owner.from_body(body, ctx.cluster)
    found = await ctx.kube.pipeline_stages(record.namespace, record.name)
    owned = {stage["metadata"]["name"]: stage for stage in found if owned_by(stage, owner.uid)}
    try:
        pipeline = PhoenixPipeline.model_validate(dict(body))
    except ValidationError as exc:
        error = invalid_spec(exc)
        await ctx.events.warning(record, SPEC, error)
        shown = [StageView(name, owned.get(name)) for name in _entry_names(body)]
        await _write_status(ctx, record, shown, paused=False, error=_condition(error), changes={})
        return
    ctx.events.resolved(record, SPEC)
    spec = pipeline.spec
    wanted_paused = paused_stages(spec, owned)
    entries: Sequence[Mapping[str, Any]] = body["spec"]["stages"]
    actions: list[ActionTaken] = []
    views: list[StageView] = []
    for entry in entries:
        name = entry["name"]
        wanted = pipeline_stage(
            owner, name, wanted_stage_spec(entry["spec"], wanted_paused[name], spec.deletion_policy)
        )
        stage, action = await _keep(ctx, record, owner.uid, owned.get(name), wanted)
        if action is not None:
            actions.append(action)
        views.append(StageView(name, stage, not_owned=stage is None and action is None))
    for name, stage in owned.items():
        if name not in wanted_paused and await ctx.kube.delete_stage(record.namespace, name, stage["metadata"]["uid"]):
            record.applied.pop(name, None)
            actions.append(ActionTaken("StageDeleted", f"deleted PhoenixStage {name}: no longer in spec.stages"))
    refused = [view.name for view in views if view.not_owned]
    refusal = None
    if refused:
        refusal = StageError(
            NOT_OWNED,
            f"PhoenixStage {', '.join(refused)} exists and is not this pipeline's (no ownerReference to it): it is "
            "left alone; delete or rename it, or rename the pipeline's stage",
        )
        await ctx.events.warning(record, OWNERSHIP, refusal)
    else:
        ctx.events.resolved(record, OWNERSHIP)
    changes: dict[str, Any] = {}
    if not refused and all(view.stage is not None for view in views):
        changes, requested = await fan_out(ctx.kube, record, body, [view.name for view in views])
        actions += requested
    await _write_status(ctx, record, views, spec.paused, None if refusal is None else _condition(refusal), changes)
    for action in actions:
        await ctx.events.normal(record, action.reason, action.message)


async def _keep(
    ctx: OperatorContext, record: PipelineRecord, uid: str, stage: Json | None, wanted: Json
) -> tuple[Json | None, ActionTaken | None]:
    """Make the stage `wanted` names be `wanted`: (the stage as it is now, what was done). `stage`: the stage the
    pipeline (of `uid`) owns under that name as listed, None when the list had none (not made yet, or its label
    taken off). (None, None): a PhoenixStage of its name exists that the pipeline does not own."""
    meta = wanted["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    if stage is None:
        stage = await ctx.kube.get_stage(namespace, name)
        if stage is not None and not owned_by(stage, uid):
            return None, None
    if stage is None:
        created = await ctx.kube.create_stage(wanted)
        if created is None:  # made meanwhile by someone else: the next pass sees whose it is
            return None, None
        record.applied[name] = wanted["spec"]
        return created, ActionTaken("StageCreated", f"created PhoenixStage {name}")
    ops = stage_changes(stage, wanted)
    if not ops:
        record.applied[name] = wanted["spec"]
        return stage, None
    paths = differences(wanted["spec"], stage.get("spec") or {}, "spec") or ["spec"]
    hand_edit = record.applied.get(name) == wanted["spec"]
    patched = await ctx.kube.patch_stage(namespace, name, ops)
    if patched is None:  # changed (or deleted) meanwhile: the next pass looks again
        return stage, None
    record.applied[name] = wanted["spec"]
    if hand_edit:
        return patched, ActionTaken("StageRestored", describe("PhoenixStage", name, paths) + ": put back")
    return patched, ActionTaken("StageUpdated", f"updated PhoenixStage {name} at {', '.join(paths[:3])}")


def _condition(error: StageError) -> Condition:
    return new_condition(ConditionType.READY, False, error.reason, error.message)


async def _write_status(
    ctx: OperatorContext,
    record: PipelineRecord,
    views: Sequence[StageView],
    paused: bool,
    error: Condition | None,
    changes: Mapping[str, Any],
) -> None:
    """Patch the fields of the pipeline's status that differ from what this operator last wrote."""
    new = pipeline_status({**record.status, **changes}, views, paused, error, record.generation)
    patch = status_patch(record.status, new)
    if not patch:
        return
    try:
        if await ctx.kube.patch_pipeline_status(record.namespace, record.name, patch):
            record.status = new
    except ApiException as exc:
        raise api_error(exc) from None
