"""PhoenixStage.spec: what one pipeline stage runs, where it reads and writes, and how it scales."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from kubernetes.utils import parse_quantity
from pydantic import Field, field_validator, model_validator

from phoenix.crds.common import (
    NO_SPACE_PATTERN,
    CamelModel,
    Quantity,
    RedisName,
    SecretKeyRef,
    SecretRef,
    cel,
    cel_list,
)
from phoenix.crds.pod import PodSpec
from phoenix.keys import MAX_PARTITIONS
from phoenix.record_format import OUTPUT_NAME_PATTERN
from phoenix.retention import RETENTION_PATTERN
from phoenix.tuning import (
    CIRCUIT_FAILURE_THRESHOLD,
    CIRCUIT_HALF_OPEN_CALLS,
    CIRCUIT_RESET_TIMEOUT,
    CLAIM_IDLE_MS,
    CONCURRENCY,
    IDEMPOTENCY_TTL,
    LOCK_TIMEOUT,
    MAX_DELIVERIES,
    PROCESSING_TIMEOUT,
    RETRY_BASE_SECONDS,
    RETRY_MAX_SECONDS,
    TUNABLES,
    Tunable,
)

# The variables the operator sets in every worker container's `env`, from the spec (CONSUMER_NAME from the pod's
# name: one name shared by all pods would make them take each other's pending entries for their own), empty where a
# stage has no value. spec.env may not set them, or two sources would disagree; `env` wins over spec.pod.envFrom,
# so neither can a ConfigMap's key of the same name. The worker reads its settings case-insensitively (`redis_url`
# sets REDIS_URL), so spec.env's names are compared in upper case, and a worker refuses to start with one of its
# settings in two letter cases (an envFrom key `redis_url` beside the operator's REDIS_URL).
RESERVED_ENV_NAMES: tuple[str, ...] = (
    "SERVICE_NAME",
    "KEY_NAMESPACE",
    "STAGE_UID",
    "STAGE_CLUSTER",
    "INPUT_QUEUE",
    "OUTPUT_QUEUE",
    "OUTPUT_RETENTION",
    "CONSUMER_GROUP",
    "DLQ_NAME",
    "REDIS_URL",
    "REDIS_USERNAME",
    "REDIS_PASSWORD",
    "PROCESSOR",
    *(setting.env for setting in TUNABLES),
    "SHUTDOWN_GRACE",
    "HEALTH_PORT",
    "MASKED_ENV",
    "READ_MEMORY_BYTES",
    "PARTITIONS",
    "OUTPUT_PARTITIONS",
    "OUTPUTS",
    "REDIS_MODE",
    "REDIS_SENTINEL_MASTER",
    "REDIS_SENTINEL_USERNAME",
    "REDIS_SENTINEL_PASSWORD",
    "REDIS_TLS_CA_FILE",
    "REDIS_TLS_CERT_FILE",
    "REDIS_TLS_KEY_FILE",
    "CONSUMER_NAME",
)

STAGE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# A PhoenixStage name becomes a label value and a Deployment name: a DNS-1123 label.
StageName = Annotated[str, Field(min_length=1, max_length=63, pattern=STAGE_NAME_PATTERN)]

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PROCESSOR_PATTERN = rf"^({_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*|[A-Za-z0-9][A-Za-z0-9_.-]*)$"


class DeletionPolicy(StrEnum):
    RETAIN = "Retain"
    DELETE = "Delete"


# A retention trims what no group has read yet: before the next stage's group exists, it would cut its input.
_RETENTION_NEEDS_STREAM = (
    "output.retention is for a stream no consumer group reads: with output.stage the next stage's group reads it"
)


class Output(CamelModel):
    """Where the processor's results go: exactly one of `stream` or `stage`. Omit `output` for a final stage."""

    model_config = cel(
        ("has(self.stream) != has(self.stage)", "set exactly one of output.stream or output.stage"),
        ("!has(self.retention) || has(self.stream)", _RETENTION_NEEDS_STREAM),
    )

    stream: RedisName | None = Field(
        default=None, description="A Redis stream to append results to, e.g. `orders:enriched`."
    )
    stage: StageName | None = Field(
        default=None,
        description="The name of the next PhoenixStage in the same namespace; results go to its input "
        "stream (`phoenix:{<namespace>}:<stage>:input` unless that stage sets `input`, so set `stream` then).",
    )
    retention: str | None = Field(
        default=None,
        max_length=32,
        pattern=RETENTION_PATTERN,
        description="How much of the output to keep while no consumer group reads it (a sink read with XREAD, or "
        "by nobody): `maxlen:<entries>` or `age:<n><s|m|h|d>`, e.g. `age:7d`. Such a stream is never trimmed by "
        "acknowledgements; without a retention it is kept whole and the stage pauses at OUTPUT_HIGH_WATER. "
        "Ignored while a group reads the stream. Given to the worker as OUTPUT_RETENTION.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Output:
        if (self.stream is None) == (self.stage is None):
            raise ValueError("set exactly one of output.stream or output.stage")
        if self.retention is not None and self.stream is None:
            raise ValueError(_RETENTION_NEEDS_STREAM)
        return self


_MAX_NAMED_OUTPUTS = 16


class NamedOutput(CamelModel):
    """One of a stage's named outputs: a next stage its processor may route a record to (processor.Routed)."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=OUTPUT_NAME_PATTERN,
        description='The name the processor routes by, e.g. `parser` (`Routed({"parser": result})`).',
    )
    stage: StageName = Field(
        description="The next PhoenixStage in the same namespace; results routed here go to its input stream "
        "(`phoenix:{<namespace>}:<stage>:input`)."
    )


_OUTPUT_OR_OUTPUTS = "set output (one next stage) or outputs (named ones a processor routes among), not both"
_OUTPUT_NAMES_UNIQUE = "spec.outputs names must be unique"


class RedisMode(StrEnum):
    STANDALONE = "standalone"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


_SENTINEL_NEEDS_MASTER = "redis.mode sentinel needs redis.sentinel.masterName"
_SENTINEL_ONLY_IN_SENTINEL_MODE = "redis.sentinel is only read with redis.mode sentinel"


class RedisSentinel(CamelModel):
    """Sentinel mode: the URL's hosts (`redis://:pw@s1:26379,s2:26379,s3:26379/0`) are the Sentinels, asked for the
    current primary of `masterName`."""

    master_name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="The name the Sentinels monitor the primary under (`sentinel monitor <name> ...`). Given to the "
        "worker as REDIS_SENTINEL_MASTER and to KEDA as sentinelMaster.",
    )
    username: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=NO_SPACE_PATTERN,
        description="ACL user of the Sentinels when they have their own (REDIS_SENTINEL_USERNAME). Omit when the "
        "Sentinels take no password or the same user as the URL.",
    )
    password_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the Sentinels' own password, when they have one "
        "(REDIS_SENTINEL_PASSWORD, and KEDA's sentinelPassword).",
    )


class RedisTls(CamelModel):
    """TLS material for a `rediss://` URL, from Secrets mounted read-only into the worker pods. Without `caSecretRef`
    the server certificate is verified against the image's public roots."""

    ca_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the PEM CA bundle that signed the Redis server's certificate (e.g. "
        "`{name: redis-ca, key: ca.crt}`). Mounted as REDIS_TLS_CA_FILE; KEDA's `ca`.",
    )
    client_cert_secret_ref: SecretRef | None = Field(
        default=None,
        description="A `kubernetes.io/tls` Secret (keys tls.crt and tls.key) with the client certificate, for a "
        "Redis that requires one (mTLS, `tls-auth-clients yes`). Mounted as REDIS_TLS_CERT_FILE and "
        "REDIS_TLS_KEY_FILE; KEDA's `cert` and `key`.",
    )


