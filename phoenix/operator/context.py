"""Everything the handlers share for the life of the operator process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phoenix.operator.kube import KubeApi
from phoenix.operator.redis_pool import RedisPool
from phoenix.operator.registry import StageRegistry
from phoenix.operator.status import StatusWriter


@dataclass
class OperatorContext:
    kube: KubeApi
    namespaces: tuple[str, ...]  # empty: the whole cluster
    refresh_interval: float
    pool: RedisPool = field(default_factory=RedisPool)
    registry: StageRegistry = field(default_factory=StageRegistry)
    writer: StatusWriter = field(init=False)
    # The last status refresh cycle's figures (see refresh.CycleReport), served on the liveness endpoint.
    last_refresh: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.writer = StatusWriter(self.kube)
