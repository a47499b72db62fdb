"""What the operator does for a stage: run the operation, write status, post Events, report failures.

The kopf handlers (handlers.py) and the converger (converge.py) both call these; a failure is a StageError,
which the kopf handlers turn into retries with backoff and the converger into its own backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from redis.exceptions import RedisError

from phoenix.crds import ConditionType, StreamsStatus
from phoenix.operator import annotations as annotation_actions  # "annotations" is taken by __future__
from phoenix.operator.builders import new_condition, resolve_streams
from phoenix.operator.builders.meta import STAGE_LABEL
from phoenix.operator.context import OperatorContext
from phoenix.operator.drift import describe, differences
from phoenix.operator.errors import StageError, scrub
from phoenix.operator.reconcile import failed_status, reconcile, reconciled_status, redis_url_of, stage_model
from phoenix.operator.redis_ops import destroy
from phoenix.operator.registry import StageRecord

logger = logging.getLogger(__name__)
MAX_BACKOFF_SECONDS = 120.0
# Sources of Warnings, each de-duplicated on its own (events.EventRecorder.warning).
RECONCILE, RESTART, REPLAY, DELETE = "reconcile", "restart", "replay", "delete"
_KEEP_DATA_HINT = "set spec.deletionPolicy to Retain to keep the data and let the stage go"


def backoff(retry: int) -> float:
    """5 s, 10 s, 20 s, ... up to two minutes."""
    return min(5.0 * 2 ** min(retry, 10), MAX_BACKOFF_SECONDS)


def _api_error(exc: ApiException) -> StageError:
    return StageError("KubernetesApiError", f"{exc.status} {exc.reason}: {exc.body!s:.500}")


def kopf_retry(error: StageError, retry: int) -> kopf.TemporaryError | kopf.PermanentError:
    if error.permanent:
        return kopf.PermanentError(str(error))
    return kopf.TemporaryError(str(error), delay=backoff(retry))


async def converge_stage(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> None:
    """Reconcile the stage with `body`; writes status and Events; raises StageError when it cannot run."""
    async with record.reconcile_lock:
        generation = record.generation
        try:
            try:
                result = await reconcile(ctx.kube, ctx.pool, record, body)
            except ApiException as exc:
                raise _api_error(exc) from None
        except StageError as error:
            record.error = new_condition(ConditionType.READY, False, error.reason, error.message)
            await ctx.writer.update(record, *failed_status(error, generation))
            await ctx.events.warning(record, RECONCILE, error)
            raise
        record.error = None
        ctx.events.resolved(record, RECONCILE)
        await ctx.writer.update(record, *reconciled_status(result, generation))
        for action in result.actions:
            await ctx.events.normal(record, action.reason, action.message)


async def reconcile_stage(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> None:
    record = ctx.registry.observe(body)
    try:
        await converge_stage(ctx, record, body)
    except StageError as error:
        raise kopf_retry(error, retry) from None


def child_changed(ctx: OperatorContext, event_type: str | None, body: Mapping[str, Any]) -> None:
    """A watch event of a Deployment, ScaledObject or TriggerAuthentication the operator manages: when it was
    deleted or departs from what its stage wants, the stage is marked for repair (the converger does it)."""
    meta = body["metadata"]
    record = ctx.registry.get((meta["namespace"], (meta.get("labels") or {}).get(STAGE_LABEL, "")))
    kind, name = body.get("kind", ""), meta["name"]
    wanted = None if record is None else record.children.get(kind)
    if record is None or wanted is None or wanted["metadata"]["name"] != name:
        return
    if event_type == "DELETED":
        cause = f"{kind} {name} was deleted"
    elif paths := differences(wanted, body):
        cause = describe(kind, name, paths)
    else:
        return
    record.drift[cause] = kind
    ctx.wake.set()


async def delete_stage(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> None:
    """deletionPolicy Delete: remove the Redis data before the object goes; children go by garbage collection.

    Tried until it succeeds (a stage left with its data silently behind is worse than one that waits): status
    and one Warning per cause say why it waits and how to let it go without its data."""
    record = ctx.registry.observe(body)
    try:
        streams = await _delete_redis_data(ctx, record, body)
    except StageError as error:
        delay = backoff(retry)
        told = StageError(error.reason, f"deletionPolicy is Delete and the Redis data cannot be deleted yet: "
                                        f"{error.message} ({_KEEP_DATA_HINT})")  # fmt: skip
        record.error = new_condition(
            ConditionType.READY, False, error.reason, f"{told.message}; attempt {retry + 1}, next in {delay:g} s"
        )
        await ctx.writer.update(record)
        await ctx.events.warning(record, DELETE, told)
        raise kopf.TemporaryError(str(error), delay=delay) from None
    await ctx.events.normal(
        record, "RedisDataDeleted",
        f"deleted consumer group {streams.consumer_group}, streams {streams.input} and {streams.dlq}",
    )  # fmt: skip
    ctx.registry.forget(record.key)
    await ctx.pool.retain({r.redis_url for r in ctx.registry.records() if r.redis_url is not None})


async def _delete_redis_data(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> StreamsStatus:
    stage = stage_model(body)
    # The Secret may already be gone (a namespace being deleted): the URL of the last reconcile still works.
    url = record.redis_url or await redis_url_of(ctx.kube, stage)
    streams = resolve_streams(stage.metadata.name, stage.spec)
    try:
        await destroy(ctx.pool.client(url), stage.metadata.name, streams)
    except (RedisError, OSError) as exc:
        raise StageError("RedisUnavailable", f"cannot reach Redis: {scrub(str(exc), url)}") from None
    return streams


async def restart_workers(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> None:
    try:
        try:
            restarted_at = await annotation_actions.restart(ctx.kube, ctx.writer, record, body)
        except ApiException as exc:
            raise _api_error(exc) from None
    except StageError as error:
        await ctx.events.warning(record, RESTART, error)
        raise
    ctx.events.resolved(record, RESTART)
    if restarted_at is not None:
        await ctx.events.normal(record, "Restarted", f"rolling restart of the workers at {restarted_at}")


async def replay_dlq(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> None:
    try:
        try:
            last = await annotation_actions.replay(ctx.kube, ctx.pool, ctx.writer, record, body)
        except ApiException as exc:
            raise _api_error(exc) from None
        except (RedisError, OSError) as exc:
            raise StageError("RedisUnavailable", f"DLQ replay: {scrub(str(exc), record.redis_url)}") from None
    except StageError as error:
        await ctx.events.warning(record, REPLAY, error)
        raise
    ctx.events.resolved(record, REPLAY)
    if last is not None:
        await ctx.events.normal(
            record, "DlqReplayed",
            f"moved {last['moved']} DLQ entries back to the input (requested {last['requested']})",
        )  # fmt: skip
