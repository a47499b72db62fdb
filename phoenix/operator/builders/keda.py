"""KEDA objects of a stage: a ScaledObject on its consumer group's lag, pending entries and retry set, and the
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


# Target of a trigger that only wakes a stage: ceil(value / target) asks for one pod whatever the value.
WAKE_ONLY_TARGET = 1_000_000_000


def triggers(owner: Owner, spec: PhoenixStageSpec, connection: RedisConnection) -> list[dict[str, Any]]:
    """What KEDA scales a stage on; the stage stays up while any of them is active (above zero):
    - lag (entries not yet delivered), the target per pod from spec.autoscaling: the only redis-streams mode that
      reflects new work, so the one that scales out and wakes a stage from zero;
    - pending entries (delivered, not acknowledged), one pod per CONCURRENCY of them: work a pod holds, waits to
      retry under an open circuit, or left behind when its pod died. Lag alone would let KEDA scale to zero under
      such an entry, and with no pod left to reclaim it, it would wait for the next new entry;
    - the retry set (records waiting for their next attempt), wake-only: only workers move due retries back.
    KEDA trigger metadata values are all strings."""
    streams = resolve_streams(owner.name, owner.namespace, spec)
    connection_metadata = {
        "address": connection.address,
        "databaseIndex": str(connection.database_index),
        "enableTLS": str(connection.tls).lower(),
    }
    if connection.username is not None:
        connection_metadata["username"] = connection.username
    group = {"stream": streams.input, "consumerGroup": streams.consumer_group}
    lag = {
        **group,
        "lagCount": str(spec.autoscaling.lag_count),
        "activationLagCount": str(spec.autoscaling.activation_lag_count),
    }
    pending = {**group, "pendingEntriesCount": str(spec.worker.concurrency)}
    retries = {"listName": streams.retry, "listLength": str(WAKE_ONLY_TARGET)}
    auth: dict[str, Any] = {}
    if spec.redis.password_secret_ref is not None:
        auth["authenticationRef"] = {"name": trigger_authentication_name(owner.name)}
    return [
        {"type": kind, "metadata": {**connection_metadata, **metadata}, **auth}
        for kind, metadata in (("redis-streams", lag), ("redis-streams", pending), ("redis", retries))
    ]


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
            "triggers": triggers(owner, spec, connection),
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
