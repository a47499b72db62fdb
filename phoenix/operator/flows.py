"""What each kopf handler does: run the operation, write status, post Events, turn failures into retries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from redis.exceptions import RedisError

from phoenix.crds import ConditionType, DeletionPolicy
from phoenix.operator import annotations
from phoenix.operator.builders import new_condition, resolve_streams
from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError, scrub
from phoenix.operator.reconcile import failed_status, parse_stage, reconcile, reconciled_status, redis_url_of
from phoenix.operator.redis_ops import destroy
from phoenix.operator.registry import StageRecord

MAX_BACKOFF_SECONDS = 120.0
DELETE_RETRIES = 6


def backoff(retry: int) -> float:
    """5 s, 10 s, 20 s, ... up to two minutes."""
    return min(5.0 * 2 ** min(retry, 10), MAX_BACKOFF_SECONDS)


def _api_error(exc: ApiException) -> StageError:
    return StageError("KubernetesApiError", f"{exc.status} {exc.reason}: {exc.body!s:.500}")


def _retry(body: Mapping[str, Any], error: StageError, retry: int) -> kopf.TemporaryError | kopf.PermanentError:
    kopf.warn(body, reason=error.reason, message=error.message)
    if error.permanent:
        return kopf.PermanentError(str(error))
    return kopf.TemporaryError(str(error), delay=backoff(retry))


async def reconcile_stage(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> None:
    record = ctx.registry.observe(body)
    generation = record.generation
    try:
        try:
            result = await reconcile(ctx.kube, ctx.pool, record, body)
        except ApiException as exc:
            raise _api_error(exc) from None
    except StageError as error:
        record.error = new_condition(ConditionType.READY, False, error.reason, error.message)
        await ctx.writer.update(record, *failed_status(error, generation))
        raise _retry(body, error, retry) from None
    record.error = None
    await ctx.writer.update(record, *reconciled_status(result, generation))


async def delete_stage(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> None:
    """deletionPolicy Delete: remove the Redis data before the object goes; children go by garbage collection."""
    record = ctx.registry.observe(body)
    try:
        if body.get("spec", {}).get("deletionPolicy") == DeletionPolicy.DELETE:
            await _delete_redis_data(ctx, record, body)
    except StageError as error:
        if retry + 1 >= DELETE_RETRIES:
            # kopf releases the object after the last attempt; forget it with it.
            ctx.registry.forget(record.key)
        raise _retry(body, error, retry) from None
    ctx.registry.forget(record.key)
    await ctx.pool.retain({r.redis_url for r in ctx.registry.records() if r.redis_url is not None})


async def _delete_redis_data(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> None:
    stage = parse_stage(body)
    # The Secret may already be gone (a namespace being deleted): the URL of the last reconcile still works.
    url = record.redis_url or await redis_url_of(ctx.kube, stage)
    streams = resolve_streams(stage.metadata.name, stage.spec)
    try:
        await destroy(ctx.pool.client(url), stage.metadata.name, streams)
    except (RedisError, OSError) as exc:
        raise StageError("RedisUnavailable", f"cannot delete the stage's Redis data: {scrub(str(exc), url)}") from None
    kopf.info(
        body, reason="RedisDataDeleted",
        message=f"deleted consumer group {streams.consumer_group}, streams {streams.input} and {streams.dlq}",
    )  # fmt: skip


async def restart_workers(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> None:
    record = ctx.registry.observe(body)
    try:
        try:
            restarted_at = await annotations.restart(ctx.kube, ctx.writer, record, body)
        except ApiException as exc:
            raise _api_error(exc) from None
    except StageError as error:
        raise _retry(body, error, retry) from None
    if restarted_at is not None:
        kopf.info(body, reason="Restarted", message=f"rolling restart of the workers at {restarted_at}")


async def replay_dlq(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> None:
    record = ctx.registry.observe(body)
    try:
        try:
            last = await annotations.replay(ctx.kube, ctx.pool, ctx.writer, record, body)
        except ApiException as exc:
            raise _api_error(exc) from None
        except (RedisError, OSError) as exc:
            raise StageError("RedisUnavailable", f"DLQ replay: {scrub(str(exc), record.redis_url)}") from None
    except StageError as error:
        raise _retry(body, error, retry) from None
    if last is not None:
        kopf.info(
            body, reason="DlqReplayed",
            message=f"moved {last['moved']} DLQ entries back to the input (requested {last['requested']})",
        )  # fmt: skip