class StageRedisSpec(CamelModel):
    """How the worker (and KEDA) reach Redis. Only Secret references: no credential is ever written in a spec."""

    model_config = cel(
        ("!has(self.mode) || self.mode != 'sentinel' || has(self.sentinel)", _SENTINEL_NEEDS_MASTER),
        ("!has(self.sentinel) || (has(self.mode) && self.mode == 'sentinel')", _SENTINEL_ONLY_IN_SENTINEL_MODE),
    )

    url_secret_ref: SecretKeyRef = Field(
        description="Secret key holding the Redis URL (`redis://[user:password@]host:port/db`, or `rediss://` "
        "for TLS; in sentinel mode the hosts are the Sentinels, `host1:26379,host2:26379`; in cluster mode seed "
        "nodes of the Redis Cluster, `node1:6379,node2:6379`, database 0). Given to the worker "
        "as REDIS_URL."
    )
    password_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding only the Redis password, used by KEDA's TriggerAuthentication (KEDA "
        "cannot read a password inside a URL). Required when the URL has a password and autoscaling is enabled.",
    )
    mode: RedisMode = Field(
        default=RedisMode.STANDALONE,
        strict=False,
        description="standalone: the URL names the Redis itself; sentinel: the URL names the Sentinels "
        "(set `sentinel.masterName`); cluster: the URL's hosts are seed nodes of a Redis Cluster (database 0). "
        "REDIS_MODE.",
    )
    sentinel: RedisSentinel | None = Field(default=None, description="Sentinel mode's master name and credentials.")
    tls: RedisTls | None = Field(default=None, description="CA and client certificate for a `rediss://` URL.")

    @model_validator(mode="after")
    def _mode_fits(self) -> StageRedisSpec:
        if self.mode is RedisMode.SENTINEL and self.sentinel is None:
            raise ValueError(_SENTINEL_NEEDS_MASTER)
        if self.sentinel is not None and self.mode is not RedisMode.SENTINEL:
            raise ValueError(_SENTINEL_ONLY_IN_SENTINEL_MODE)
        return self


