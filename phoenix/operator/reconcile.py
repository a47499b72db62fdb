"""Bring one PhoenixStage's world in line with its spec: Redis streams and group, Deployment, KEDA objects."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError, ResponseError

from phoenix.crds import Condition, ConditionType, PhoenixStage, StreamsStatus
from phoenix.operator.builders import (
    AutoscalingConfigError,
    Owner,
    RedisUrlError,
    build_deployment,
    build_scaled_object,
    build_trigger_authentication,
    new_condition,
    redis_connection,
    resolve_streams,
    scaled_object_patch,
    trigger_authentication_name,
)
from phoenix.operator.drift import describe, differences
from phoenix.operator.errors import StageError, scrub
from phoenix.operator.kube import KubeApi
from phoenix.operator.readiness import KEDA_NOT_INSTALLED, deployment_condition, replica_status, waits_for_keda
from phoenix.operator.redis_ops import ensure_streams
from phoenix.operator.redis_pool import RedisPool
from phoenix.operator.registry import StageRecord
from phoenix.operator.scaling import deployment_replicas
from phoenix.worker_runtime.settings import redact_url


@dataclass(frozen=True)
class Action:
    """Something the operator changed, told as a Normal Event on the stage."""

    reason: str
    message: str


@dataclass(frozen=True)
class Reconciled:
    """What a successful reconcile found and did, for status and events."""

    streams: StreamsStatus
    deployment: dict[str, Any]
    autoscaling: Condition
    actions: list[Action] = field(default_factory=list)


def stage_model(body: Mapping[str, Any]) -> PhoenixStage:
    """The stage as the models read it; what they reject is a permanent InvalidSpec error."""
    try:
        return PhoenixStage.from_body(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
        raise StageError("InvalidSpec", problems, permanent=True) from None


def parse_stage(body: Mapping[str, Any]) -> PhoenixStage:
    """The validated stage, ready to run; rules the schema cannot express fail as a permanent InvalidSpec error."""
    stage = stage_model(body)
    check_stream_names(resolve_streams(stage.metadata.name, stage.spec))
    return stage


def check_stream_names(streams: StreamsStatus) -> None:
    """Input, output and DLQ must be three different streams. Checked here rather than by a CEL rule because the
    defaults derive from the stage's name (builders.streams spells those key formats once)."""
    if streams.output == streams.input:
        raise StageError(
            "InvalidSpec", f"output stream {streams.output!r} is the stage's own input stream: the stage would "
            "feed itself (its workers refuse to start so); point spec.output at another stream or stage",
            permanent=True,
        )  # fmt: skip
    if streams.dlq in (streams.input, streams.output):
        raise StageError(
            "InvalidSpec", f"the DLQ {streams.dlq!r} must differ from the input and output streams", permanent=True
        )


async def redis_url_of(kube: KubeApi, stage: PhoenixStage) -> str:
    url = await kube.secret_value(stage.metadata.namespace or "default", stage.spec.redis.url_secret_ref)
    try:
        redis_connection(url)
    except RedisUrlError as exc:
        ref = stage.spec.redis.url_secret_ref
        raise StageError("InvalidRedisUrl", f"Secret {ref.name!r} key {ref.key!r}: {exc}") from None
    return url


async def prepare_streams(pool: RedisPool, url: str, streams: StreamsStatus, existed_before: bool) -> list[Action]:
    """The stream, group and DLQ; an Action for each that had to be created (after a Redis flush: again)."""
    try:
        created = await ensure_streams(pool.client(url), streams)
    except ResponseError as exc:
        # WRONGTYPE: a key of that name exists and is not a stream; retrying will not change that by itself.
        raise StageError("StreamConflict", scrub(str(exc), url)) from None
    except (RedisError, OSError) as exc:
        message = f"cannot reach Redis at {redact_url(url)}: {type(exc).__name__}: {scrub(str(exc), url)}"
        raise StageError("RedisUnavailable", message) from None
    again = " again: it was missing (Redis flushed, or restarted without persistence)" if existed_before else ""
    actions = []
    if created.group:
        actions.append(Action(
            "ConsumerGroupCreated", f"created consumer group {streams.consumer_group} on {streams.input}{again}"
        ))  # fmt: skip
    if created.dlq:
        actions.append(Action("DlqCreated", f"created the dead-letter stream {streams.dlq}{again}"))
    return actions


