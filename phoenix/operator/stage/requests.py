"""One-off actions people ask of a stage by annotation, each carried out once: a rolling restart and a DLQ replay.

`phoenix.io/restart: <any new value>` rolls the workers; `phoenix.io/replay-dlq: <N|all>` moves DLQ entries
back to the input. Bookkeeping lives in status fields beside the schema's own (status keeps unknown fields):
`handledRestart` is the restart value already acted on; `replayRequest` is a replay being carried out.
The converger (stage/converge.py) runs them: restart_workers and replay_dlq at the end of this module. A replay is a
repair: it goes into the stage's audit stream (tools/audit.py) and its Event says so.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import RedisError

from phoenix.errors import PhoenixError
from phoenix.kube_names import (
    HANDLED_RESTART_ANNOTATION,
    REPLAY_ANNOTATION,
    RESTART_ANNOTATION,
    RESTARTED_AT_ANNOTATION,
)
from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.record import StageRecord
from phoenix.operator.redis.ops import replay_lanes
from phoenix.operator.redis.pool import RedisPool
from phoenix.operator.status.writer import StatusWriter
from phoenix.tools import audit

logger = logging.getLogger(__name__)

# Sources of Warnings, each de-duplicated on its own (events.EventRecorder.warning).
RESTART, REPLAY = "restart", "replay"
HANDLED_RESTART_FIELD = "handledRestart"
REPLAY_REQUEST_FIELD = "replayRequest"
MAX_REPLAY_COUNT = 10_000_000


class ReplayRequestError(PhoenixError, ValueError):
    """The replay annotation's value is neither `all` nor a positive whole number."""


def parse_replay_count(value: str) -> int | None:
    """`all` -> None (no limit); `N` -> N."""
    text = value.strip().lower()
    if text == "all":
        return None
    if not text.isdigit() or not 0 < int(text) <= MAX_REPLAY_COUNT:
        raise ReplayRequestError(
            f"{REPLAY_ANNOTATION} must be `all` or a whole number from 1 to {MAX_REPLAY_COUNT}, got {value!r}"
        )
    return int(text)


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("annotations") or {}


