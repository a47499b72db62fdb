"""The periodic status refresh of every stage: queue figures from Redis, replicas from the Deployments; the
same figures feed the per-stage gauges of the operator's /metrics.

One cycle costs one pipelined round trip per distinct Redis URL (queue_stats.collect covers all stages on it; a
second one when some stage has a backlog or pending entries, checking the figures against the stream's ids), one
Deployment list call, and a status patch only for stages whose status changed: at once when a condition or the
replicas changed, and when only the figures did (the queue's and the latency's: they move every cycle while records
flow), for a bounded number of stages per cycle, the longest unwritten first (due_writes), so that every stage's
figures are written within FIGURES_MAX_CYCLES cycles and a cycle where every stage's figures moved costs a fraction
of the patches.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import RedisError

from phoenix.crds import Condition, ConditionType
from phoenix.kube_names import STAGE_LABEL
from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError
from phoenix.operator.metrics import STAGES, stage_figures
from phoenix.operator.record import StageKey, StageRecord
from phoenix.operator.redis.pool import RedisPool
from phoenix.operator.status.conditions import find_condition
from phoenix.operator.status.durability import (
    OUTPUT_NEVER_TRIMMED,
    backpressure_condition,
    output_unread_condition,
    queue_figures_condition,
    redis_risk_condition,
)
from phoenix.operator.status.latency import stage_latency
from phoenix.operator.status.readiness import deployment_condition, queue_drained, replica_status
from phoenix.redis_spec import RedisSpec
from phoenix.tools.queue_stats import QueueStats, collect
from phoenix.worker_runtime.redis_risk import RedisRisk, assess_redis

logger = logging.getLogger(__name__)
PATCH_CONCURRENCY = 32
# status.queue, the figures a refresh writes for at most max(PATCH_CONCURRENCY, stages / FIGURES_MAX_CYCLES)
# stages a cycle when nothing else of theirs changed: the figures `kubectl get phoenixstages` shows are then at most
# FIGURES_MAX_CYCLES refreshes old (each refresh-interval, 10 s by default, after the last one ended: docs/operator.md).
FIGURES = "queue"
FIGURES_MAX_CYCLES = 3
# status.latency, the end-to-end latency of a final stage: figures too, written as the queue's are.
LATENCY = "latency"
# The source of the OutputUnread Warning, de-duplicated on its own (events.EventRecorder.warning).
OUTPUT = "output"
# How long an output must have had no reader before the Warning: stages applied together create their groups
# one after another, so the first cycles may see the next stage's input before its group.
OUTPUT_UNREAD_WARN_SECONDS = 10.0
# Server settings rarely change: each Redis is checked at the first cycle that sees it, then this often.
REDIS_RISK_CHECK_SECONDS = 300.0


@dataclass(frozen=True)
class CycleReport:
    started_at: float  # seconds since the epoch: which cycle this is
    stages: int
    redis_round_trips: int
    redis_failures: int
    patched: int
    deferred: int  # stages whose figures changed, left for a later cycle (due_writes)
    seconds: float
    read_seconds: float  # Redis and the Deployment list; the rest of `seconds` is writing status

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_by_redis(records: Iterable[StageRecord]) -> dict[RedisSpec, list[StageRecord]]:
    """Stages that share a Redis, so that each Redis is asked once per cycle."""
    groups: dict[RedisSpec, list[StageRecord]] = defaultdict(list)
    for record in records:
        if record.redis is not None and record.streams is not None:
            groups[record.redis].append(record)
    return dict(groups)


def queue_status(stats: QueueStats) -> dict[str, int | None]:
    """status.queue: whole numbers; an unknown figure None, which the merge patch removes (left out, the figure
    sampled before it would stay: a lag Redis stops counting after an XDEL)."""
    return {key: None if value is None else round(value) for key, value in stats.as_status().items()}


async def _sample(pool: RedisPool, redis: RedisSpec, records: list[StageRecord]) -> dict[StageKey, QueueStats] | None:
    # group_by_redis kept only reconciled stages (streams set); zip(strict=True) below checks none was dropped.
    queues = [s for r in records if (s := r.streams) is not None]
    try:
        stats = await collect(pool.client(redis), queues)
    except (RedisError, OSError) as exc:
        pool.failed(redis, exc)
        logger.warning("queue refresh: Redis at %s failed: %s", redis.redacted, redis.masked(str(exc)))
        return None
    return {record.key: stat for record, stat in zip(records, stats, strict=True)}


async def _redis_risk(ctx: OperatorContext, redis: RedisSpec) -> RedisRisk | None:
    """The cached check of `redis`, renewed every REDIS_RISK_CHECK_SECONDS; None while unreachable."""
    cached = ctx.redis_risks.get(redis)
    if cached is not None and time.monotonic() - cached[0] < REDIS_RISK_CHECK_SECONDS:
        return cached[1]
    try:
        await ctx.pool.client(redis).ping()
    except (RedisError, OSError):
        return None  # unreachable is not "could not be checked"; the queue sample reports the outage
    risk = await assess_redis(ctx.pool.client(redis))
    ctx.redis_risks[redis] = (time.monotonic(), risk)
    if risk.at_risk:
        logger.warning("Redis at %s may lose acknowledged data: %s", redis.redacted, risk.describe())
    return risk


def _retention(record: StageRecord) -> str | None:
    output = ((record.body or {}).get("spec") or {}).get("output") or {}
    return output.get("retention")


async def _output_unread(ctx: OperatorContext, record: StageRecord, stats: QueueStats) -> Condition:
    """The OutputUnread condition, with a Warning Event (once per cause) when the stage will stop for good."""
    output = record.streams.output if record.streams else None
    found = output_unread_condition(output, stats.output_unread is True, _retention(record), record.generation)
    before = find_condition(record.status.get("conditions") or [], ConditionType.OUTPUT_UNREAD)
    if found.reason == OUTPUT_NEVER_TRIMMED and before is not None and before.get("reason") == found.reason:
        since = datetime.fromisoformat(str(before["lastTransitionTime"]))
        if (datetime.now(UTC) - since).total_seconds() >= OUTPUT_UNREAD_WARN_SECONDS:
            await ctx.events.warning(record, OUTPUT, StageError("OutputUnread", found.message))
    else:
        ctx.events.resolved(record, OUTPUT)
    return found


def _by_stage(deployments: Iterable[Mapping[str, Any]]) -> dict[StageKey, Mapping[str, Any]]:
    found: dict[StageKey, Mapping[str, Any]] = {}
    for deployment in deployments:
        meta = deployment["metadata"]
        stage = (meta.get("labels") or {}).get(STAGE_LABEL)
        if stage is not None:
            found[(meta["namespace"], stage)] = deployment
    return found


@dataclass(frozen=True)
class PlannedWrite:
    """A stage's status as this cycle found it, and the patch it makes (empty: nothing changed)."""

    record: StageRecord
    changes: dict[str, Any]
    conditions: list[Condition]
    patch: dict[str, Any]

    @property
    def figures_only(self) -> bool:
        """Only figures moved; a stage that drained or began to queue is a change of state (a pipeline's pause
        waits for its stages to drain: pipeline/lifecycle.py), written at once."""
        if not self.patch or not self.patch.keys() <= {FIGURES, LATENCY}:
            return False
        return queue_drained(self.record.status.get(FIGURES) or {}) == queue_drained(self.changes.get(FIGURES) or {})


