"""KEDA objects of a stage: a ScaledObject on its consumer group's lag, pending entries and retry set, and the
TriggerAuthentication that hands KEDA the secrets of spec.redis (passwords, CA, client certificate) from their
Secrets. Parameter names are KEDA's (pkg/scalers/redis_scaler.go, redisConnectionInfo, 2.21)."""

from __future__ import annotations

from typing import Any

from phoenix.crds import PhoenixStageSpec, RedisMode, SecretKeyRef
from phoenix.operator.builders.deployment import CERT_FILE, KEY_FILE, desired_replicas
from phoenix.operator.builders.meta import Owner, child_metadata
from phoenix.operator.builders.redis_address import RedisConnection
from phoenix.operator.builders.streams import resolve_streams
from phoenix.operator.constants import PAUSED_ANNOTATION, PAUSED_REPLICAS_ANNOTATION

KEDA_API_VERSION = "keda.sh/v1alpha1"


class AutoscalingConfigError(ValueError):
    """The spec cannot be autoscaled as written; the message says what to change."""


def trigger_authentication_name(stage: str) -> str:
    return f"{stage}-redis"


def _secret_targets(spec: PhoenixStageSpec) -> list[dict[str, str]]:
    """KEDA parameter <- Secret key, for every secret spec.redis names."""
    redis, refs = spec.redis, dict[str, SecretKeyRef]()
    if redis.password_secret_ref is not None:
        refs["password"] = redis.password_secret_ref
    if redis.sentinel is not None and redis.sentinel.password_secret_ref is not None:
        refs["sentinelPassword"] = redis.sentinel.password_secret_ref
    if redis.tls is not None and redis.tls.ca_secret_ref is not None:
        refs["ca"] = redis.tls.ca_secret_ref
    if redis.tls is not None and redis.tls.client_cert_secret_ref is not None:
        name = redis.tls.client_cert_secret_ref.name
        refs["cert"], refs["key"] = SecretKeyRef(name=name, key=CERT_FILE), SecretKeyRef(name=name, key=KEY_FILE)
    return [{"parameter": parameter, "name": ref.name, "key": ref.key} for parameter, ref in refs.items()]


def build_trigger_authentication(owner: Owner, spec: PhoenixStageSpec) -> dict[str, Any] | None:
    """The TriggerAuthentication, or None when spec.redis names no secret KEDA needs (no password, no CA, no
    client certificate)."""
    targets = _secret_targets(spec)
    if not targets:
        return None
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "TriggerAuthentication",
        "metadata": child_metadata(owner, trigger_authentication_name(owner.name)),
        "spec": {"secretTargetRef": targets},
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
    In sentinel mode the same three go through the Sentinels (redis-sentinel-streams, redis-sentinel), which name
    the current primary. KEDA trigger metadata values are all strings."""
    streams = resolve_streams(owner.name, owner.namespace, spec)
    sentinel = spec.redis.sentinel if spec.redis.mode is RedisMode.SENTINEL else None
    connection_metadata = {
        # KEDA reads a comma-separated list of host:port from either key.
        "address" if sentinel is None else "addresses": ",".join(connection.addresses),
        "databaseIndex": str(connection.database_index),
        "enableTLS": str(connection.tls).lower(),
    }
    if connection.username is not None:
        connection_metadata["username"] = connection.username
    if sentinel is not None:
        connection_metadata["sentinelMaster"] = sentinel.master_name
        if sentinel.username is not None:
            connection_metadata["sentinelUsername"] = sentinel.username
    streams_type, list_type = (
        ("redis-streams", "redis") if sentinel is None else ("redis-sentinel-streams", "redis-sentinel")
    )
    group = {"stream": streams.input, "consumerGroup": streams.consumer_group}
    lag = {
        **group,
        "lagCount": str(spec.autoscaling.lag_count),
        "activationLagCount": str(spec.autoscaling.activation_lag_count),
    }
    pending = {**group, "pendingEntriesCount": str(spec.worker.concurrency)}
    retries = {"listName": streams.retry, "listLength": str(WAKE_ONLY_TARGET)}
    auth: dict[str, Any] = {}
    if _secret_targets(spec):
        auth["authenticationRef"] = {"name": trigger_authentication_name(owner.name)}
    return [
        {"type": kind, "metadata": {**connection_metadata, **metadata}, **auth}
        for kind, metadata in ((streams_type, lag), (streams_type, pending), (list_type, retries))
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
