"""kopf wiring: which event calls which function, each handler named after the event it handles. A stage's
reconcile and the drift its watch events show live in stage/reconcile.py, its deletion in stage/delete.py, its
restart and replay in stage/requests.py (run by stage/converge.py), its status refresh in stage/refresh.py; a
pipeline's stages, status and requests in pipeline/ (run by pipeline/loop.py)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import kopf

from phoenix.crds import GROUP, PLURAL, VERSION, DeletionPolicy
from phoenix.crds.pipeline import PIPELINE_PLURAL
from phoenix.kube_names import MANAGED_BY, MANAGED_BY_LABEL
from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import KEDA_GROUP, KEDA_VERSION
from phoenix.operator.kube.kopf_settings import configure, quiet_handlers
from phoenix.operator.metrics import observed_reconcile
from phoenix.operator.pipeline.loop import pipelines_forever, stage_of_pipeline_seen
from phoenix.operator.stage.converge import converge_forever
from phoenix.operator.stage.delete import delete_stage
from phoenix.operator.stage.reconcile import child_changed, kopf_retry, next_stage_seen, reconcile_stage
from phoenix.operator.stage.refresh import refresh_forever
from phoenix.operator.stage.secret_check import check_secrets_forever

STAGES = (GROUP, VERSION, PLURAL)
PIPELINES = (GROUP, VERSION, PIPELINE_PLURAL)
# The children the operator creates carry this label; only their events can be drift.
MANAGED = {MANAGED_BY_LABEL: MANAGED_BY}
DEPLOYMENTS = ("apps", "v1", "deployments")
SCALED_OBJECTS = (KEDA_GROUP, KEDA_VERSION, "scaledobjects")
TRIGGER_AUTHENTICATIONS = (KEDA_GROUP, KEDA_VERSION, "triggerauthentications")
DISRUPTION_BUDGETS = ("policy", "v1", "poddisruptionbudgets")
_BACKGROUND = ("refresh_task", "converge_task", "secret_check_task", "pipelines_task", "acl_sync_task")


def _context(memo: kopf.Memo) -> OperatorContext:
    return memo["context"]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    children = [(group, plural) for group, _, plural in (DEPLOYMENTS, SCALED_OBJECTS, TRIGGER_AUTHENTICATIONS)]
    configure(settings, children, ",".join(f"{key}={value}" for key, value in MANAGED.items()))
    # kopf's decorators return the function itself but type it as the WatchingFn protocol, which has no __name__.
    quiet_handlers((stage_seen.__name__, child_seen.__name__, pipeline_seen.__name__))  # type: ignore[attr-defined]
    context = _context(memo)
    memo["refresh_task"] = asyncio.create_task(refresh_forever(context), name="phoenix-status-refresh")
    memo["converge_task"] = asyncio.create_task(converge_forever(context), name="phoenix-converger")
    memo["secret_check_task"] = asyncio.create_task(check_secrets_forever(context), name="phoenix-secret-check")
    memo["pipelines_task"] = asyncio.create_task(pipelines_forever(context), name="phoenix-pipelines")
    if context.users is not None:
        sync = context.users.sync_forever(context.registry)
        memo["acl_sync_task"] = asyncio.create_task(sync, name="phoenix-redis-acl-users")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for name in _BACKGROUND:
        task: asyncio.Task[None] | None = memo.get(name)  # acl_sync_task: with Redis ACL users only
        if task is None:
            continue
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    context = _context(memo)
    await context.pool.close()
    if context.users is not None:
        await context.users.aclose()
    await context.kube.aclose()


@kopf.on.probe(id="statusRefresh")
def status_refresh(memo: kopf.Memo, **_: Any) -> dict[str, dict[str, Any]]:
    return _context(memo).refresh_reports


# The ids are the handlers' names of old: kopf keeps a handler's progress (its retry count) in phoenix.io/<id>
# annotations on the object, which an operator upgraded mid-retry must find again.
@kopf.on.resume(*STAGES, id="reconcile")
@kopf.on.create(*STAGES, id="reconcile")
@kopf.on.update(*STAGES, field="spec", id="reconcile")
async def stage_changed(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    """Created, its spec changed, or found at the operator's start: reconciled; kopf retries a failure."""
    context = _context(memo)
    with observed_reconcile():
        try:
            await reconcile_stage(context, context.registry.observe(body), body)
        except StageError as error:
            raise kopf_retry(error, retry) from None


# Only a Delete stage has work to do before it goes, so only such a stage gets kopf's finalizer (a filtered
# deletion handler adds it only to the objects it matches, and removes it when the policy becomes Retain).
# retries=None: tried with backoff until the data is deleted.
@kopf.on.delete(*STAGES, field="spec.deletionPolicy", value=DeletionPolicy.DELETE.value, retries=None, id="delete")
async def stage_deleted(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    await delete_stage(_context(memo), body, retry)


# The event handlers are async (kopf would run sync ones in threads): the registry and the converger's state are
# only ever touched from the event loop.
@kopf.on.event(*STAGES)
async def stage_seen(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Keep the latest object for the converger's work (restart, replay, drift repair); forget a deleted one."""
    registry = _context(memo).registry
    if type == "DELETED":
        registry.forget((body["metadata"]["namespace"], body["metadata"]["name"]))
    else:
        registry.observe(body)
        next_stage_seen(_context(memo), body)
    stage_of_pipeline_seen(_context(memo), body)


@kopf.on.event(*PIPELINES)
async def pipeline_seen(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Keep the latest pipeline for the pipeline loop, which makes and keeps its stages; forget a deleted one (the
    garbage collector deletes its stages)."""
    pipelines = _context(memo).pipelines
    if type == "DELETED":
        pipelines.forget((body["metadata"]["namespace"], body["metadata"]["name"]))
    else:
        pipelines.observe(body)


@kopf.on.event(*DEPLOYMENTS, labels=MANAGED)
@kopf.on.event(*SCALED_OBJECTS, labels=MANAGED)
@kopf.on.event(*TRIGGER_AUTHENTICATIONS, labels=MANAGED)
@kopf.on.event(*DISRUPTION_BUDGETS, labels=MANAGED)
async def child_seen(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    child_changed(_context(memo), type, body)