class Replicas(CamelModel):
    """Bounds on the number of worker pods."""

    model_config = cel(("self.min <= self.max", "replicas.min must be less than or equal to replicas.max"))

    min: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Fewest pods; 0 lets KEDA scale the stage to zero while it has no work: no entry undelivered "
        "or pending, no record waiting to retry. Without autoscaling the stage runs exactly this many.",
    )
    max: int = Field(default=10, ge=1, le=1000, description="Most pods KEDA may scale to.")

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"replicas.min ({self.min}) must be less than or equal to replicas.max ({self.max})")
        return self


class Autoscaling(CamelModel):
    """KEDA autoscaling on the consumer group's lag (entries not yet delivered to any worker). The stage also stays
    up, or wakes from zero, while entries are pending (one pod per worker.concurrency of them) or records wait in its
    retry set: a pod must be there to finish, reclaim or promote them."""

    enabled: bool = Field(default=True, description="Create a KEDA ScaledObject for the stage.")
    lag_count: int = Field(
        default=10, ge=1, le=1_000_000, description="Target lag per pod: KEDA adds pods when lag/pods exceeds it."
    )
    activation_lag_count: int = Field(
        default=0, ge=0, le=1_000_000, description="Lag above which a stage scaled to zero is woken up."
    )
    polling_interval: int = Field(default=15, ge=1, le=3600, description="Seconds between KEDA's lag checks.")
    cooldown_period: int = Field(
        default=180, ge=0, le=86400, description="Seconds after the last activity before scaling to replicas.min."
    )
    scale_down_stabilization_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "Seconds the HPA keeps the highest pod count it computed before removing pods (its scale-down "
            "stabilization window); unset: the HPA's 300. The step to zero follows cooldownPeriod."
        ),
    )


def tuned(setting: Tunable, description: str, **options: Any) -> Any:
    """The field of a tuned worker setting: its default and bounds from phoenix.tuning, its variable named."""
    minimum = {"gt": setting.minimum} if setting.exclusive_minimum else {"ge": setting.minimum}
    return Field(
        default=setting.default, le=setting.maximum, description=f"{description} ({setting.env}).", **minimum, **options
    )


class WorkerTuning(CamelModel):
    """Worker runtime settings, passed to every pod as environment variables."""

    concurrency: int = tuned(CONCURRENCY, "Records processed at once per pod")
    lock_timeout: int = tuned(LOCK_TIMEOUT, "Seconds a record's processing lock is held")
    idempotency_ttl: int = tuned(
        IDEMPOTENCY_TTL,
        "Seconds a finished record is remembered so a redelivery is skipped",
        alias="idempotencyTTL",
    )
    processing_timeout: int = tuned(PROCESSING_TIMEOUT, "Seconds before one process() call is cancelled")
    claim_idle_ms: int = tuned(
        CLAIM_IDLE_MS, "Milliseconds an entry may sit unacknowledged before another pod claims it"
    )
    max_deliveries: int = tuned(MAX_DELIVERIES, "Deliveries of one entry before it goes to the DLQ")


