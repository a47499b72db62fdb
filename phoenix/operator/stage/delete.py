"""Delete one PhoenixStage with deletionPolicy Delete: its Redis data goes before the object does (its children
go by garbage collection, their owner references name it). Run by the kopf handler handlers.stage_deleted, which
only such a stage gets (with kopf's finalizer); a stage with Retain leaves its data and goes at once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf
from redis.exceptions import RedisError

from phoenix.crds import ConditionType
from phoenix.keys import StageKeys
from phoenix.operator.builders import resolve_streams
from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError, retry_delay
from phoenix.operator.record import StageRecord
from phoenix.operator.redis.ops import Destroyed, NotHeld, destroy
from phoenix.operator.stage.reconcile import redis_of, retain_clients, stage_model
from phoenix.operator.status.conditions import new_condition
from phoenix.worker_runtime.ownership import release_names

# The source of deletion Warnings, de-duplicated on its own (events.EventRecorder.warning).
DELETE = "delete"
_KEEP_DATA_HINT = "set spec.deletionPolicy to Retain to keep the data and let the stage go"


async def delete_stage(ctx: OperatorContext, body: Mapping[str, Any], retry: int) -> None:
    """deletionPolicy Delete: remove the Redis data before the object goes; children go by garbage collection.

    Tried until it succeeds (a stage left with its data silently behind is worse than one that waits): status
    and one Warning per cause say why it waits and how to let it go without its data."""
    record = ctx.registry.observe(body)
    try:
        streams, destroyed = await _delete_redis_data(ctx, record, body)
    except StageError as error:
        delay = retry_delay(retry)
        told = StageError(
            error.reason,
            f"deletionPolicy is Delete and the Redis data cannot be deleted yet: {error.message} ({_KEEP_DATA_HINT})",
        )
        record.error = new_condition(
            ConditionType.READY, False, error.reason, f"{told.message}; attempt {retry + 1}, next in {delay:g} s"
        )
        await ctx.writer.update(record)
        await ctx.events.warning(record, DELETE, told)
        raise kopf.TemporaryError(str(error), delay=delay) from None
    if isinstance(destroyed, NotHeld):
        holder = f"held by {destroyed.holder}" if destroyed.holder else "claimed by no stage (no ownership marker)"
        message = f"deleted none of the Redis keys of {streams.input}: they are {holder}, not this PhoenixStage's"
        await ctx.events.warning(record, DELETE, StageError("RedisDataNotOwned", message))
    else:
        what = [f"consumer group {destroyed.group}"] if destroyed.group else []
        what += [f"stream {stream}" for stream in destroyed.streams]
        kept = f"; kept {', '.join(destroyed.kept)}, which others read or write" if destroyed.kept else ""
        await ctx.events.normal(
            record,
            "RedisDataDeleted",
            f"deleted {', '.join(what) or 'no stream'} and the stage's own keys ({destroyed.keys} keys in all){kept}",
        )
    ctx.registry.forget(record.key)
    await retain_clients(ctx)


async def _delete_redis_data(
    ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]
) -> tuple[StageKeys, Destroyed | NotHeld]:
    stage = stage_model(body)
    # The Secret may already be gone (a namespace being deleted): the URL of the last reconcile still works.
    redis = record.redis
    if redis is None:
        target = await redis_of(ctx.kube, stage)
        redis = (None if ctx.users is None else await ctx.users.operator_spec(target)) or target
    streams = resolve_streams(stage.metadata.name, stage.namespace, stage.spec)
    client = ctx.pool.client(redis)
    try:
        destroyed = await destroy(client, streams, body["metadata"]["uid"], ctx.cluster)
        # The stage goes either way: the names it claimed are free for its namespace's other stages, or anyone.
        freed = await release_names(client, streams, streams.claimed_streams, ctx.cluster)
        if ctx.users is not None:
            await ctx.users.forget_names(stage.namespace, freed)
    except (RedisError, OSError) as exc:
        ctx.pool.failed(redis, exc)
        raise StageError("RedisUnavailable", f"cannot reach Redis: {redis.masked(str(exc))}") from None
    return streams, destroyed
