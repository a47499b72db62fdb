"""PhoenixStage.status: what the operator observed, written by the operator only."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from phoenix.crds.common import CamelModel
from phoenix.keys import LATENCY_WINDOW_SECONDS, LATENCY_WINDOWS, StageKeys


class ConditionType(StrEnum):
    READY = "Ready"
    STREAM_READY = "StreamReady"
    DEPLOYMENT_READY = "DeploymentReady"
    AUTOSCALING_READY = "AutoscalingReady"
    BACKPRESSURE = "Backpressure"
    REDIS_RISK = "RedisRisk"
    OUTPUT_UNREAD = "OutputUnread"
    QUEUE_FIGURES_DISAGREE = "QueueFiguresDisagree"
    # A PhoenixPipeline's (crds/pipeline.py), beside its Ready.
    STAGES_READY = "StagesReady"
    PAUSED = "Paused"


class StatusModel(CamelModel):
    # kopf stores its own bookkeeping (handler results) beside ours, so reading status back must tolerate it; and
    # its timestamps come as strings.
    model_config = ConfigDict(extra="ignore", strict=False)


class Condition(StatusModel):
    """One aspect of the stage's state, following the Kubernetes API conventions (metav1.Condition)."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        description="Ready, StreamReady, DeploymentReady, AutoscalingReady, Backpressure, RedisRisk, OutputUnread or "
        "QueueFiguresDisagree.",
    )
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason for the last transition.",
    )
    message: str = Field(default="", max_length=32768, description="Human-readable details.")
    last_transition_time: datetime = Field(description="When the status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the condition was computed from."
    )


class QueueStatus(StatusModel):
    """The input stream and consumer group, as last sampled by the operator."""

    length: int | None = Field(default=None, ge=0, description="Entries in the input stream (XLEN).")
    pending: int | None = Field(
        default=None, ge=0, description="Entries delivered to a worker and not yet acknowledged."
    )
    lag: int | None = Field(default=None, ge=0, description="Entries not yet delivered to any worker (backlog).")
    oldest_pending_seconds: int | None = Field(
        default=None, ge=0, description="Age in seconds of the oldest unacknowledged entry."
    )
    oldest_undelivered_seconds: int | None = Field(
        default=None, ge=0, description="Age in seconds of the first entry not yet delivered to any worker."
    )
    oldest_unfinished_seconds: int | None = Field(
        default=None,
        ge=0,
        description="Age in seconds of the oldest entry not yet finished: the older of the oldest pending and the "
        "first undelivered entry (the OLDEST column).",
    )
    dlq_length: int | None = Field(default=None, ge=0, description="Entries in the dead-letter stream.")
    consumers: int | None = Field(default=None, ge=0, description="Consumers registered in the consumer group.")
    dlq_trimmed: int | None = Field(
        default=None, ge=0, description="Dead letters removed because the DLQ held more than DLQ_MAXLEN, ever."
    )
    throttled: int | None = Field(
        default=None,
        ge=0,
        description="Records the stage's rate limits, or a provider's 429, hold back in the retry set now (no "
        "failure: they come back when their limit has room; the RATE-LIMITED column). The total, ever, is the "
        'workers\' metric phoenix_messages_total{outcome="throttled"}.',
    )


class LatencyStatus(StatusModel):
    """End-to-end latency (entered_at to the commit at a final stage) of the records finished in the last minutes,
    from the buckets of phoenix_pipeline_latency_seconds (tools/latency.py)."""

    window_seconds: int = Field(
        default=LATENCY_WINDOW_SECONDS * LATENCY_WINDOWS,
        ge=0,
        description=f"The figures cover the minute being counted and the {LATENCY_WINDOWS - 1} before it: the last "
        f"{LATENCY_WINDOW_SECONDS * (LATENCY_WINDOWS - 1)} to {LATENCY_WINDOW_SECONDS * LATENCY_WINDOWS} seconds.",
    )
    count: int = Field(ge=0, description="Records finished in the window.")
    p50_seconds: float | None = Field(
        default=None, ge=0, description="Median, interpolated within its bucket (0.1 s to 24 h buckets)."
    )
    p99_seconds: float | None = Field(
        default=None,
        ge=0,
        description="99th percentile, interpolated within its bucket: off by at most that bucket's width; 86400 "
        "means at least a day.",
    )