class Retry(CamelModel):
    """Exponential backoff for transient processor failures."""

    model_config = cel(("self.baseSeconds <= self.maxSeconds", "retry.baseSeconds must not exceed retry.maxSeconds"))

    base_seconds: float = tuned(RETRY_BASE_SECONDS, "First retry delay in seconds")
    max_seconds: float = tuned(RETRY_MAX_SECONDS, "Longest retry delay in seconds")

    @model_validator(mode="after")
    def _ordered(self) -> Retry:
        if self.base_seconds > self.max_seconds:
            raise ValueError(
                f"retry.baseSeconds ({self.base_seconds}) must not exceed retry.maxSeconds ({self.max_seconds})"
            )
        return self


class CircuitBreakerSpec(CamelModel):
    """Stops calling a failing processor for a while instead of hammering it."""

    failure_threshold: int = tuned(CIRCUIT_FAILURE_THRESHOLD, "Consecutive failures that open the circuit")
    reset_timeout: float = tuned(CIRCUIT_RESET_TIMEOUT, "Seconds the circuit stays open before trial calls")
    half_open_calls: int = tuned(CIRCUIT_HALF_OPEN_CALLS, "Trial calls allowed while half-open")


# Names that say they hold a credential (upper-cased first), and values that carry one in a URL's user info
# (`scheme://user:password@host`): such a value must come from a Secret, since a literal `value` is shown to anyone
# who may read the PhoenixStage (`kubectl get -o yaml`). Both are searched anywhere in the text, by RE2 (CEL) and by
# Python's re alike: ASCII classes only, so the two engines agree on every character.
SECRET_NAME_PATTERN = (
    r"PASSWORD|PASSWD|PASSPHRASE|_PWD$|SECRET|TOKEN|_KEY$|APIKEY|API_KEY|CREDENTIAL|AUTH|DSN|CONNECTION_STRING"
    r"|(DATABASE|DB)_UR[IL]|OTLP_(.*_)?HEADERS"
)
URL_WITH_USER_INFO_PATTERN = r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@ \t\r\n]+@"
# SECRET_NAME_PATTERN and URL_WITH_USER_INFO_PATTERN as people read them.
_CREDENTIALS_TEXT = (
    "a name that says it holds one (*PASSWORD*, *PASSWD*, *PASSPHRASE*, *_PWD, *SECRET*, *TOKEN*, *_KEY, *APIKEY*, "
    "*API_KEY*, *CREDENTIAL*, *AUTH*, *DSN*, *CONNECTION_STRING*, *DATABASE_URL* or *DB_URL* (or _URI), "
    "OTEL_EXPORTER_OTLP_*HEADERS), or a value holding a URL with user info (scheme://user:password@host)"
)
_SECRET_VALUE_MESSAGE = (
    "a credential must not be a literal value, which anyone who can read the PhoenixStage sees (refused for "
    + _CREDENTIALS_TEXT
    + "): put it in a Secret and use secretKeyRef"
)


def is_literal_credential(name: str, value: str) -> bool:
    """Whether spec.env may not carry `value` for `name` literally (the CRD's CEL rule says the same)."""
    return bool(value) and bool(
        re.search(SECRET_NAME_PATTERN, name.upper()) or re.search(URL_WITH_USER_INFO_PATTERN, value)
    )


class EnvVar(CamelModel):
    """An extra environment variable for the processor: a literal `value`, or a `secretKeyRef` for secrets."""

    model_config = cel(
        ("has(self.value) != has(self.secretKeyRef)", "set exactly one of value or secretKeyRef"),
        (
            f"!has(self.value) || self.value == '' || (!self.name.upperAscii().matches('{SECRET_NAME_PATTERN}') "
            f"&& !self.value.matches('{URL_WITH_USER_INFO_PATTERN}'))",
            _SECRET_VALUE_MESSAGE,
        ),
    )

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Variable name.")
    value: str | None = Field(
        default=None,
        max_length=32768,
        description="Literal value; never a credential. Refused (unless empty) for " + _CREDENTIALS_TEXT + ".",
    )
    secret_key_ref: SecretKeyRef | None = Field(default=None, description="Take the value from a Secret key.")

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.secret_key_ref is None):
            raise ValueError(f"env {self.name}: set exactly one of value or secretKeyRef")
        if self.value is not None and is_literal_credential(self.name, self.value):
            raise ValueError(f"env {self.name}: {_SECRET_VALUE_MESSAGE}")
        return self


_RESERVED_CEL_LIST = cel_list(RESERVED_ENV_NAMES)
_RESERVED_MESSAGE = (
    "spec.env must not set variables the operator or the worker derive, in any letter case: "
    + ", ".join(RESERVED_ENV_NAMES)
)


