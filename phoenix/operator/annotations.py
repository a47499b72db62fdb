"""One-off actions asked for by annotation: a rolling restart and a DLQ replay, each carried out once."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from phoenix.operator.builders import RESTARTED_AT_ANNOTATION
from phoenix.operator.errors import StageError
from phoenix.operator.kube import KubeApi
from phoenix.operator.redis_ops import replay_ledger, replay_once
from phoenix.operator.redis_pool import RedisPool
from phoenix.operator.registry import StageRecord
from phoenix.operator.requests import (
    HANDLED_RESTART_ANNOTATION,
    HANDLED_RESTART_FIELD,
    REPLAY_ANNOTATION,
    REPLAY_REQUEST_FIELD,
    ReplayRequestError,
    parse_replay_count,
    pending_replay,
    replay_annotation,
    restart_request,
)
from phoenix.operator.status import StatusWriter


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
            await kube.patch_deployment(record.namespace, record.name, {
                "metadata": {"annotations": {HANDLED_RESTART_ANNOTATION: value}},
                "spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: at}}}},
            })  # fmt: skip
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
    2. The move runs under that id in Redis (redis_ops.replay_once): a repeated attempt continues, never redoes.
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
    if record.streams is None or record.redis_url is None:
        raise StageError("NotReconciled", "the stage has not been reconciled yet; the replay waits for it")
    limit = parse_replay_count(pending["count"])
    moved = await replay_once(
        pool.client(record.redis_url), replay_ledger(record.name, pending["id"]), record.streams.dlq,
        record.streams.input, limit,
    )  # fmt: skip
    if requested is not None and requested == pending["count"]:
        await kube.remove_stage_annotation(record.namespace, record.name, REPLAY_ANNOTATION, requested)
    last = {"requested": moved if limit is None else limit, "moved": moved, "at": _now()}
    await writer.update(record, {"lastReplay": last, REPLAY_REQUEST_FIELD: None})
    return last
