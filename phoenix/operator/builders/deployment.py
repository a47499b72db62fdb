"""The worker Deployment of a stage: `phoenix worker` configured entirely through environment variables."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.utils import parse_quantity

from phoenix.crds import RESERVED_ENV_NAMES, PhoenixStageSpec, SecretKeyRef, StageRedisSpec
from phoenix.crds.pod import SHUTDOWN_MARGIN_SECONDS
from phoenix.keys import StageKeys
from phoenix.kube_names import (
    POD_KEYS_ANNOTATION,
    REDIS_TLS_DIR,
    REDIS_TLS_VOLUME,
    RESTARTED_AT_ANNOTATION,
    SCRAPE_ANNOTATION,
    SCRAPE_PATH_ANNOTATION,
    SCRAPE_PORT_ANNOTATION,
    SECRET_VERSIONS_ANNOTATION,
    TMP_DIR,
    TMP_VOLUME,
)
from phoenix.operator.builders.meta import Owner, child_metadata, selector_labels, stage_labels
from phoenix.operator.builders.redis_address import RedisUser
from phoenix.operator.builders.security import container_security_context, pod_security_context
from phoenix.operator.builders.streams import named_outputs, resolve_streams
from phoenix.operator.record import SecretsRead
from phoenix.worker_runtime.settings import WorkerSettings

HEALTH_PORT = 8080
PORT_NAME = "http"
CONTAINER_NAME = "worker"
DEFAULT_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "512Mi"},
}


# The TLS material of spec.redis.tls appears in the worker container as one read-only projected volume.
CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"  # the kubernetes.io/tls Secret's own key names
# Owner and group read only (the pod's fsGroup owns the files): the key is readable by the worker alone.
SECRET_FILE_MODE = 0o440

# The share of the pod's memory limit one read may fill (READ_MEMORY_BYTES): a read's entries take two to three
# times their size while they are decoded, beside the entries in flight and the processor's own memory.
READ_MEMORY_SHARE = 4


def _number(value: float) -> str:
    """2.0 -> "2", 0.5 -> "0.5": what a person would write in the env var."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def worker_env(
    name: str,
    spec: PhoenixStageSpec,
    streams: StageKeys,
    uid: str = "",
    output_partitions: int = 1,
    *,
    named_partitions: Mapping[str, int] | None = None,
    cluster: str = "",
    user: RedisUser | None = None,
    secret_keys: Mapping[str, tuple[str, ...]] | None = None,
) -> list[dict[str, Any]]:
    """The container env: runtime variables derived from the spec, then the spec's own extra variables. `uid` and
    `cluster`: the PhoenixStage's and its Kubernetes cluster's, by which its workers prove they are its own to the
    keys' ownership marker. `output_partitions`: the partitions of the stage `output.stage` names (its workers
    forward each record to its partition there); `named_partitions`, those of each of spec.outputs' stages, by
    output name (OUTPUTS). `user`: the Redis ACL user of the namespace, whose name and
    password replace the URL's (REDIS_USERNAME, REDIS_PASSWORD). `secret_keys`: the keys of the Secrets
    spec.pod.envFrom names, as read (SecretsRead.keys), for MASKED_ENV.

    Every reserved name (RESERVED_ENV_NAMES) is set, empty where this stage has no value for it: `env` wins over
    spec.pod.envFrom, so no ConfigMap or Secret key of that name reaches the worker."""
    memory_limit = worker_resources(spec).get("limits", {}).get("memory")
    read_memory = (
        # At least 1 (one entry per read), which the worker accepts: a limit of a few bytes ("1", "1m") gave 0.
        max(1, int(parse_quantity(memory_limit)) // READ_MEMORY_SHARE)
        if memory_limit is not None
        else WorkerSettings.model_fields["read_memory_bytes"].default
    )
    named = spec.partitions == 1  # a stage of several partitions derives one input and one DLQ per partition
    plain: dict[str, str] = {
        "SERVICE_NAME": name,
        "KEY_NAMESPACE": streams.namespace,
        "STAGE_UID": uid,
        "STAGE_CLUSTER": cluster,
        "PARTITIONS": str(spec.partitions),
        "INPUT_QUEUE": streams.input if named else "",
        "DLQ_NAME": streams.dlq if named else "",
        "CONSUMER_GROUP": streams.consumer_group,
        "PROCESSOR": spec.processor,
        **{setting.env: _number(value) for setting, value in spec.tuned_values().items()},
        "SHUTDOWN_GRACE": str(shutdown_grace(spec)),
        "HEALTH_PORT": str(HEALTH_PORT),
        # With output.stage: the next stage's input as a whole; the worker picks each record's partition of it.
        "OUTPUT_QUEUE": streams.output or "",
        "OUTPUT_PARTITIONS": str(output_partitions if spec.output is not None and spec.output.stage else 1),
        "OUTPUT_RETENTION": (spec.output.retention if spec.output is not None else None) or "",
        "OUTPUTS": _outputs_json(spec, streams.namespace, named_partitions or {}),
        "READ_MEMORY_BYTES": str(read_memory),
        **redis_plain_env(spec.redis),
        "MASKED_ENV": ",".join(_taken_from_secrets(spec, secret_keys or {})),
    }
    # An empty value is written as the name alone, as the API server stores it (drift compares the two).
    env: list[dict[str, Any]] = [{"name": key, **({"value": value} if value else {})} for key, value in plain.items()]
    env.append(_from_secret("REDIS_URL", spec.redis.url_secret_ref))
    if user is not None:
        env.append({"name": "REDIS_USERNAME", "value": user.username})
        env.append(_from_secret("REDIS_PASSWORD", SecretKeyRef(name=user.secret, key=user.PASSWORD_KEY)))
    else:
        env += [{"name": "REDIS_USERNAME"}, {"name": "REDIS_PASSWORD"}]
    sentinel_password = spec.redis.sentinel.password_secret_ref if spec.redis.sentinel is not None else None
    env.append(
        _from_secret("REDIS_SENTINEL_PASSWORD", sentinel_password)
        if sentinel_password is not None
        else {"name": "REDIS_SENTINEL_PASSWORD"}
    )
    # One consumer per pod, by the pod's name (the hostname the worker used before is cut to 63 characters, which
    # two pods of a long stage name could share).
    env.append({"name": "CONSUMER_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    for var in spec.env:
        if var.secret_key_ref is not None:
            env.append(_from_secret(var.name, var.secret_key_ref))
        else:
            env.append({"name": var.name, "value": var.value})
    return env


def _taken_from_secrets(spec: PhoenixStageSpec, secret_keys: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The variables of the worker container whose value comes from a Secret of spec.env or spec.pod.envFrom, as
    Kubernetes resolves them (`env` wins over `envFrom`), sorted: the worker masks their values (MASKED_ENV). The
    operator's own are not listed (the worker masks the passwords of REDIS_URL and REDIS_SENTINEL_PASSWORD
    itself; a URL masked whole would hide the host it names)."""
    named = {
        f"{source.prefix or ''}{key}"
        for source in spec.pod.env_from or ()
        if source.secret_ref is not None
        for key in secret_keys.get(source.secret_ref.name, ())
    }
    for var in spec.env:
        if var.secret_key_ref is not None:
            named.add(var.name)
        else:
            named.discard(var.name)
    return sorted(named.difference(RESERVED_ENV_NAMES))


def termination_grace(spec: PhoenixStageSpec) -> int:
    """spec.pod.terminationGracePeriodSeconds, or long enough for a record started just before SIGTERM to run
    its whole processingTimeout, then be committed."""
    if spec.pod.termination_grace_period_seconds is not None:
        return spec.pod.termination_grace_period_seconds
    return spec.worker.processing_timeout + SHUTDOWN_MARGIN_SECONDS


def shutdown_grace(spec: PhoenixStageSpec) -> int:
    """How long the worker drains in-flight records after SIGTERM (SHUTDOWN_GRACE): the termination grace less
    the margin its cancellations and last commits need before the kubelet's SIGKILL."""
    return max(0, termination_grace(spec) - SHUTDOWN_MARGIN_SECONDS)


def _from_secret(name: str, ref: SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def redis_plain_env(redis: StageRedisSpec) -> dict[str, str]:
    """The connection settings that are no secret: the mode, the master's name, where the TLS files are mounted
    (empty when the stage has none)."""
    sentinel, tls = redis.sentinel, redis.tls
    ca = tls is not None and tls.ca_secret_ref is not None
    client_cert = tls is not None and tls.client_cert_secret_ref is not None
    return {
        "REDIS_MODE": redis.mode.value,
        "REDIS_SENTINEL_MASTER": sentinel.master_name if sentinel is not None else "",
        "REDIS_SENTINEL_USERNAME": (sentinel.username if sentinel is not None else None) or "",
        "REDIS_TLS_CA_FILE": f"{REDIS_TLS_DIR}/{CA_FILE}" if ca else "",
        "REDIS_TLS_CERT_FILE": f"{REDIS_TLS_DIR}/{CERT_FILE}" if client_cert else "",
        "REDIS_TLS_KEY_FILE": f"{REDIS_TLS_DIR}/{KEY_FILE}" if client_cert else "",
    }


def redis_tls_volume(redis: StageRedisSpec) -> dict[str, Any] | None:
    """The CA and the client certificate as files, each Secret projected with only the keys it is read for."""
    tls = redis.tls
    sources: list[dict[str, Any]] = []
    if tls is not None and tls.ca_secret_ref is not None:
        ca = tls.ca_secret_ref
        sources.append({"secret": {"name": ca.name, "items": [{"key": ca.key, "path": CA_FILE}]}})
    if tls is not None and tls.client_cert_secret_ref is not None:
        items = [{"key": key, "path": key} for key in (CERT_FILE, KEY_FILE)]
        sources.append({"secret": {"name": tls.client_cert_secret_ref.name, "items": items}})
    if not sources:
        return None
    return {"name": REDIS_TLS_VOLUME, "projected": {"sources": sources, "defaultMode": SECRET_FILE_MODE}}


def worker_resources(spec: PhoenixStageSpec) -> dict[str, Any]:
    if spec.resources is None:
        return {section: dict(values) for section, values in DEFAULT_RESOURCES.items()}
    # A quantity as a string, whichever the spec wrote (`cpu: 1`): the client the operator creates the Deployment
    # with refuses a number there before the API server sees it.
    return {
        section: {name: str(q) for name, q in values.items()} for section, values in spec.resources.to_k8s().items()
    }


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def _outputs_json(spec: PhoenixStageSpec, namespace: str, partitions: Mapping[str, int]) -> str:
    """OUTPUTS: spec.outputs as the worker reads it (JSON, name -> queue and partitions); empty without them."""
    outputs = named_outputs(spec, namespace, partitions)
    return json.dumps({name: o.model_dump() for name, o in outputs.items()}, separators=(",", ":")) if outputs else ""


def _container(
    owner: Owner,
    spec: PhoenixStageSpec,
    output_partitions: int,
    user: RedisUser | None,
    secrets: SecretsRead,
    named_partitions: Mapping[str, int],
) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [{"name": TMP_VOLUME, "mountPath": TMP_DIR}]
    if redis_tls_volume(spec.redis) is not None:
        mounts.append({"name": REDIS_TLS_VOLUME, "mountPath": REDIS_TLS_DIR, "readOnly": True})
    mounts += [mount.to_k8s() for mount in spec.pod.volume_mounts or []]
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["phoenix", "worker"],
        "env": worker_env(
            owner.name,
            spec,
            resolve_streams(owner.name, owner.namespace, spec),
            owner.uid,
            output_partitions,
            named_partitions=named_partitions,
            cluster=owner.cluster,
            user=user,
            secret_keys=secrets.keys,
        ),
        "ports": [{"name": PORT_NAME, "containerPort": HEALTH_PORT, "protocol": "TCP"}],
        # Liveness: the event loop answers, the intake reads and the settler commits within LIVENESS_TIMEOUT (60 s
        # by default); 3 failures 10 s apart restart a hung worker 80-90 s after its last progress, well before its
        # peers would reclaim its entries (CLAIM_IDLE_MS). Readiness: Redis reachable and the consumer loop running.
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        "readinessProbe": _probe("/readyz", period=5, failures=2),
        "resources": worker_resources(spec),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    if spec.pod.env_from:
        # After env in the container: Kubernetes gives env precedence, so the operator's variables win.
        container["envFrom"] = [source.to_k8s() for source in spec.pod.env_from]
    return container


def desired_replicas(spec: PhoenixStageSpec) -> int:
    """Replicas the operator sets: replicas.min, or 0 while paused. With autoscaling, KEDA's HPA moves it."""
    return 0 if spec.paused else spec.replicas.min


def _pod_placement(spec: PhoenixStageSpec) -> dict[str, Any]:
    """spec.pod's pod-level fields; an unset one is None, so the operator's merge patch removes it when it is
    dropped from the spec (and drift sees it as "must be absent")."""
    pod = spec.pod
    wire = pod.to_k8s()
    return {
        # The API server copies serviceAccountName into the deprecated serviceAccount: both are set or removed.
        "serviceAccountName": pod.service_account_name,
        "serviceAccount": pod.service_account_name,
        **{
            key: wire.get(key)
            for key in (
                "imagePullSecrets",
                "nodeSelector",
                "tolerations",
                "affinity",
                "topologySpreadConstraints",
                "priorityClassName",
            )
        },
    }


def pod_keys(spec: PhoenixStageSpec) -> str:
    """The label and annotation keys spec.pod puts on the pod template, recorded on the Deployment so that a key
    later dropped from the spec is removed (a merge patch removes only what it names)."""
    return json.dumps(
        {"labels": sorted(spec.pod.labels or {}), "annotations": sorted(spec.pod.annotations or {})},
        separators=(",", ":"),
    )


def _secret_versions(versions: tuple[tuple[str, str], ...]) -> str:
    """The pod template's phoenix.io/secret-versions: `name=resourceVersion` of each Secret read, by name."""
    return ",".join(f"{name}={version}" for name, version in sorted(versions))


def build_deployment(
    owner: Owner,
    spec: PhoenixStageSpec,
    *,
    restarted_at: str | None = None,
    secrets: SecretsRead | None = None,
    output_partitions: int = 1,
    named_partitions: Mapping[str, int] | None = None,
    redis_user: RedisUser | None = None,
) -> dict[str, Any]:
    """The Deployment running the stage's workers.

    `restarted_at` (an RFC 3339 time) goes into the pod template as `phoenix.io/restartedAt`: changing it rolls
    the pods, like `kubectl rollout restart`. Pass the current value on every reconcile so it is kept.
    `secrets` (what the reconcile read of the Secrets the pods use, kube/secrets.py): their resourceVersions go in
    as `phoenix.io/secret-versions`, so a rotated Redis URL, password, CA, client certificate, the namespace's
    Redis ACL user's password or a Secret of spec.env or spec.pod.envFrom rolls the workers, which read them only
    at start; the keys of the envFrom Secrets make MASKED_ENV. `output_partitions`: the partitions of the stage
    `output.stage` names; `named_partitions`, of each of spec.outputs' stages by name. `redis_user`: the Redis ACL
    user the workers log in as (worker_env).
    spec.pod's labels and annotations go on the pod template beside the operator's own (which the schema keeps
    them from replacing).
    """
    pod_annotations = {
        **(spec.pod.annotations or {}),
        SCRAPE_ANNOTATION: "true",
        SCRAPE_PORT_ANNOTATION: str(HEALTH_PORT),
        SCRAPE_PATH_ANNOTATION: "/metrics",
    }
    if restarted_at is not None:
        pod_annotations[RESTARTED_AT_ANNOTATION] = restarted_at
    if secrets is not None and secrets.versions:
        pod_annotations[SECRET_VERSIONS_ANNOTATION] = _secret_versions(secrets.versions)
    volumes: list[dict[str, Any]] = [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}}]
    if (tls_volume := redis_tls_volume(spec.redis)) is not None:
        volumes.append(tls_volume)
    volumes += [volume.to_k8s() for volume in spec.pod.volumes or []]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(owner, owner.name, {POD_KEYS_ANNOTATION: pod_keys(spec)}),
        "spec": {
            "replicas": desired_replicas(spec),
            "selector": {"matchLabels": selector_labels(owner.name)},
            "template": {
                "metadata": {
                    "labels": {**(spec.pod.labels or {}), **stage_labels(owner.name)},
                    "annotations": pod_annotations,
                },
                "spec": {
                    # Workers talk to Redis only; no Kubernetes API token in the pod, whichever its ServiceAccount.
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": termination_grace(spec),
                    "securityContext": pod_security_context(),
                    **_pod_placement(spec),
                    "containers": [
                        _container(
                            owner, spec, output_partitions, redis_user, secrets or SecretsRead(), named_partitions or {}
                        )
                    ],
                    # readOnlyRootFilesystem: /tmp is the only writable place (parsers spool documents there),
                    # besides the volumes spec.pod adds.
                    "volumes": volumes,
                },
            },
        },
    }