# What a worker container may ask for, as Kubernetes checks a container's resources: the standard resources, and
# extended ones (`nvidia.com/gpu`: a domain that is not Kubernetes' own), which it counts in whole units and never
# overcommits (their request is their limit).
STANDARD_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_EXTENDED_RESOURCE_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_RESOURCE_NAMES_MESSAGE = (
    "spec.resources names cpu, memory, ephemeral-storage, or an extended resource <domain>/<name> (`nvidia.com/gpu`) "
    "of a domain other than kubernetes.io's"
)
_REQUEST_OVER_LIMIT = "spec.resources: each request must be at most its limit"
_EXTENDED_WHOLE_AND_LIMITED = (
    "spec.resources: an extended resource is counted in whole units and not overcommitted: give it a limit, an "
    "integer, and no request or one equal to the limit"
)
_STANDARD_CEL = cel_list(STANDARD_RESOURCES)


def _resource_names_cel() -> dict[str, Any]:
    extended = (
        f"(k.matches('{_EXTENDED_RESOURCE_PATTERN}') && size(k.split('/')[0]) <= 244 "
        "&& !k.contains('kubernetes.io/') && !k.startsWith('requests.'))"
    )
    return {"rule": f"self.all(k, k in {_STANDARD_CEL} || {extended})", "message": _RESOURCE_NAMES_MESSAGE}


def _is_resource_name(name: str) -> bool:
    return name in STANDARD_RESOURCES or (
        re.fullmatch(_EXTENDED_RESOURCE_PATTERN, name) is not None
        and len(name.split("/")[0]) <= 244  # Kubernetes checks `requests.<name>` as a qualified name
        and "kubernetes.io/" not in name
        and not name.startswith("requests.")
    )


class ResourceRequirements(CamelModel):
    """Compute resources of the worker container, as in a Pod spec (and checked as a Pod spec's, at admission)."""

    model_config = cel(
        (
            "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || "
            "quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) <= 0)",
            _REQUEST_OVER_LIMIT,
        ),
        (
            f"(!has(self.limits) || self.limits.all(k, k in {_STANDARD_CEL} || quantity(string(self.limits[k]))"
            ".isInteger())) && (!has(self.requests) || self.requests.all(k, k in "
            f"{_STANDARD_CEL} || (has(self.limits) && k in self.limits && quantity(string(self.requests[k]))"
            ".compareTo(quantity(string(self.limits[k]))) == 0)))",
            _EXTENDED_WHOLE_AND_LIMITED,
        ),
    )

    requests: dict[str, Quantity] | None = Field(
        default=None,
        max_length=8,
        description="Minimum resources, e.g. `{cpu: 100m, memory: 128Mi}`.",
        json_schema_extra={"x-kubernetes-validations": [_resource_names_cel()]},
    )
    limits: dict[str, Quantity] | None = Field(
        default=None,
        max_length=8,
        description="Maximum resources, e.g. `{memory: 512Mi}`.",
        json_schema_extra={"x-kubernetes-validations": [_resource_names_cel()]},
    )

    @model_validator(mode="after")
    def _as_kubernetes_checks_them(self) -> ResourceRequirements:
        requests, limits = self.requests or {}, self.limits or {}
        if bad := sorted(name for name in {*requests, *limits} if not _is_resource_name(name)):
            raise ValueError(f"{_RESOURCE_NAMES_MESSAGE} (got {', '.join(bad)})")
        if over := sorted(
            n for n in requests if n in limits and parse_quantity(requests[n]) > parse_quantity(limits[n])
        ):
            raise ValueError(f"{_REQUEST_OVER_LIMIT} (got {', '.join(over)})")
        extended = {name for name in {*requests, *limits} if name not in STANDARD_RESOURCES}
        if odd := sorted(
            name
            for name in extended
            if name not in limits
            or parse_quantity(limits[name]) != int(parse_quantity(limits[name]))
            or (name in requests and parse_quantity(requests[name]) != parse_quantity(limits[name]))
        ):
            raise ValueError(f"{_EXTENDED_WHOLE_AND_LIMITED} (got {', '.join(odd)})")
        return self


