"""Where `phoenix ingest` writes a pipeline's records: its stages (from the API server's PhoenixStages, as `phoenix
trace` finds them, or given on the command line for a pipeline without Kubernetes), their Redis, the producer of
its first stage and the gate that holds requests back while that stage's input is over its high water.

A pipeline is read once and kept `refresh` seconds, so that a request costs no API call; the Redis clients are
shared by every pipeline of one Redis.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kubernetes.client.exceptions import ApiException
from redis.asyncio import Redis
from redis.exceptions import RedisError
from urllib3.exceptions import HTTPError

from phoenix.cli.kubectl import PluginError, Stages, pipeline_stages, spec_settings, stage_target
from phoenix.cli.stage import StageSettings, redis_client
from phoenix.crds import PhoenixStage
from phoenix.errors import PhoenixError
from phoenix.keys import StageKeys
from phoenix.producer import Producer
from phoenix.redis_spec import RedisSpec
from phoenix.worker_runtime.backpressure import unfinished_entries
from phoenix.worker_runtime.ownership import laid_out

# The first stage's input is measured at most this often; between two measurements the records the ingest added
# itself are counted on top (as the worker's backpressure does).
MEASURE_SECONDS = 1.0


class UnknownPipeline(PhoenixError):
    """No pipeline of this name: the message says where it was looked for."""


class PipelineUnavailable(PhoenixError):
    """The pipeline exists but cannot be read now (the API server, a Secret the ingest may not read): one line,
    no secret."""


@dataclass(frozen=True)
class Pipeline:
    """A pipeline as the ingest sees it: its stages in the pipeline's order (the first takes the records) and the
    Redis they share."""

    name: str
    stages: tuple[StageSettings, ...]
    redis: RedisSpec

    @property
    def first(self) -> StageSettings:
        return self.stages[0]


class PipelineSource(Protocol):
    async def read(self, name: str) -> Pipeline:
        """The pipeline `name`; UnknownPipeline or PipelineUnavailable."""
        ...


@dataclass
class KubePipelines:
    """Pipelines from the API server: the PhoenixStages of `namespace` grouped as `phoenix ui` groups them, each
    stage's names and timings as its workers get them, the Redis URL from its Secret (read with the ingest's own
    ServiceAccount, kept in memory only); `redis_host` re-points it (a port-forward)."""

    stages: Stages
    namespace: str
    redis_host: str | None = None

    async def read(self, name: str) -> Pipeline:
        try:
            return await asyncio.to_thread(self._read, name)
        except ApiException as exc:
            raise PipelineUnavailable(f"the API server refused: {exc.status} {exc.reason}") from None
        except (HTTPError, OSError) as exc:  # the API server unreachable: urllib3's errors
            raise PipelineUnavailable(f"the API server: {type(exc).__name__}") from None

    def _read(self, name: str) -> Pipeline:
        try:
            bodies = pipeline_stages(self.stages, self.namespace, name, [])
        except PluginError as exc:
            raise UnknownPipeline(str(exc)) from None
        try:
            # One Redis for the pipeline: its stages hand records to each other through its streams.
            redis, _ = stage_target(self.stages.api, bodies[0], self.redis_host)
        except PluginError as exc:
            raise PipelineUnavailable(str(exc)) from None
        settings = tuple(spec_settings(PhoenixStage.from_body(body), self.namespace) for body in bodies)
        return Pipeline(name, settings, redis)


@dataclass
class GivenPipeline:
    """One pipeline named on the command line (`--pipeline NAME --stage A --stage B`, like `phoenix trace`): its
    stages' default names in `namespace`, their partitions from their layouts in Redis."""

    name: str
    stage_names: Sequence[str]
    namespace: str
    redis: RedisSpec

    async def read(self, name: str) -> Pipeline:
        if name != self.name:
            raise UnknownPipeline(f"no pipeline {name!r}: this ingest serves {self.name!r}")
        try:
            async with redis_client(self.redis) as client:
                keys = await laid_out(client, [StageKeys.for_stage(s, self.namespace) for s in self.stage_names])
        except RedisError as exc:
            raise PipelineUnavailable(f"Redis: {self.redis.explain(exc)}") from None
        stages = tuple(
            StageSettings(service_name=k.name, key_namespace=k.namespace, partitions=k.partitions) for k in keys
        )
        return Pipeline(name, stages, self.redis)


@dataclass
class Gate:
    """Holds requests back while the first stage's input (every lane of it) holds `high_water` unfinished entries
    or more: what its consumer group has not acknowledged, as the worker's backpressure counts an output."""

    streams: tuple[str, ...]
    high_water: int  # 0: never
    measured: int = 0
    measured_at: float = -math.inf
    added_since: int = 0

    async def backlog_over(self, client: Redis) -> int | None:
        """The backlog when it is at or over the high water, else None."""
        if not self.high_water:
            return None
        now = time.monotonic()
        if now - self.measured_at >= MEASURE_SECONDS:
            self.measured = sum([await unfinished_entries(client, stream) or 0 for stream in self.streams])
            self.measured_at, self.added_since = now, 0
        backlog = self.measured + self.added_since
        return backlog if backlog >= self.high_water else None

    def note_added(self, count: int) -> None:
        self.added_since += count


@dataclass
class Target:
    """A pipeline ready to take records."""

    pipeline: Pipeline
    client: Redis
    producer: Producer
    gate: Gate
    read_at: float


@dataclass(frozen=True)
class IngestOptions:
    high_water: int | None  # None: the first stage's OUTPUT_HIGH_WATER
    dedup_seconds: int | None  # None: the first stage's IDEMPOTENCY_TTL
    refresh_seconds: float


@dataclass
class Targets:
    """The pipelines met so far, each read again after `refresh_seconds`."""

    source: PipelineSource
    options: IngestOptions
    _known: dict[str, Target] = field(default_factory=dict)
    _clients: dict[RedisSpec, Redis] = field(default_factory=dict)

    async def get(self, name: str) -> Target:
        known = self._known.get(name)
        if known is not None and time.monotonic() - known.read_at < self.options.refresh_seconds:
            return known
        pipeline = await self.source.read(name)
        if known is not None and known.pipeline == pipeline:
            known.read_at = time.monotonic()
            return known
        self._known[name] = target = self._target(pipeline)
        return target

    def dedup_seconds(self, target: Target) -> int:
        return self.options.dedup_seconds or math.ceil(target.pipeline.first.idempotency_ttl)

    def forget(self, name: str) -> None:
        """Read the pipeline again at its next request (its Redis failed: a rotated password, a moved service)."""
        self._known.pop(name, None)

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    def _target(self, pipeline: Pipeline) -> Target:
        if pipeline.redis not in self._clients:
            self._clients[pipeline.redis] = redis_client(pipeline.redis)
        client, first = self._clients[pipeline.redis], pipeline.first
        producer = Producer(
            client,
            first.service_name,
            first.key_namespace,
            # The spec's partitions, which the stage's layout in Redis holds too; one: its owner marker names the
            # input (spec.input), which the producer reads.
            partitions=first.partitions if first.partitions > 1 else None,
            min_replicas_ack=first.min_replicas_ack,
            min_replicas_timeout_ms=first.min_replicas_timeout_ms,
        )
        high_water = first.output_high_water if self.options.high_water is None else self.options.high_water
        gate = Gate(tuple(lane.input for lane in first.keys.lanes), high_water)
        return Target(pipeline, client, producer, gate, time.monotonic())