def _changed(kind: str, name: str, existing: Mapping[str, Any] | None, paths: list[str]) -> Action:
    if existing is None:
        return Action(f"{kind}Created", f"created {kind} {name}")
    return Action(f"{kind}Updated", f"updated {describe(kind, name, paths)}")


async def apply_deployment(
    kube: KubeApi, owner: Owner, stage: PhoenixStage, keda_scales: bool
) -> tuple[dict[str, Any], list[Action], dict[str, Any]]:
    """Create the worker Deployment or patch the fields that differ from the spec, keeping its restart stamp and
    KEDA's replica count; nothing is written when nothing differs.

    Returns the Deployment, the actions taken and the form later watch events are compared with (KEDA's
    replica count left out of it)."""
    existing = await kube.get_deployment(owner.namespace, owner.name)
    desired = build_deployment(owner, stage.spec)
    current = None if existing is None else existing.get("spec", {}).get("replicas")
    desired["spec"]["replicas"] = deployment_replicas(stage.spec, current, keda_scales)
    watched = copy.deepcopy(desired)
    if keda_scales and not stage.spec.paused:
        del watched["spec"]["replicas"]
    if existing is None:
        return await kube.create_deployment(desired), [_changed("Deployment", owner.name, None, [])], watched
    paths = differences(desired, existing)
    if not paths:
        return existing, [], watched
    # A merge patch keeps what it does not name, such as the restart stamp in the pod template's annotations.
    patched = await kube.patch_deployment(owner.namespace, owner.name, desired)
    return patched, [_changed("Deployment", owner.name, existing, paths)], watched


async def apply_keda_object(kube: KubeApi, wanted: dict[str, Any]) -> list[Action]:
    """Create the KEDA object or merge-patch it where it differs from `wanted`."""
    kind, meta = wanted["kind"], wanted["metadata"]
    existing = await kube.get_keda_object(kind, meta["namespace"], meta["name"])
    if existing is None:
        await kube.create_keda_object({**wanted, "metadata": _present(meta)})
        return [_changed(kind, meta["name"], None, [])]
    paths = differences(wanted, existing)
    if not paths:
        return []
    await kube.patch_keda_object(wanted)
    return [_changed(kind, meta["name"], existing, paths)]


def _present(meta: Mapping[str, Any]) -> dict[str, Any]:
    """metadata without the null annotations that only a patch needs (a create must not carry them)."""
    present = {k: v for k, v in meta.items() if k != "annotations"}
    if annotations := {k: v for k, v in (meta.get("annotations") or {}).items() if v is not None}:
        present["annotations"] = annotations
    return present


async def apply_autoscaling(
    kube: KubeApi, owner: Owner, stage: PhoenixStage, url: str
) -> tuple[Condition, list[Action], dict[str, dict[str, Any]]]:
    """The ScaledObject and TriggerAuthentication, or the reason there are none: the AutoscalingReady condition,
    the actions taken and the wanted form of each KEDA object by kind."""
    spec, generation = stage.spec, stage.metadata.generation
    if not await kube.keda_installed():
        return new_condition(
            ConditionType.AUTOSCALING_READY, False, KEDA_NOT_INSTALLED,
            "the API server does not serve keda.sh/v1alpha1 ScaledObjects: install KEDA to autoscale; the stage "
            f"runs at replicas.min ({spec.replicas.min})", observed_generation=generation,
        ), [], {}  # fmt: skip
    if not spec.autoscaling.enabled:
        return new_condition(
            ConditionType.AUTOSCALING_READY, False, "AutoscalingDisabled",
            f"autoscaling.enabled is false: the stage runs at replicas.min ({spec.replicas.min})",
            observed_generation=generation,
        ), await _remove_autoscaling(kube, owner), {}  # fmt: skip
    try:
        scaled_object = build_scaled_object(owner, spec, redis_connection(url))
    except AutoscalingConfigError as exc:
        condition = new_condition(
            ConditionType.AUTOSCALING_READY, False, "InvalidAutoscaling", str(exc), observed_generation=generation
        )
        return condition, await _remove_autoscaling(kube, owner), {}
    wanted = {"ScaledObject": scaled_object_patch(scaled_object)}
    actions: list[Action] = []
    authentication = build_trigger_authentication(owner, spec)
    if authentication is None:
        name = trigger_authentication_name(owner.name)
        actions += await _delete_keda_object(kube, "TriggerAuthentication", owner, name)
    else:
        wanted["TriggerAuthentication"] = authentication
        actions += await apply_keda_object(kube, authentication)
    actions += await apply_keda_object(kube, wanted["ScaledObject"])
    state = "paused at 0 replicas" if spec.paused else f"{spec.replicas.min}..{spec.replicas.max} replicas"
    condition = new_condition(
        ConditionType.AUTOSCALING_READY, True, "ScaledObjectReady", f"KEDA scales the stage on lag ({state})",
        observed_generation=generation,
    )  # fmt: skip
    return condition, actions, wanted