# The strings pydantic (the worker's BillingSettings) reads as a false BILLING_SWAP_ENV, lowercased.
_FALSE_WORDS = ("false", "0", "no", "off", "f", "n")
# Billing on (BILLING_URL set) swaps OPENAI_API_KEY in the process environment for each message unless
# BILLING_SWAP_ENV is false; the worker refuses to start that way with CONCURRENCY > 1, so admission refuses it
# before any pod could crash-loop on it.
_BILLING_CEL = (
    "!has(self.env)"
    " || !self.env.exists(e, e.name.upperAscii() == 'BILLING_URL'"
    " && (has(e.secretKeyRef) || (has(e.value) && e.value != '')))"
    " || self.env.exists(e, e.name.upperAscii() == 'BILLING_SWAP_ENV' && has(e.value)"
    f" && e.value.lowerAscii() in {cel_list(_FALSE_WORDS)})"
    " || !has(self.worker) || self.worker.concurrency <= 1"
)
_BILLING_MESSAGE = (
    "billing (BILLING_URL in spec.env) swaps OPENAI_API_KEY per message, which is only safe with "
    "worker.concurrency 1: set worker.concurrency to 1, or set BILLING_SWAP_ENV=false in spec.env and have the "
    "processor pass phoenix.worker_runtime.billing.current_api_key() to its LLM client"
)


_PARTITIONS_DERIVE_NAMES = (
    "a stage of several partitions derives its input and DLQ streams (one per partition): unset spec.input and "
    "spec.dlq, or set spec.partitions to 1"
)


