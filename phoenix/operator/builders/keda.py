"""KEDA objects of a stage: a ScaledObject with a redis-streams trigger on consumer-group lag, and the
TriggerAuthentication that hands KEDA the Redis password from a Secret."""

from __future__ import annotations

from typing import Any

from phoenix.crds import PhoenixStageSpec
from phoenix.operator.builders.deployment import desired_replicas
from phoenix.operator.builders.meta import Owner, child_metadata
from phoenix.operator.builders.redis_address import RedisConnection
from phoenix.operator.builders.streams import resolve_streams
from phoenix.operator.constants import PAUSED_ANNOTATION, PAUSED_REPLICAS_ANNOTATION

KEDA_API_VERSION = "keda.sh/v1alpha1"


class AutoscalingConfigError(ValueError):
    """The spec cannot be autoscaled as written; the message says what to change."""


def trigger_authentication_name(stage: str) -> str:
    return f"{stage}-redis"


def build_trigger_authentication(owner: Owner, spec: PhoenixStageSpec) -> dict[str, Any] | None:
    """The TriggerAuthentication, or None when Redis needs no password (spec.redis.passwordSecretRef unset)."""
    ref = spec.redis.password_secret_ref
    if ref is None:
        return None
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "TriggerAuthentication",
        "metadata": child_metadata(owner, trigger_authentication_name(owner.name)),
        "spec": {"secretTargetRef": [{"parameter": "password", "name": ref.name, "key": ref.key}]},
    }


def redis_streams_trigger(owner: Owner, spec: PhoenixStageSpec, connection: RedisConnection) -> dict[str, Any]:
    """Scale on the group's lag (entries not yet delivered): the only redis-streams mode that can wake a stage
    from zero replicas. KEDA trigger metadata values are all strings."""
    streams = resolve_streams(owner.name, spec)
    metadata = {
        "address": connection.address,
        "stream": streams.input,
        "consumerGroup": streams.consumer_group,
        "lagCount": str(spec.autoscaling.lag_count),
        "activationLagCount": str(spec.autoscaling.activation_lag_count),
        "databaseIndex": str(connection.database_index),
        "enableTLS": str(connection.tls).lower(),
    }
    if connection.username is not None:
        metadata["username"] = connection.username
    trigger: dict[str, Any] = {"type": "redis-streams", "metadata": metadata}
    if spec.redis.password_secret_ref is not None:
        trigger["authenticationRef"] = {"name": trigger_authentication_name(owner.name)}
    return trigger


def build_scaled_object(owner: Owner, spec: PhoenixStageSpec, connection: RedisConnection) -> dict[str, Any]:
    """The ScaledObject driving the stage's Deployment between replicas.min and replicas.max.

    `connection` comes from `redis_connection()` on the URL in spec.redis.urlSecretRef. Raises
    AutoscalingConfigError when that URL has a password but no passwordSecretRef tells KEDA where to read it.
    """
    if connection.has_password and spec.redis.password_secret_ref is None:
        raise AutoscalingConfigError(
            f"the Redis URL in Secret {spec.redis.url_secret_ref.name!r} has a password, but "
            "spec.redis.passwordSecretRef is not set: KEDA reads the password only from a Secret key holding it "
            "alone; add that key and reference it, or set autoscaling.enabled=false"
        )
    annotations = None
    if spec.paused:
        # paused-replicas makes KEDA hold the Deployment at 0 instead of fighting the operator's 0.
        annotations = {PAUSED_ANNOTATION: "true", PAUSED_REPLICAS_ANNOTATION: str(desired_replicas(spec))}
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": child_metadata(owner, owner.name, annotations),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.name},
            "minReplicaCount": spec.replicas.min,
            "maxReplicaCount": spec.replicas.max,
            "pollingInterval": spec.autoscaling.polling_interval,
            "cooldownPeriod": spec.autoscaling.cooldown_period,
            "triggers": [redis_streams_trigger(owner, spec, connection)],
        },
    }


def scaled_object_patch(scaled_object: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that brings an existing ScaledObject to `scaled_object`.

    A merge patch removes only what it sets to null, so after an unpause the pause annotations are nulled
    explicitly; otherwise KEDA would keep the stage at zero.
    """
    metadata = scaled_object["metadata"]
    annotations = {PAUSED_ANNOTATION: None, PAUSED_REPLICAS_ANNOTATION: None, **(metadata.get("annotations") or {})}
    return {**scaled_object, "metadata": {**metadata, "annotations": annotations}}
