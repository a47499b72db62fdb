"""Bring one PhoenixStage's world in line with its spec: Redis streams and group, Deployment, KEDA objects."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError, ResponseError

from phoenix.crds import Condition, ConditionType, PhoenixStage, StreamsStatus
from phoenix.operator.builders import (
    RESTARTED_AT_ANNOTATION,
    AutoscalingConfigError,
    Owner,
    RedisUrlError,
    build_deployment,
    build_scaled_object,
    build_trigger_authentication,
    in_namespace,
    new_condition,
    redis_connection,
    resolve_streams,
    scaled_object_patch,
    trigger_authentication_name,
)
from phoenix.operator.errors import StageError, scrub
from phoenix.operator.kube import KubeApi
from phoenix.operator.readiness import KEDA_NOT_INSTALLED, deployment_condition, replica_status
from phoenix.operator.redis_ops import ensure_streams
from phoenix.operator.redis_pool import RedisPool
from phoenix.operator.registry import StageRecord
from phoenix.operator.scaling import deployment_replicas
from phoenix.worker_runtime.settings import redact_url


@dataclass(frozen=True)
class Reconciled:
    """What a successful reconcile found, for status and events."""

    streams: StreamsStatus
    deployment: dict[str, Any]
    autoscaling: Condition


def parse_stage(body: Mapping[str, Any]) -> PhoenixStage:
    """The validated stage; rules the schema cannot express fail here as a permanent InvalidSpec error."""
    try:
        return PhoenixStage.from_body(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
        raise StageError("InvalidSpec", problems, permanent=True) from None


async def redis_url_of(kube: KubeApi, stage: PhoenixStage) -> str:
    """The stage's Redis URL as the operator and KEDA reach it from their own namespaces."""
    namespace = stage.metadata.namespace or "default"
    url = await kube.secret_value(namespace, stage.spec.redis.url_secret_ref)
    try:
        redis_connection(url)
    except RedisUrlError as exc:
        ref = stage.spec.redis.url_secret_ref
        raise StageError("InvalidRedisUrl", f"Secret {ref.name!r} key {ref.key!r}: {exc}") from None
    return in_namespace(url, namespace)


async def prepare_streams(pool: RedisPool, url: str, streams: StreamsStatus) -> None:
    try:
        await ensure_streams(pool.client(url), streams)
    except ResponseError as exc:
        # WRONGTYPE: a key of that name exists and is not a stream; retrying will not change that by itself.
        raise StageError("StreamConflict", scrub(str(exc), url)) from None
    except (RedisError, OSError) as exc:
        message = f"cannot reach Redis at {redact_url(url)}: {type(exc).__name__}: {scrub(str(exc), url)}"
        raise StageError("RedisUnavailable", message) from None


async def apply_deployment(kube: KubeApi, owner: Owner, stage: PhoenixStage, keda_scales: bool) -> dict[str, Any]:
    """Create the worker Deployment or patch it into shape, keeping its restart stamp and KEDA's replica count."""
    existing = await kube.get_deployment(owner.namespace, owner.name)
    template_annotations = (existing or {}).get("spec", {}).get("template", {}).get("metadata", {}).get(
        "annotations"
    ) or {}
    desired = build_deployment(owner, stage.spec, restarted_at=template_annotations.get(RESTARTED_AT_ANNOTATION))
    if existing is None:
        return await kube.create_deployment(desired)
    current = existing.get("spec", {}).get("replicas")
    desired["spec"]["replicas"] = deployment_replicas(stage.spec, current, keda_scales)
    return await kube.patch_deployment(owner.namespace, owner.name, desired)


async def apply_autoscaling(kube: KubeApi, owner: Owner, stage: PhoenixStage, url: str) -> Condition:
    """The ScaledObject and TriggerAuthentication, or the reason there are none; the AutoscalingReady condition."""
    spec, generation = stage.spec, stage.metadata.generation
    if not await kube.keda_installed():
        return new_condition(
            ConditionType.AUTOSCALING_READY, False, KEDA_NOT_INSTALLED,
            "the API server does not serve keda.sh/v1alpha1 ScaledObjects: install KEDA to autoscale; the stage "
            f"runs at replicas.min ({spec.replicas.min})", observed_generation=generation,
        )  # fmt: skip
    if not spec.autoscaling.enabled:
        await _remove_autoscaling(kube, owner)
        return new_condition(
            ConditionType.AUTOSCALING_READY, False, "AutoscalingDisabled",
            f"autoscaling.enabled is false: the stage runs at replicas.min ({spec.replicas.min})",
            observed_generation=generation,
        )  # fmt: skip
    try:
        scaled_object = build_scaled_object(owner, spec, redis_connection(url))
    except AutoscalingConfigError as exc:
        await _remove_autoscaling(kube, owner)
        return new_condition(
            ConditionType.AUTOSCALING_READY, False, "InvalidAutoscaling", str(exc), observed_generation=generation
        )
    authentication = build_trigger_authentication(owner, spec)
    if authentication is None:
        await kube.delete_keda_object("TriggerAuthentication", owner.namespace, trigger_authentication_name(owner.name))
    else:
        await kube.apply_keda_object(authentication)
    await kube.apply_keda_object(scaled_object, scaled_object_patch(scaled_object))
    state = "paused at 0 replicas" if spec.paused else f"{spec.replicas.min}..{spec.replicas.max} replicas"
    return new_condition(
        ConditionType.AUTOSCALING_READY, True, "ScaledObjectReady", f"KEDA scales the stage on lag ({state})",
        observed_generation=generation,
    )  # fmt: skip


async def _remove_autoscaling(kube: KubeApi, owner: Owner) -> None:
    await kube.delete_keda_object("ScaledObject", owner.namespace, owner.name)
    await kube.delete_keda_object("TriggerAuthentication", owner.namespace, trigger_authentication_name(owner.name))


async def reconcile(
    kube: KubeApi, pool: RedisPool, record: StageRecord, body: Mapping[str, Any]
) -> Reconciled:
    """Idempotent: safe on create, update and operator restart. Raises StageError when the stage cannot run."""
    stage = parse_stage(body)
    owner = Owner.from_body(body)
    streams = resolve_streams(owner.name, stage.spec)
    url = await redis_url_of(kube, stage)
    await prepare_streams(pool, url, streams)
    record.streams, record.redis_url = streams, url
    async with record.deployment_lock:
        autoscaling = await apply_autoscaling(kube, owner, stage, url)
        deployment = await apply_deployment(kube, owner, stage, keda_scales=autoscaling.status == "True")
    return Reconciled(streams, deployment, autoscaling)


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