def due_writes(planned: Sequence[PlannedWrite], stages: int) -> list[PlannedWrite]:
    """The patches this cycle writes: every one with more than figures in it, and the figure-only ones of the
    stages longest unwritten, at most max(PATCH_CONCURRENCY: one round of concurrent patches, stages /
    FIGURES_MAX_CYCLES) of them, so that each stage's turn comes within FIGURES_MAX_CYCLES cycles."""
    urgent = [p for p in planned if p.patch and not p.figures_only]
    figures = sorted((p for p in planned if p.figures_only), key=lambda p: p.record.figures_written)
    budget = max(PATCH_CONCURRENCY, math.ceil(stages / FIGURES_MAX_CYCLES))
    return urgent + figures[:budget]


def note_missing_groups(
    ctx: OperatorContext, records: Iterable[StageRecord], queues: Mapping[StageKey, QueueStats]
) -> None:
    """A reconciled stage whose consumer group is gone (Redis flushed, or restarted without persistence) is
    drift: the converger recreates the group and the DLQ."""
    for record in records:
        stats = queues.get(record.key)
        if stats is not None and not stats.group_exists and record.error is None and record.children:
            group = record.streams.consumer_group if record.streams else "?"
            record.drift[f"consumer group {group} is missing from Redis"] = "ConsumerGroup"
            ctx.wake.set()