class LatencyBucket(StatusModel):
    """The records of one bucket of phoenix_pipeline_latency_seconds (not cumulative)."""

    le: str = Field(max_length=32, description="The bucket's upper bound in seconds, as Prometheus writes it.")
    count: int = Field(ge=0, description="Records whose latency fell in this bucket and not in a smaller one.")


class StageLatencyStatus(LatencyStatus):
    """A final stage's own end-to-end latency, with its buckets for a pipeline to merge."""

    buckets: list[LatencyBucket] = Field(
        default_factory=list, max_length=32, description="The non-empty buckets, smallest first."
    )


class ReplicaStatus(StatusModel):
    """Worker pods of the stage's Deployment."""

    desired: int = Field(default=0, ge=0, description="Pods the Deployment asks for.")
    ready: int = Field(default=0, ge=0, description="Pods passing their readiness probe.")
    summary: str = Field(default="0/0", max_length=32, description="`ready/desired`, for `kubectl get`.")

    @classmethod
    def of(cls, desired: int, ready: int) -> ReplicaStatus:
        return cls(desired=desired, ready=ready, summary=f"{ready}/{desired}")


class StreamsStatus(StatusModel):
    """The Redis names the stage actually uses, with defaults resolved."""

    input: str = Field(description="Stream the stage consumes.")
    output: str | None = Field(default=None, description="Stream results go to; absent for a final stage.")
    consumer_group: str = Field(description="Consumer group of the stage's workers.")
    dlq: str = Field(description="Dead-letter stream.")
    partitions: int = Field(
        default=1,
        ge=1,
        description="Partitions of the stage: with more than one, input and dlq are named as of the stage as a "
        "whole, and each partition p has its own, with `{<namespace>~<p>}` in place of `{<namespace>}`.",
    )

    @classmethod
    def of(cls, keys: StageKeys) -> StreamsStatus:
        return cls(
            input=keys.input,
            output=keys.output,
            consumer_group=keys.consumer_group,
            dlq=keys.dlq,
            partitions=keys.partitions,
        )


class ReplayStatus(StatusModel):
    """The last replay of DLQ entries back into the input stream."""

    requested: int = Field(ge=0, description="Entries asked to be replayed.")
    moved: int = Field(ge=0, description="Entries actually moved back to the input stream.")
    at: datetime = Field(description="When the replay ran.")


class ReplayRequest(StatusModel):
    """A `phoenix.io/replay-dlq` request claimed by the operator and not yet finished."""

    id: str = Field(max_length=64, description="Identity of the request; a resumed replay continues under it.")
    count: str = Field(max_length=16, description="The annotation's value: `all` or a number of entries.")


class PhoenixStageStatus(StatusModel):
    """Observed state of the stage, maintained by the Phoenix operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec last reconciled."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, StreamReady, DeploymentReady, AutoscalingReady, Backpressure (True while the stage has "
        "stopped reading because its output is over OUTPUT_HIGH_WATER), RedisRisk (True when Redis may lose "
        "acknowledged data), OutputUnread (True while no consumer group reads the output stream: it is then "
        "trimmed only to output.retention, if set) and QueueFiguresDisagree (True while Redis's lag or oldest "
        "pending entry disagrees with the stream's ids, as after XDEL or XTRIM; the message says how).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    streams: StreamsStatus | None = Field(default=None, description="Resolved Redis names.")
    queue: QueueStatus | None = Field(default=None, description="Backlog of the input stream.")
    latency: StageLatencyStatus | None = Field(
        default=None,
        description="A final stage's end-to-end latency over the last minutes; absent when it finished no record "
        "in them.",
    )
    replicas: ReplicaStatus | None = Field(default=None, description="Worker pods.")
    last_restart: datetime | None = Field(default=None, description="When the workers were last restarted.")
    last_replay: ReplayStatus | None = Field(default=None, description="The last DLQ replay.")
    handled_restart: str | None = Field(
        default=None,
        max_length=256,
        description="The `phoenix.io/restart` value last acted on; a new value restarts the workers once.",
    )
    replay_request: ReplayRequest | None = Field(
        default=None, description="A DLQ replay in progress (set before entries move, cleared when done)."
    )
