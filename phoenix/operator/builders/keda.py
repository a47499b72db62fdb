"""KEDA objects of a stage: a ScaledObject on its consumer group's lag, pending entries, retry set and, for a
relayed hop, outbox (of each partition, summed by a formula), and the TriggerAuthentication that hands KEDA the
secrets of spec.redis (passwords, CA, client certificate) from their Secrets. Parameter names are KEDA's
(pkg/scalers/redis_scaler.go, redisConnectionInfo, and pkg/scalers/redis_streams_scaler.go, 2.21); the formula's
rules are KEDA 2.21's (apis/keda/v1alpha1/scaledobject_webhook.go, pkg/scaling/modifiers/formula.go)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from phoenix.crds import PhoenixStageSpec, RedisMode, SecretKeyRef
from phoenix.errors import ConfigError
from phoenix.keys import StageKeys
from phoenix.kube_names import PAUSED_ANNOTATION, PAUSED_REPLICAS_ANNOTATION
from phoenix.operator.builders.deployment import CERT_FILE, KEY_FILE, desired_replicas
from phoenix.operator.builders.meta import Owner, child_metadata
from phoenix.operator.builders.redis_address import RedisConnection, RedisUser
from phoenix.operator.builders.streams import named_outputs, resolve_streams
from phoenix.worker_runtime.lanes import routes

KEDA_API_VERSION = "keda.sh/v1alpha1"


class AutoscalingConfigError(ConfigError):
    """The spec cannot be autoscaled as written; the message says what to change."""


def trigger_authentication_name(stage: str) -> str:
    return f"{stage}-redis"


def _secret_targets(spec: PhoenixStageSpec, user: RedisUser | None) -> list[dict[str, str]]:
    """KEDA parameter <- Secret key, for every secret spec.redis names; the password is the Redis ACL user's of the
    namespace when there is one."""
    redis, refs = spec.redis, dict[str, SecretKeyRef]()
    if user is not None:
        refs["password"] = SecretKeyRef(name=user.secret, key=user.PASSWORD_KEY)
    elif redis.password_secret_ref is not None:
        refs["password"] = redis.password_secret_ref
    if redis.sentinel is not None and redis.sentinel.password_secret_ref is not None:
        refs["sentinelPassword"] = redis.sentinel.password_secret_ref
    if redis.tls is not None and redis.tls.ca_secret_ref is not None:
        refs["ca"] = redis.tls.ca_secret_ref
    if redis.tls is not None and redis.tls.client_cert_secret_ref is not None:
        name = redis.tls.client_cert_secret_ref.name
        refs["cert"], refs["key"] = SecretKeyRef(name=name, key=CERT_FILE), SecretKeyRef(name=name, key=KEY_FILE)
    return [{"parameter": parameter, "name": ref.name, "key": ref.key} for parameter, ref in refs.items()]


def build_trigger_authentication(
    owner: Owner, spec: PhoenixStageSpec, user: RedisUser | None = None
) -> dict[str, Any] | None:
    """The TriggerAuthentication, or None when spec.redis names no secret KEDA needs (no password, no CA, no
    client certificate) and the stage has no Redis ACL user `user` (whose password it is then)."""
    targets = _secret_targets(spec, user)
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
# KEDA's trigger types by Redis mode: (streams scaler, list/sorted-set scaler).
TRIGGER_TYPES = {
    RedisMode.STANDALONE: ("redis-streams", "redis"),
    RedisMode.SENTINEL: ("redis-sentinel-streams", "redis-sentinel"),
    RedisMode.CLUSTER: ("redis-cluster-streams", "redis-cluster"),
}
# Three triggers per partition (four with an outbox), each polled by KEDA every pollingInterval: beyond this many
# partitions the ScaledObject grows past what KEDA polls in time (and towards the API server's object size limit).
MAX_AUTOSCALED_PARTITIONS = 128


def _connection_metadata(spec: PhoenixStageSpec, connection: RedisConnection) -> dict[str, str]:
    """Where KEDA connects: the server (standalone), the Sentinels (sentinel) or the seed nodes (cluster)."""
    mode, sentinel = spec.redis.mode, spec.redis.sentinel
    # KEDA reads a comma-separated list of host:port from either key.
    metadata = {"address" if mode is RedisMode.STANDALONE else "addresses": ",".join(connection.addresses)}
    if mode is not RedisMode.CLUSTER:  # a cluster has database 0 only, and KEDA's cluster client takes no index
        metadata["databaseIndex"] = str(connection.database_index)
    metadata["enableTLS"] = str(connection.tls).lower()
    if connection.username is not None:
        metadata["username"] = connection.username
    if mode is RedisMode.SENTINEL and sentinel is not None:
        metadata["sentinelMaster"] = sentinel.master_name
        if sentinel.username is not None:
            metadata["sentinelUsername"] = sentinel.username
    return metadata


def relayed_partitions(
    owner: Owner, spec: PhoenixStageSpec, output_partitions: int, named_partitions: Mapping[str, int] | None = None
) -> frozenset[int | None]:
    """The partitions (None: the one lane of a stage of one partition) whose commits forward through the lane's
    outbox: the worker's own choice (worker_runtime/lanes.py), from the spec alone, slots mattering in cluster
    mode. (A worker of a standalone spec whose server runs in cluster mode finds that out from the server and
    relays too; without Redis, this takes a standalone spec for a single Redis.)"""
    keys = resolve_streams(owner.name, owner.namespace, spec)
    named = named_outputs(spec, owner.namespace, named_partitions or {})
    found = routes(keys, output_partitions, slots_matter=spec.redis.mode is RedisMode.CLUSTER, named=named)
    return frozenset(route.keys.partition for route in found if route.relayed)


def triggers(
    owner: Owner,
    spec: PhoenixStageSpec,
    connection: RedisConnection,
    relayed: frozenset[int | None],
    user: RedisUser | None = None,
) -> list[dict[str, Any]]:
    """What KEDA scales a stage on; the stage stays up while any of them is active (above zero):
    - lag (entries not yet delivered), the target per pod from spec.autoscaling: the only redis-streams mode that
      reflects new work, so the one that scales out and wakes a stage from zero;
    - pending entries (delivered, not acknowledged), one pod per CONCURRENCY of them: work a pod holds, waits to
      retry under an open circuit, or left behind when its pod died. Lag alone would let KEDA scale to zero under
      such an entry, and with no pod left to reclaim it, it would wait for the next new entry;
    - the retry set (records waiting for their next attempt), wake-only: only workers move due retries back;
    - the outbox of a lane whose hop is relayed (relayed_partitions), wake-only: its length is exactly the results
      committed and not yet relayed (a relayed entry is deleted), which only a worker relays. Without it a stage
      at zero, or whose last worker was killed before relaying, would leave them there until new work came.
    In sentinel mode the same go through the Sentinels (redis-sentinel-streams, redis-sentinel), which name
    the current primary; in cluster mode through the seed nodes (redis-cluster-streams, redis-cluster), which
    route each key to its shard. A stage of K > 1 partitions has them per partition, named
    lag<p>/pending<p>/retry<p>/outbox<p> for the formula that sums them (scaling_modifiers). `relayed`: the
    stage's relayed_partitions; `user`: its namespace's Redis ACL user. KEDA trigger metadata values are all
    strings."""
    lanes = resolve_streams(owner.name, owner.namespace, spec).lanes
    connection_metadata = _connection_metadata(spec, connection)
    streams_type, list_type = TRIGGER_TYPES[spec.redis.mode]
    auth: dict[str, Any] = {}
    if _secret_targets(spec, user):
        auth["authenticationRef"] = {"name": trigger_authentication_name(owner.name)}
    found = []
    for lane in lanes:
        group = {"stream": lane.input, "consumerGroup": lane.consumer_group}
        lag = {
            **group,
            "lagCount": str(spec.autoscaling.lag_count),
            "activationLagCount": str(spec.autoscaling.activation_lag_count),
        }
        pending = {**group, "pendingEntriesCount": str(spec.worker.concurrency)}
        retries = {"listName": lane.retry, "listLength": str(WAKE_ONLY_TARGET)}
        measured = [(streams_type, "lag", lag), (streams_type, "pending", pending), (list_type, "retry", retries)]
        if lane.partition in relayed:
            measured.append((streams_type, "outbox", _outbox_metadata(lane)))
        for kind, name, metadata in measured:
            # Named only for the formula: a stage of one partition keeps today's unnamed triggers.
            named = {} if lane.partition is None else {"name": f"{name}{lane.partition}"}
            found.append({"type": kind, **named, "metadata": {**connection_metadata, **metadata}, **auth})
    return found


def _outbox_metadata(lane: StageKeys) -> dict[str, str]:
    # No consumerGroup: KEDA's streams scaler then measures XLEN (its streamLength mode), active above
    # activationLagCount, which it reads in every mode: one entry waiting wakes the stage.
    return {"stream": lane.outbox, "streamLength": str(WAKE_ONLY_TARGET), "activationLagCount": "0"}


def scaling_modifiers(spec: PhoenixStageSpec, relayed: frozenset[int | None] = frozenset()) -> dict[str, str] | None:
    """KEDA's formula over the triggers of a stage of K > 1 partitions (None for one partition): the HPA alone
    takes the maximum of its metrics, so K evenly loaded partitions would get the pods of one. With a formula
    KEDA feeds the HPA one composite metric (target 1 per pod, so its value is the pods wanted) and decides
    activity on it alone (above activationTarget 0): the formula gives what the unnamed triggers of one partition
    give, on the sums: one pod per lagCount of total lag and per CONCURRENCY of total pending entries, at least
    one while any lag is above activationLagCount or any entry is pending, waiting to retry or waiting in the
    outbox of a `relayed` partition, else none."""
    partitions = spec.partitions
    if partitions == 1:
        return None

    def total(name: str, among: Iterable[int] = range(partitions)) -> str:
        return f"sum([{', '.join(f'{name}{p}' for p in among)}])"

    lag, pending, retry = total("lag"), total("pending"), total("retry")
    waiting = f"{pending} + {retry}"
    if relayed:
        waiting += f" + {total('outbox', sorted(p for p in relayed if p is not None))}"
    autoscaling = spec.autoscaling
    active = f"{lag} > {autoscaling.activation_lag_count} || {waiting} > 0"
    wanted = f"max(ceil({lag} / {autoscaling.lag_count}), ceil({pending} / {spec.worker.concurrency}), 1)"
    return {"formula": f"({active}) ? {wanted} : 0", "target": "1"}


def build_scaled_object(
    owner: Owner,
    spec: PhoenixStageSpec,
    connection: RedisConnection,
    output_partitions: int = 1,
    user: RedisUser | None = None,
    named_partitions: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The ScaledObject driving the stage's Deployment between replicas.min and replicas.max.

    `connection` comes from `redis_connection()` on the URL in spec.redis.urlSecretRef (with the user's name when
    the stage has a Redis ACL user `user`, whose password the TriggerAuthentication hands KEDA); `output_partitions`
    is what the Deployment's OUTPUT_PARTITIONS says (which lanes relay follows from it), `named_partitions` what
    its OUTPUTS says. Raises
    AutoscalingConfigError when that URL has a password but no passwordSecretRef tells KEDA where to read it.
    """
    if connection.has_password and spec.redis.password_secret_ref is None and user is None:
        raise AutoscalingConfigError(
            f"the Redis URL in Secret {spec.redis.url_secret_ref.name!r} has a password, but "
            "spec.redis.passwordSecretRef is not set: KEDA reads the password only from a Secret key holding it "
            "alone; add that key and reference it, or set autoscaling.enabled=false"
        )
    if spec.partitions > MAX_AUTOSCALED_PARTITIONS:
        raise AutoscalingConfigError(
            f"spec.partitions {spec.partitions} is more than KEDA can scale on ({MAX_AUTOSCALED_PARTITIONS}: three or "
            "four triggers per partition, polled every pollingInterval); use fewer partitions, or set "
            "autoscaling.enabled=false"
        )
    relayed = relayed_partitions(owner, spec, output_partitions, named_partitions)
    annotations = None
    if spec.paused:
        # paused-replicas makes KEDA hold the Deployment at 0 instead of fighting the operator's 0.
        annotations = {PAUSED_ANNOTATION: "true", PAUSED_REPLICAS_ANNOTATION: str(desired_replicas(spec))}
    scaled_object: dict[str, Any] = {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": child_metadata(owner, owner.name, annotations),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": owner.name},
            "minReplicaCount": spec.replicas.min,
            "maxReplicaCount": spec.replicas.max,
            "pollingInterval": spec.autoscaling.polling_interval,
            "cooldownPeriod": spec.autoscaling.cooldown_period,
            "triggers": triggers(owner, spec, connection, relayed, user),
        },
    }
    advanced: dict[str, Any] = {}
    if (modifiers := scaling_modifiers(spec, relayed)) is not None:
        advanced["scalingModifiers"] = modifiers
    if (window := spec.autoscaling.scale_down_stabilization_seconds) is not None:
        scale_down = {"stabilizationWindowSeconds": window}
        advanced["horizontalPodAutoscalerConfig"] = {"behavior": {"scaleDown": scale_down}}
    if advanced:
        scaled_object["spec"]["advanced"] = advanced
    return scaled_object


def scaled_object_patch(scaled_object: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that brings an existing ScaledObject to `scaled_object`.

    A merge patch removes only what it sets to null, so after an unpause the pause annotations are nulled
    explicitly; otherwise KEDA would keep the stage at zero. So is the formula of a stage back to one partition
    (KEDA would otherwise sum triggers that no longer exist) and the HPA behavior of a stage whose
    scaleDownStabilizationSeconds was unset (back to the HPA's default).
    """
    metadata, spec = scaled_object["metadata"], scaled_object["spec"]
    annotations = {PAUSED_ANNOTATION: None, PAUSED_REPLICAS_ANNOTATION: None, **(metadata.get("annotations") or {})}
    advanced = {"scalingModifiers": None, "horizontalPodAutoscalerConfig": None, **(spec.get("advanced") or {})}
    return {
        **scaled_object,
        "metadata": {**metadata, "annotations": annotations},
        "spec": {**spec, "advanced": advanced},
    }