async def _delete_keda_object(kube: KubeApi, kind: str, owner: Owner, name: str) -> list[Action]:
    if await kube.delete_keda_object(kind, owner.namespace, name):
        return [Action(f"{kind}Deleted", f"deleted {kind} {name}")]
    return []


async def _remove_autoscaling(kube: KubeApi, owner: Owner) -> list[Action]:
    return [
        *await _delete_keda_object(kube, "ScaledObject", owner, owner.name),
        *await _delete_keda_object(kube, "TriggerAuthentication", owner, trigger_authentication_name(owner.name)),
    ]


def _transitions(record: StageRecord, stage: PhoenixStage, autoscaling: Condition) -> list[Action]:
    """Paused/resumed and KEDA adopted, against what this operator saw before."""
    actions = []
    if record.paused is not None and record.paused != stage.spec.paused:
        actions.append(Action("Paused", "scaled to zero; entries wait in the stream") if stage.spec.paused
                       else Action("Resumed", f"back to at least replicas.min ({stage.spec.replicas.min})"))
    if waits_for_keda({"status": record.status}) and autoscaling.status == "True":
        actions.append(Action("KedaAdopted", "KEDA is installed now: the stage is handed over to its ScaledObject"))
    return actions


async def reconcile(
    kube: KubeApi, pool: RedisPool, record: StageRecord, body: Mapping[str, Any]
) -> Reconciled:
    """Idempotent: safe on create, update, drift and operator restart, and writes only what differs from the
    spec. Raises StageError when the stage cannot run."""
    stage = parse_stage(body)
    owner = Owner.from_body(body)
    streams = resolve_streams(owner.name, stage.spec)
    url = await redis_url_of(kube, stage)
    existed_before = record.streams is not None or bool(record.status.get("streams"))
    actions = await prepare_streams(pool, url, streams, existed_before)
    record.streams, record.redis_url = streams, url
    async with record.deployment_lock:
        autoscaling, keda_actions, watched = await apply_autoscaling(kube, owner, stage, url)
        keda_scales = autoscaling.status == "True"
        deployment, deployment_actions, watched["Deployment"] = await apply_deployment(kube, owner, stage, keda_scales)
    actions += keda_actions + deployment_actions + _transitions(record, stage, autoscaling)
    record.children, record.paused = watched, stage.spec.paused
    return Reconciled(streams, deployment, autoscaling, actions)


def reconciled_status(result: Reconciled, generation: int | None) -> tuple[dict[str, Any], list[Condition]]:
    """The status fields and conditions a successful reconcile writes."""
    streams = new_condition(
        ConditionType.STREAM_READY, True, "StreamReady",
        f"stream {result.streams.input} with consumer group {result.streams.consumer_group}, DLQ {result.streams.dlq}",
        observed_generation=generation,
    )  # fmt: skip
    fields = {
        "observedGeneration": generation,
        "streams": result.streams.to_k8s(),
        "replicas": replica_status(result.deployment).to_k8s(),
    }
    return fields, [streams, result.autoscaling, deployment_condition(result.deployment, generation)]


def failed_status(error: StageError, generation: int | None) -> tuple[dict[str, Any], list[Condition]]:
    condition = new_condition(
        ConditionType.STREAM_READY, False, error.reason, error.message, observed_generation=generation
    )
    return {"observedGeneration": generation}, [condition]
