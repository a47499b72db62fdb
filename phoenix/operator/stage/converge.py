"""The converger: one background loop that does each stage's pending work outside kopf's handlers.

Work comes from the stage's own object (a restart or replay asked for by annotation), from drift noticed in its
children's watch events or in Redis by the status refresh, and from a stage waiting for KEDA to be installed
(or for a KEDA object of its name that it does not own to go).
kopf timers would do the same but add a finalizer to every stage they apply to, so a stage could not be deleted
while the operator is down; this loop needs none. A repair or KEDA re-check is a whole reconcile
(stage_reconcile.reconcile_stage, as the kopf handler runs it); a restart or replay is stage/requests.py's. At most
one piece of work runs per stage at a time; a failure waits with backoff (errors.retry_delay) before that stage's
next attempt, and its Warning is posted once per cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError, retry_delay
from phoenix.operator.metrics import record_drift_repair
from phoenix.operator.record import StageRecord
from phoenix.operator.stage import requests as stage_requests
from phoenix.operator.stage.reconcile import reconcile_stage
from phoenix.operator.status.readiness import autoscaling_rechecked

logger = logging.getLogger(__name__)
# How often the loop looks for due work when nothing wakes it (a pending request, a backoff that ended).
TICK_SECONDS = 1.0
# How often a stage running without KEDA looks again whether KEDA has been installed (or a foreign KEDA object of
# its name removed) meanwhile.
KEDA_RECHECK_SECONDS = 30.0

Work = Callable[[OperatorContext, StageRecord, Mapping[str, Any]], Awaitable[None]]


def current_view(record: StageRecord) -> Mapping[str, Any] | None:
    """The object as last watched, with the status as this operator last wrote it (the watch may lag)."""
    if record.body is None or record.body.get("metadata", {}).get("deletionTimestamp"):
        return None  # being deleted: garbage collection takes the children, nothing is to be restored
    return {**record.body, "status": record.status}


def due_work(record: StageRecord, view: Mapping[str, Any], now: float) -> str | None:
    """The stage's next piece of work, most urgent first: repairs make restarts and replays possible again."""
    if record.drift:
        return "repair"
    if stage_requests.has_restart_request(view):
        return "restart"
    if stage_requests.has_replay_work(view):
        return "replay"
    if autoscaling_rechecked(view) and now - record.keda_checked_at >= KEDA_RECHECK_SECONDS:
        return "keda"
    return None


async def _repair(ctx: OperatorContext, record: StageRecord, view: Mapping[str, Any]) -> None:
    causes = dict(record.drift)
    record.drift.clear()
    try:
        await reconcile_stage(ctx, record, view)
    except StageError:
        record.drift.update(causes)  # still to be repaired, after the backoff
        raise
    for kind in causes.values():
        record_drift_repair(record.namespace, record.name, kind)
    logger.info("drift_repaired %s/%s: %s", record.namespace, record.name, "; ".join(sorted(causes)))


async def _recheck_keda(ctx: OperatorContext, record: StageRecord, view: Mapping[str, Any]) -> None:
    record.keda_checked_at = time.monotonic()
    await reconcile_stage(ctx, record, view)


WORK: dict[str, Work] = {
    "repair": _repair,
    "restart": stage_requests.restart_workers,
    "replay": stage_requests.replay_dlq,
    "keda": _recheck_keda,
}


async def _run(ctx: OperatorContext, record: StageRecord, work: str, view: Mapping[str, Any]) -> None:
    try:
        await WORK[work](ctx, record, view)
    except Exception as error:
        record.retry_at = time.monotonic() + retry_delay(record.attempts)
        record.attempts += 1
        if isinstance(error, StageError):  # an expected failure: its reason and message say it all
            logger.warning(
                "%s of %s/%s failed (attempt %d): %s", work, record.namespace, record.name, record.attempts, error
            )
        else:
            logger.exception("%s of %s/%s failed", work, record.namespace, record.name)
    else:
        record.attempts, record.retry_at = 0, 0.0
    finally:
        record.task = None
        ctx.wake.set()  # the stage may have more work (a replay after a restart)


def start_due_work(ctx: OperatorContext) -> int:
    """Start the due work of every idle stage; returns how many were started."""
    now = time.monotonic()
    started = 0
    for record in ctx.registry.records():
        if record.task is not None or now < record.retry_at:
            continue
        view = current_view(record)
        work = None if view is None else due_work(record, view, now)
        if work is not None and view is not None:
            record.task = asyncio.create_task(_run(ctx, record, work, view), name=f"{work} {record.key}")
            started += 1
    return started


async def converge_forever(ctx: OperatorContext) -> None:
    """Until cancelled; then the work it started is cancelled with it (what was not finished is due again at the
    next start: requests and drift are read from the objects, not remembered)."""
    try:
        while True:
            ctx.wake.clear()
            start_due_work(ctx)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.wake.wait(), TICK_SECONDS)
    finally:
        running = [record.task for record in ctx.registry.records() if record.task is not None]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