def _status(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("status") or {}


def restart_request(body: Mapping[str, Any]) -> str | None:
    """The restart value still to be acted on, if any."""
    value = _annotations(body).get(RESTART_ANNOTATION)
    if value is None or value == _status(body).get(HANDLED_RESTART_FIELD):
        return None
    return value


def replay_annotation(body: Mapping[str, Any]) -> str | None:
    return _annotations(body).get(REPLAY_ANNOTATION)


def pending_replay(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A replay recorded in status as begun and not yet finished."""
    return _status(body).get(REPLAY_REQUEST_FIELD) or None


def has_restart_request(body: Mapping[str, Any], **_: Any) -> bool:
    return restart_request(body) is not None


def has_replay_work(body: Mapping[str, Any], **_: Any) -> bool:
    return replay_annotation(body) is not None or pending_replay(body) is not None


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


async def restart(kube: KubeApi, writer: StatusWriter, record: StageRecord, body: Mapping[str, Any]) -> str | None:
    """Roll the workers for a new `phoenix.io/restart` value; returns the restart time if it rolled them now.

    The value acted on is written onto the Deployment in the same patch that changes the pod template, so a
    crash before status is updated cannot restart twice: the next attempt finds the value there and only
    records it in status (handledRestart, lastRestart).
    """
    value = restart_request(body)
    if value is None:
        return None
    async with record.deployment_lock:
        deployment = await kube.get_deployment(record.namespace, record.name)
        if deployment is None:
            raise StageError("DeploymentMissing", "the Deployment to restart does not exist yet")
        handled = (deployment["metadata"].get("annotations") or {}).get(HANDLED_RESTART_ANNOTATION)
        restarted_now = handled != value
        if restarted_now:
            at = _now()
            await kube.patch_deployment(
                record.namespace,
                record.name,
                {
                    "metadata": {"annotations": {HANDLED_RESTART_ANNOTATION: value}},
                    "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: at}}}},
                },
            )
        else:
            template = deployment["spec"]["template"]["metadata"].get("annotations") or {}
            at = template.get(RESTARTED_AT_ANNOTATION, _now())
    await writer.update(record, {"lastRestart": at, HANDLED_RESTART_FIELD: value})
    return at if restarted_now else None


async def replay(
    kube: KubeApi, pool: RedisPool, writer: StatusWriter, record: StageRecord, body: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Carry out a `phoenix.io/replay-dlq` request exactly once; returns status.lastReplay when one finished.

    1. The request gets an id, recorded in status.replayRequest before anything moves, and only if the server
       still has the annotation (so a stale copy of an already removed annotation is no new request).
    2. The move runs under that id in Redis (redis_ops.replay_lanes): a repeated attempt continues, never redoes.
    3. The annotation is removed if it still holds the request's value (a different, newer value stays and is
       carried out next).
    4. status.lastReplay is written and status.replayRequest cleared.
    A crash after step 1 resumes with the same id; after step 3 no annotation is left, but status.replayRequest
    still is, which is what brings the operator back to finish step 4 (the move itself reports it is done).
    """
    # Status as this operator last wrote it: `body` may lag behind our own writes.
    pending = pending_replay({"status": record.status})
    requested = replay_annotation(body)
    if pending is None:
        if requested is None:
            return None
        try:
            parse_replay_count(requested)  # a bad value fails before anything is recorded
        except ReplayRequestError as exc:
            await kube.remove_stage_annotation(record.namespace, record.name, REPLAY_ANNOTATION, requested)
            raise StageError("InvalidReplayRequest", str(exc), permanent=True) from None
        pending = {"id": uuid.uuid4().hex, "count": requested}
        if not await writer.claim(record, REPLAY_REQUEST_FIELD, pending, REPLAY_ANNOTATION, requested):
            return None  # the annotation was already handled and removed: `body` was stale
    if record.streams is None or record.redis is None:
        raise StageError("NotReconciled", "the stage has not been reconciled yet; the replay waits for it")
    limit = parse_replay_count(pending["count"])
    moved = await replay_lanes(pool.client(record.redis), record.streams, pending["id"], limit)
    if requested is not None and requested == pending["count"]:
        await kube.remove_stage_annotation(record.namespace, record.name, REPLAY_ANNOTATION, requested)
    last = {"requested": moved if limit is None else limit, "moved": moved, "at": _now()}
    await writer.update(record, {"lastReplay": last, REPLAY_REQUEST_FIELD: None})
    return last


async def restart_workers(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> None:
    async with ctx.events.reporting(record, RESTART):
        restarted_at = await restart(ctx.kube, ctx.writer, record, body)
    if restarted_at is not None:
        await ctx.events.normal(record, "Restarted", f"rolling restart of the workers at {restarted_at}")


async def replay_dlq(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> None:
    async with ctx.events.reporting(record, REPLAY):
        try:
            last = await replay(ctx.kube, ctx.pool, ctx.writer, record, body)
        except (RedisError, OSError) as exc:
            error = record.redis.masked(str(exc)) if record.redis else str(exc)
            raise StageError("RedisUnavailable", f"DLQ replay: {error}") from None
    if last is None:
        return
    detail = f"moved {last['moved']} DLQ entries back to the input (requested {last['requested']})"
    actor, told = audit.operator_actor(), ""
    if record.streams is not None and record.redis is not None:  # always, once a replay has run
        repair = audit.Repair(actor, "dlq-replay", last["moved"], f"{detail}, asked by {REPLAY_ANNOTATION}")
        try:
            await audit.record(ctx.pool.client(record.redis), record.streams.audit, repair)
            told = f", recorded in {record.streams.audit}"
        except (RedisError, OSError) as exc:
            # The entries have moved: a missing audit line must not make the operator move them again.
            logger.warning("could not audit the DLQ replay of %s/%s: %s", record.namespace, record.name, exc)
    await ctx.events.normal(record, "DlqReplayed", f"{detail} by {actor}{told}")
