"""Everything the handlers share for the life of the operator process."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from phoenix.operator.kube.api import KubeApi
from phoenix.operator.kube.events import EventRecorder
from phoenix.operator.record import PipelineRegistry, StageRegistry
from phoenix.operator.redis.acl import RedisUsers
from phoenix.operator.redis.pool import RedisPool
from phoenix.operator.status.writer import StatusWriter
from phoenix.redis_spec import RedisSpec
from phoenix.worker_runtime.redis_risk import RedisRisk


@dataclass
class OperatorContext:
    """What every kopf handler and background task of the operator process shares, made once at its start
    (main.py) and handed to the handlers in kopf's memo: the clients (`kube` for the API server, `pool` of Redis
    clients by connection spec), what it watches (`namespaces`, `refresh_interval`), who it is (`cluster`), the
    namespaces' Redis ACL users when it runs them (`users`), its memory of the stages (`registry`) and of the
    pipelines (`pipelines`), the status writer and Event recorder built on `kube`, the converger's `wake`, and what
    the status refresh last found (`refresh_reports`, `redis_risks`)."""

    kube: KubeApi
    namespaces: tuple[str, ...]  # empty: the whole cluster
    refresh_interval: float
    # This Kubernetes cluster's identity in the ownership markers ("": unknown; main.cluster_identity).
    cluster: str = ""
    # The namespaces' Redis ACL users (redis/acl.py), None unless --redis-acl-admin-secret.
    users: RedisUsers | None = None
    pool: RedisPool = field(default_factory=RedisPool)
    registry: StageRegistry = field(default_factory=StageRegistry)
    pipelines: PipelineRegistry = field(default_factory=PipelineRegistry)
    writer: StatusWriter = field(init=False)
    events: EventRecorder = field(init=False)
    # Set when a stage has new work for the converger (drift noticed), so that it does not wait for its tick.
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Figures of the last status refresh cycle and of the last one that patched something (refresh.CycleReport),
    # served on the liveness endpoint.
    refresh_reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Per Redis URL: (monotonic time checked, what the check found); see refresh.REDIS_RISK_CHECK_SECONDS.
    redis_risks: dict[RedisSpec, tuple[float, RedisRisk]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.writer = StatusWriter(self.kube)
        self.events = EventRecorder(self.kube)