class PhoenixStageSpec(CamelModel):
    """One pipeline stage: a processor reading a Redis stream through a consumer group, autoscaled by KEDA."""

    model_config = cel(
        (_BILLING_CEL, _BILLING_MESSAGE),
        (
            "!has(self.partitions) || self.partitions == 1 || (!has(self.input) && !has(self.dlq))",
            _PARTITIONS_DERIVE_NAMES,
        ),
        ("!has(self.output) || !has(self.outputs)", _OUTPUT_OR_OUTPUTS),
    )

    processor: str = Field(
        max_length=256,
        pattern=PROCESSOR_PATTERN,
        description="The processor class, `package.module:Class`, or an entry point name in group "
        "`phoenix.processors` (router, parser, grouper).",
    )
    image: str = Field(min_length=1, max_length=512, description="Container image with Phoenix and the processor.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="When the kubelet pulls the image."
    )
    input: RedisName | None = Field(
        default=None, description="Stream to consume. Default: `phoenix:{<namespace>}:<name>:input`."
    )
    output: Output | None = Field(
        default=None, description="Where results go; omit for a final stage whose results are not forwarded."
    )
    outputs: list[NamedOutput] | None = Field(
        default=None,
        min_length=1,
        max_length=_MAX_NAMED_OUTPUTS,
        description="Named next stages instead of one `output`: the processor returns `Routed({name: result, "
        "...})` per record, to none, one or several of them, all forwarded by the record's one commit "
        "(docs/pipelines.md). A name it routes to that is not here sends the record to the DLQ with the reason. "
        "Given to the worker as OUTPUTS.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                {"rule": "self.all(o, self.exists_one(p, p.name == o.name))", "message": _OUTPUT_NAMES_UNIQUE}
            ],
        },
    )
    consumer_group: RedisName | None = Field(default=None, description="Consumer group name. Default: `{name}-group`.")
    dlq: RedisName | None = Field(
        default=None,
        description="Dead-letter stream for records that cannot be processed. "
        "Default: `phoenix:{<namespace>}:<name>:dlq`.",
    )
    partitions: int = Field(
        default=1,
        ge=1,
        le=MAX_PARTITIONS,
        description="Partitions of the stage (PARTITIONS): a record's partition follows from its record id, and each "
        "partition has its own input stream, DLQ, retry set and record keys under its own Redis Cluster hash tag "
        "(`phoenix:{<namespace>~<p>}:<name>:...`), so partition p of every stage of a pipeline shares one slot. 1: "
        "today's layout. A stage of several partitions cannot set input or dlq. Changing it on a stage with data is "
        "refused until the data is moved (docs/operations.md).",
    )
    redis: StageRedisSpec = Field(description="Redis connection, by Secret reference.")
    replicas: Replicas = Field(default_factory=Replicas, description="Bounds on the number of worker pods.")
    autoscaling: Autoscaling = Field(default_factory=Autoscaling, description="KEDA autoscaling on consumer lag.")
    worker: WorkerTuning = Field(default_factory=WorkerTuning, description="Worker runtime tuning.")
    retry: Retry = Field(default_factory=Retry, description="Backoff for transient failures.")
    circuit_breaker: CircuitBreakerSpec = Field(
        default_factory=CircuitBreakerSpec, description="Processor circuit breaker."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment variables for the processor (e.g. LOG_LEVEL, BILLING_URL). Variables the "
        "operator or the worker derive (" + ", ".join(RESERVED_ENV_NAMES) + ", in any letter case) cannot be set "
        "here.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "x-kubernetes-validations": [
                {"rule": f"self.all(e, !(e.name.upperAscii() in {_RESERVED_CEL_LIST}))", "message": _RESERVED_MESSAGE}
            ],
        },
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description="Worker container resources. Default: requests cpu=100m, memory=128Mi; limits cpu=1, "
        "memory=512Mi. When set, it replaces the default as a whole.",
    )
    pod: PodSpec = Field(
        default_factory=PodSpec,
        description="How the worker pods are shaped: pull secrets, service account, placement, labels, extra "
        "volumes, termination grace. What would relax the restricted security context is refused.",
    )
    paused: bool = Field(
        default=False, description="Scale the stage to zero and pause autoscaling; entries wait in the stream."
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.RETAIN,
        strict=False,
        description="What happens to the stage's Redis data (input stream, consumer group, DLQ) when the "
        "PhoenixStage is deleted: Retain keeps it, Delete removes it. Kubernetes objects are always removed.",
    )

    def tuned_values(self) -> dict[Tunable, int | float]:
        """Each tuned worker setting's value in this spec, in phoenix.tuning.TUNABLES' order."""
        worker, retry, circuit = self.worker, self.retry, self.circuit_breaker
        values: dict[Tunable, int | float] = {
            LOCK_TIMEOUT: worker.lock_timeout,
            IDEMPOTENCY_TTL: worker.idempotency_ttl,
            PROCESSING_TIMEOUT: worker.processing_timeout,
            CLAIM_IDLE_MS: worker.claim_idle_ms,
            CONCURRENCY: worker.concurrency,
            MAX_DELIVERIES: worker.max_deliveries,
            RETRY_BASE_SECONDS: retry.base_seconds,
            RETRY_MAX_SECONDS: retry.max_seconds,
            CIRCUIT_FAILURE_THRESHOLD: circuit.failure_threshold,
            CIRCUIT_RESET_TIMEOUT: circuit.reset_timeout,
            CIRCUIT_HALF_OPEN_CALLS: circuit.half_open_calls,
        }
        return values

    @field_validator("env")
    @classmethod
    def _env_not_reserved(cls, env: list[EnvVar]) -> list[EnvVar]:
        names = [var.name for var in env]
        if clashes := sorted(name for name in names if name.upper() in RESERVED_ENV_NAMES):
            raise ValueError(f"{_RESERVED_MESSAGE} (got {', '.join(clashes)})")
        if duplicates := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"spec.env names must be unique (repeated: {', '.join(duplicates)})")
        return env

    @model_validator(mode="after")
    def _billing_needs_one_at_a_time(self) -> PhoenixStageSpec:
        env = {var.name.upper(): var for var in self.env}  # the worker reads them case-insensitively too
        billing = env.get("BILLING_URL")
        swap = env.get("BILLING_SWAP_ENV")
        billing_on = billing is not None and (billing.secret_key_ref is not None or bool(billing.value))
        swap_off = swap is not None and swap.value is not None and swap.value.lower() in _FALSE_WORDS
        if billing_on and not swap_off and self.worker.concurrency > 1:
            raise ValueError(f"{_BILLING_MESSAGE} (got worker.concurrency {self.worker.concurrency})")
        return self

    @model_validator(mode="after")
    def _one_kind_of_output(self) -> PhoenixStageSpec:
        if self.output is not None and self.outputs is not None:
            raise ValueError(_OUTPUT_OR_OUTPUTS)
        names = [output.name for output in self.outputs or []]
        if repeated := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"{_OUTPUT_NAMES_UNIQUE} (repeated: {', '.join(repeated)})")
        return self

    @model_validator(mode="after")
    def _partitions_derive_names(self) -> PhoenixStageSpec:
        if self.partitions > 1 and (self.input is not None or self.dlq is not None):
            raise ValueError(f"{_PARTITIONS_DERIVE_NAMES} (got partitions {self.partitions})")
        return self