async def refresh_once(ctx: OperatorContext) -> CycleReport:
    started_at = time.time()
    started = time.perf_counter()
    records = ctx.registry.records()
    groups = group_by_redis(records)
    samples, risks, deployments = await asyncio.gather(
        asyncio.gather(*(_sample(ctx.pool, redis, members) for redis, members in groups.items())),
        asyncio.gather(*(_redis_risk(ctx, redis) for redis in groups)),
        ctx.kube.managed_deployments(ctx.namespaces),
    )
    risk_by_redis = dict(zip(groups, risks, strict=True))
    read_seconds = time.perf_counter() - started
    queues: dict[StageKey, QueueStats] = {}
    for sample in samples:
        queues.update(sample or {})
    note_missing_groups(ctx, records, queues)
    by_stage = _by_stage(deployments)
    limit = asyncio.Semaphore(PATCH_CONCURRENCY)

    async def plan(record: StageRecord) -> PlannedWrite:
        deployment = by_stage.get(record.key)
        changes: dict[str, Any] = {"replicas": replica_status(deployment).to_k8s()}
        conditions = [deployment_condition(deployment, record.generation)]
        if record.key in queues:
            stats = queues[record.key]
            changes[FIGURES] = queue_status(stats)
            changes[LATENCY] = stage_latency(stats.latency)  # None: no record finished lately, the field goes
            conditions.append(backpressure_condition(stats.backpressure, record.generation))
            conditions.append(queue_figures_condition(stats.disagreements, record.generation))
            conditions.append(await _output_unread(ctx, record, stats))
        if record.redis is not None and (risk := risk_by_redis.get(record.redis)) is not None:
            conditions.append(redis_risk_condition(risk, record.generation))
        return PlannedWrite(record, changes, conditions, ctx.writer.pending(record, changes, conditions))

    async def write(planned: PlannedWrite) -> bool:
        async with limit:
            written = await ctx.writer.update(planned.record, planned.changes, planned.conditions)
        if written and planned.patch.keys() & {FIGURES, LATENCY}:
            planned.record.figures_written = time.monotonic()
        return written

    # Stages whose reconcile failed have no Deployment to report on yet: their status says why already.
    planned = await asyncio.gather(*(plan(r) for r in records if r.error is None and r.streams is not None))
    due = due_writes(planned, len(records))
    patched = await asyncio.gather(*(write(p) for p in due))
    STAGES.update(stage_figures(r, queues.get(r.key), by_stage.get(r.key)) for r in records)
    return CycleReport(
        started_at=round(started_at, 3),
        stages=len(records),
        redis_round_trips=len(groups),
        redis_failures=sum(sample is None for sample in samples),
        patched=sum(patched),
        deferred=sum(p.figures_only for p in planned) - sum(p.figures_only for p in due),
        seconds=round(time.perf_counter() - started, 4),
        read_seconds=round(read_seconds, 4),
    )


async def refresh_forever(ctx: OperatorContext) -> None:
    """A cycle every ctx.refresh_interval seconds, its figures kept in ctx.refresh_reports."""
    while True:
        try:
            report = await refresh_once(ctx)
            ctx.refresh_reports["last"] = report.as_dict()
            if report.patched:
                ctx.refresh_reports["lastWithChanges"] = report.as_dict()
            logger.debug("status refresh: %s", report)
        except Exception:
            # The next cycle retries; a broken cycle must not stop the operator.
            logger.exception("status refresh cycle failed")
        await asyncio.sleep(ctx.refresh_interval)
