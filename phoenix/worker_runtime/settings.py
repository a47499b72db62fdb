"""All worker configuration, parsed once from the environment; a bad value stops the worker at start."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from phoenix import tuning
from phoenix.errors import ConfigError
from phoenix.keys import (
    DEFAULT_NAMESPACE,
    MAX_PARTITIONS,
    NAMESPACE_PATTERN,
    StageKeys,
    input_stream,
    stage_of_input,
)
from phoenix.record_format import OUTPUT_NAME_PATTERN, SCRIPT_SAFE_FIELDS
from phoenix.redis_spec import CONNECT_TIMEOUT_SECONDS, RedisSpec, RedisSpecError
from phoenix.retention import Retention
from phoenix.worker_runtime.scrub import without_user_info

PositiveSeconds = Annotated[float, Field(gt=0)]
# The Redis client's socket timeout must outlast its longest blocking command (XREADGROUP BLOCK, WAIT) by this much:
# the reply of a command that blocked for its full time still has to arrive (docs/configuration.md).
REDIS_TIMEOUT_MARGIN_SECONDS = 2.0
# Unset REDIS_SOCKET_TIMEOUT: the longest blocking command plus this.
REDIS_SOCKET_TIMEOUT_SLACK_SECONDS = 10.0

# The longest wait between two attempts of a failed Redis call, in the intake and the settler.
REDIS_RETRY_MAX_DELAY = 5.0
# LIVENESS_TIMEOUT's floor: longer than a Sentinel failover takes with its defaults (down-after-milliseconds 30 s,
# then the election), so a failover the clients ride out restarts no pod.
_LIVENESS_FLOOR = 60.0


class NamedOutput(BaseModel):
    """One of OUTPUTS: the next stage's default input stream (`queue`) and that stage's partition count."""

    model_config = {"extra": "forbid", "frozen": True}

    queue: str = Field(min_length=1)
    partitions: int = Field(1, ge=1, le=MAX_PARTITIONS)


OutputName = Annotated[str, Field(pattern=OUTPUT_NAME_PATTERN, max_length=63)]


class WorkerSettings(BaseSettings):
    """One stage worker. Environment variable names (SERVICE_NAME, INPUT_QUEUE, ...) are those of the specification
    Phoenix was written from, a worker that took one message at a time with a round trip per step."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True)

    service_name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    processor: str = Field(min_length=1, description="package.module:Class or an entry point in phoenix.processors")
    redis_url: SecretStr = SecretStr("redis://localhost:6379/0")
    # Credentials instead of the URL's (the operator's Redis ACL user of the namespace); empty: the URL's.
    redis_username: str = ""
    redis_password: SecretStr = SecretStr("")
    # The tenant every key of the stage is scoped by (phoenix/keys.py); the operator sets the stage's namespace.
    key_namespace: str = Field(DEFAULT_NAMESPACE, pattern=NAMESPACE_PATTERN)
    # How to reach Redis beyond the URL (phoenix.redis_spec): checked together, once, into `redis`.
    redis_mode: str = "standalone"
    redis_sentinel_master: str = ""
    redis_sentinel_username: str = ""
    redis_sentinel_password: SecretStr = SecretStr("")
    redis_tls_ca_file: str = ""
    redis_tls_cert_file: str = ""
    redis_tls_key_file: str = ""
    redis_connect_timeout: PositiveSeconds = CONNECT_TIMEOUT_SECONDS
    redis_socket_timeout: PositiveSeconds | None = None  # None: the longest blocking command + 10 s
    # The PhoenixStage's uid (the operator sets it): proves to the keys' ownership marker that this is its worker.
    stage_uid: str = ""
    # The Kubernetes cluster of that PhoenixStage (the operator sets it): written to the markers the worker creates.
    stage_cluster: str = ""

    input_queue: str = ""
    output_queue: str = ""
    # The stage's partitions (phoenix/keys.py: one lane of input, DLQ, retry set, record keys each), and those of
    # the stage OUTPUT_QUEUE is the input of (a forward goes to the record's partition there); the operator sets both.
    partitions: int = Field(1, ge=1, le=MAX_PARTITIONS)
    output_partitions: int = Field(1, ge=1, le=MAX_PARTITIONS)
    # A stage of named outputs (spec.outputs) instead of one: JSON, name -> {"queue": the next stage's default
    # input, "partitions": its count}, e.g. {"parser": {"queue": "phoenix:{ns}:parser:input"}}. A processor
    # routes each record among them (processor.Routed); the operator sets it.
    outputs: dict[OutputName, NamedOutput] = Field(default_factory=dict, max_length=32)
    consumer_group: str = ""
    consumer_name: str = ""
    dlq_name: str = ""

    # A PhoenixStage's tunables take their defaults from phoenix.tuning; their bounds here are wider than a spec's.
    lock_timeout: PositiveSeconds = tuning.LOCK_TIMEOUT.default
    idempotency_ttl: PositiveSeconds = tuning.IDEMPOTENCY_TTL.default
    processing_timeout: PositiveSeconds = tuning.PROCESSING_TIMEOUT.default
    claim_idle_ms: int = Field(tuning.CLAIM_IDLE_MS.default, gt=0)
    claim_interval: PositiveSeconds = 60
    concurrency: int = Field(tuning.CONCURRENCY.default, ge=1, le=10_000)
    max_deliveries: int = Field(tuning.MAX_DELIVERIES.default, ge=1)
    # Backpressure instead of trimming: above the high-water mark of unfinished entries in the output stream the
    # stage stops reading, below the low-water mark (default 80% of it) it reads again; 0 turns it off.
    output_high_water: int = Field(100_000, ge=0)
    output_low_water: int | None = Field(None, ge=0)
    backpressure_interval: PositiveSeconds = 1
    # For an output no consumer group reads (nothing acknowledges, so nothing is trimmed): maxlen:N or age:7d.
    # Unset: such an output is kept whole and the stage pauses at OUTPUT_HIGH_WATER (docs/durability.md).
    output_retention: str = ""
    trim_interval: PositiveSeconds = 1
    dlq_maxlen: int = Field(0, ge=0)  # 0: unbounded; else trimmed to this length, counted and logged
    # WAIT after each settle commit for this many replicas (0: do not wait); see docs/durability.md.
    min_replicas_ack: int = Field(0, ge=0)
    min_replicas_timeout_ms: int = Field(1000, ge=1)
    # Removed: trimming by length lost unread records. Set, it stops the worker with a pointer to its successor.
    stream_maxlen: str | None = None
    max_message_bytes: int = Field(1_048_576, ge=1024)
    # Wider entries are dead-lettered at parse; the scripts write at most SCRIPT_SAFE_FIELDS field by field.
    max_entry_fields: int = Field(1000, ge=4, le=SCRIPT_SAFE_FIELDS)
    # One read asks for at most READ_MEMORY_BYTES / MAX_MESSAGE_BYTES entries (at least one); the operator sets it
    # from the pod's memory limit (docs/durability.md).
    read_memory_bytes: int = Field(268_435_456, ge=1)
    block_ms: int = Field(5000, ge=1)

    retry_base_seconds: PositiveSeconds = tuning.RETRY_BASE_SECONDS.default
    retry_max_seconds: PositiveSeconds = tuning.RETRY_MAX_SECONDS.default
    retry_warn_after: PositiveSeconds = 4 * 3600
    retry_poll_interval: PositiveSeconds = 1
    # Off (0) by default: a transient failure is retried until it succeeds. Past either limit the record goes to
    # the DLQ (RetriesExhausted) with its history; attempts count across re-enqueued retries (retry_count).
    max_attempts: int = Field(0, ge=0)
    max_retry_age: float = Field(0, ge=0)  # seconds since the record's first failure
    # A call cancelled at PROCESSING_TIMEOUT that is still running this much later is given up (docs/durability.md).
    timeout_grace: PositiveSeconds = 30
    # /healthz fails while this many run_blocking threads outlive the calls that started them (blocking.py).
    max_leaked_threads: int = Field(4, ge=1)
    # /healthz fails when the intake has read nothing, or the settler committed nothing while work waits, this
    # long: their Redis calls hang or keep failing. Unset: derived (_derive_defaults; docs/configuration.md).
    liveness_timeout: float | None = Field(None, gt=0)

    circuit_failure_threshold: int = Field(tuning.CIRCUIT_FAILURE_THRESHOLD.default, ge=1)
    circuit_reset_timeout: PositiveSeconds = tuning.CIRCUIT_RESET_TIMEOUT.default
    circuit_half_open_calls: int = Field(tuning.CIRCUIT_HALF_OPEN_CALLS.default, ge=1)

    # Variables whose values are secrets, masked like the Redis password (scrub.py): names separated by commas. The
    # operator lists those spec.env and spec.pod.envFrom take from Secrets.
    masked_env: str = ""

    shutdown_grace: float = Field(25, ge=0)
    health_port: int = Field(8080, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"

    _redis: RedisSpec = PrivateAttr()
    _url_secrets: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lowercase(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("output_retention")
    @classmethod
    def _check_retention(cls, value: str) -> str:
        # Kept as text (a structured type would be JSON-decoded from the environment first); parsed once to check.
        return Retention.parse(value.strip()).text if value.strip() else ""

    @model_validator(mode="after")
    def _derive_defaults(self) -> WorkerSettings:
        # Names derived from SERVICE_NAME (phoenix.keys); frozen, so set through __dict__ once.
        if self.partitions > 1 and (self.input_queue or self.dlq_name):
            raise ValueError(
                f"PARTITIONS={self.partitions}: a partitioned stage derives its input and DLQ streams (one per "
                "partition); unset INPUT_QUEUE and DLQ_NAME"
            )
        keys = StageKeys.for_stage(
            self.service_name,
            self.key_namespace,
            input=self.input_queue,
            group=self.consumer_group,
            dlq=self.dlq_name,
            partitions=self.partitions,
        )
        derived = {
            "input_queue": keys.input,
            "consumer_group": keys.consumer_group,
            "dlq_name": keys.dlq,
            # In a pod the hostname is the pod name; the pid separates processes sharing a host.
            "consumer_name": self.consumer_name or f"{socket.gethostname()}-{os.getpid()}",
        }
        self.__dict__.update(derived)
        if self.output_queue and self.output_queue == self.input_queue:
            raise ValueError("OUTPUT_QUEUE must differ from INPUT_QUEUE (a stage would feed itself)")
        if self.output_partitions > 1 and not (
            (found := stage_of_input(self.output_queue)) and self.output_queue == input_stream(found[1], found[0])
        ):
            raise ValueError(
                "OUTPUT_PARTITIONS applies to an output that is a stage's default input (output.stage): set "
                "OUTPUT_QUEUE to it, or unset OUTPUT_PARTITIONS"
            )
        self._check_outputs()
        if self.output_retention and not self.output_queue:
            raise ValueError("OUTPUT_RETENTION applies to an output stream: set OUTPUT_QUEUE too, or unset it")
        if self.stream_maxlen is not None:
            raise ValueError(
                "STREAM_MAXLEN is no longer supported: streams are no longer trimmed by length; "
                "OUTPUT_HIGH_WATER bounds the output stream by pausing the stage instead"
            )
        if self.output_low_water is None:
            self.__dict__["output_low_water"] = self.output_high_water * 4 // 5
        elif self.output_low_water >= self.output_high_water > 0:
            raise ValueError("OUTPUT_LOW_WATER must be below OUTPUT_HIGH_WATER")
        if self.retry_max_seconds < self.retry_base_seconds:
            raise ValueError("RETRY_MAX_SECONDS must be at least RETRY_BASE_SECONDS")
        # A healthy call may last this long: an XREADGROUP blocks BLOCK_MS, a commit's WAIT MIN_REPLICAS_TIMEOUT_MS.
        longest_call = max(self.block_ms, self.min_replicas_timeout_ms if self.min_replicas_ack else 0) / 1000
        if self.liveness_timeout is None:
            # Three failed attempts of the longest call, each followed by the longest retry delay.
            three_attempts = 3 * (longest_call + REDIS_RETRY_MAX_DELAY)
            self.__dict__["liveness_timeout"] = max(_LIVENESS_FLOOR, three_attempts)
        elif self.liveness_timeout <= longest_call:
            raise ValueError(
                "LIVENESS_TIMEOUT must exceed BLOCK_MS and, with MIN_REPLICAS_ACK, MIN_REPLICAS_TIMEOUT_MS: "
                "a healthy read or commit may take that long"
            )
        self._redis = self._redis_spec()
        return self

    def _redis_spec(self) -> RedisSpec:
        longest = max(self.block_ms, self.min_replicas_timeout_ms if self.min_replicas_ack else 0) / 1000
        socket_timeout = self.redis_socket_timeout or longest + REDIS_SOCKET_TIMEOUT_SLACK_SECONDS
        if socket_timeout < longest + REDIS_TIMEOUT_MARGIN_SECONDS:
            raise ValueError(
                f"REDIS_SOCKET_TIMEOUT ({socket_timeout:g} s) must exceed BLOCK_MS"
                f"{' and MIN_REPLICAS_TIMEOUT_MS' if self.min_replicas_ack else ''} ({longest:g} s) by at least "
                f"{REDIS_TIMEOUT_MARGIN_SECONDS:g} s, or every blocking read would time out"
            )
        files = {
            "tls_ca": self.redis_tls_ca_file,
            "tls_cert": self.redis_tls_cert_file,
            "tls_key": self.redis_tls_key_file,
        }
        url, password = self.redis_url.get_secret_value(), self.redis_password.get_secret_value()
        given: dict[str, Any] = {
            "mode": self.redis_mode.strip().lower(),
            "sentinel_master": self.redis_sentinel_master,
            "sentinel_username": self.redis_sentinel_username,
            "sentinel_password": self.redis_sentinel_password.get_secret_value(),
            "connect_timeout": self.redis_connect_timeout,
            "socket_timeout": socket_timeout,
            **{name: Path(path) for name, path in files.items() if path},
        }
        try:
            # REDIS_PASSWORD replaces the URL's own password, which stays in the environment: masked as well.
            self._url_secrets = RedisSpec.from_url(url, **given).secrets() if password else ()
            return RedisSpec.from_url(url, username=self.redis_username, password=password, **given)
        except RedisSpecError as exc:
            raise ValueError(str(exc)) from None

    def _check_outputs(self) -> None:
        if self.outputs and self.output_queue:
            raise ValueError("set OUTPUT_QUEUE (one output) or OUTPUTS (named outputs), not both")
        for name, output in self.outputs.items():
            found = stage_of_input(output.queue)
            if not found or output.queue != input_stream(found[1], found[0]):
                raise ValueError(
                    f"OUTPUTS[{name}]: {output.queue!r} is no stage's default input stream "
                    "(phoenix:{<namespace>}:<stage>:input): a named output names a stage"
                )
            if output.queue == self.input_queue:
                raise ValueError(f"OUTPUTS[{name}] must differ from INPUT_QUEUE (a stage would feed itself)")

    @property
    def redis(self) -> RedisSpec:
        """How to reach Redis, parsed and checked once (phoenix.redis_spec.connect builds the clients)."""
        return self._redis

    @property
    def redis_secrets(self) -> tuple[str, ...]:
        """The Redis passwords the worker knows, to mask: its connection's, and the URL's own when REDIS_PASSWORD
        replaces it."""
        return (*self._redis.secrets(), *self._url_secrets)

    @property
    def keys(self) -> StageKeys:
        # A partitioned stage's INPUT_QUEUE and DLQ_NAME are the stage-wide names derived (its lanes' are in `lanes`).
        named = self.partitions == 1
        return StageKeys.for_stage(
            self.service_name,
            self.key_namespace,
            input=self.input_queue if named else None,
            group=self.consumer_group,
            dlq=self.dlq_name if named else None,
            output=self.output_queue,
            partitions=self.partitions,
        )

    @property
    def masked_variables(self) -> tuple[str, ...]:
        """The names MASKED_ENV lists."""
        return tuple(name for name in (part.strip() for part in self.masked_env.split(",")) if name)

    @property
    def retention(self) -> Retention | None:
        """OUTPUT_RETENTION parsed; None when unset."""
        return Retention.parse(self.output_retention) if self.output_retention else None

    @property
    def retry_queue(self) -> str:
        return self.keys.retry

    @property
    def record_prefix(self) -> str:
        return self.keys.record_prefix


def secret_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of a settings model that hold a secret: those typed SecretStr (optional or not)."""
    fields = model.model_fields.items()
    return frozenset(name for name, field in fields if SecretStr in (field.annotation, *get_args(field.annotation)))


def public_variables(*models: type[BaseModel]) -> frozenset[str]:
    """The variables of these settings models whose values are no secret, in upper case: what a support bundle may
    show (phoenix/cli/report.py)."""
    return frozenset(name.upper() for model in models for name in set(model.model_fields) - secret_fields(model))


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line naming each bad variable of `model`; the value of a secret one is never echoed, nor the user info
    of a URL in any other (BILLING_URL=https://user:password@host)."""
    secret = secret_fields(model)
    problems = []
    for err in exc.errors():
        message = err["msg"].removeprefix("Value error, ")
        if not err["loc"]:  # a rule across several variables: its message names them
            problems.append(message)
            continue
        field = str(err["loc"][0])
        value = "" if field in secret or err["type"] == "missing" else f" (got {err.get('input')!r})"
        problems.append(f"{field.upper()}: {message}{without_user_info(value)}")
    return "; ".join(problems)


def letter_case_clashes(environ: Mapping[str, str]) -> list[list[str]]:
    """The worker's variables set in more than one letter case (`REDIS_URL` and `redis_url`, the second from a
    ConfigMap of spec.pod.envFrom, say), each as its spellings: the settings read names case-insensitively, and which
    spelling would win follows the order of the environment, which the kubelet does not fix."""
    spellings: dict[str, list[str]] = {}
    for name in environ:
        if name.lower() in WorkerSettings.model_fields:
            spellings.setdefault(name.upper(), []).append(name)
    return [sorted(names) for _, names in sorted(spellings.items()) if len(names) > 1]


def load_settings() -> WorkerSettings:
    if clashes := letter_case_clashes(os.environ):
        # Names only: one of the values may be a secret.
        raise ConfigError(
            "; ".join(f"{names[0].upper()} is set in several letter cases ({', '.join(names)})" for names in clashes)
            + ": the worker reads its variables case-insensitively and could take either value; keep one spelling"
        )
    try:
        return WorkerSettings()
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, WorkerSettings)) from None
