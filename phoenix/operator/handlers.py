"""kopf wiring: which event calls which flow. The operator's logic lives in the modules imported here."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import kopf

from phoenix.crds import GROUP, PLURAL, VERSION
from phoenix.operator import flows
from phoenix.operator.context import OperatorContext
from phoenix.operator.kopf_settings import configure
from phoenix.operator.metrics import observed_reconcile
from phoenix.operator.readiness import waits_for_keda
from phoenix.operator.refresh import refresh_forever
from phoenix.operator.requests import has_replay_work, has_restart_request

STAGES = (GROUP, VERSION, PLURAL)
# How often a pending restart or replay request is (re)tried while it is pending; idle stages run no timer.
REQUEST_INTERVAL_SECONDS = 2.0
# How often a stage running without KEDA looks again whether KEDA has been installed meanwhile.
KEDA_RECHECK_SECONDS = 30.0


def _context(memo: kopf.Memo) -> OperatorContext:
    return memo["context"]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    memo["refresh_task"] = asyncio.create_task(refresh_forever(_context(memo)), name="phoenix-status-refresh")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    task: asyncio.Task[None] = memo["refresh_task"]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    context = _context(memo)
    await context.pool.close()
    await context.kube.aclose()


@kopf.on.probe(id="statusRefresh")
def status_refresh(memo: kopf.Memo, **_: Any) -> dict[str, dict[str, Any]]:
    return _context(memo).refresh_reports


@kopf.on.resume(*STAGES)
@kopf.on.create(*STAGES)
@kopf.on.update(*STAGES, field="spec")
async def reconcile(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    with observed_reconcile():
        await flows.reconcile_stage(_context(memo), body, retry)


@kopf.on.delete(*STAGES, retries=flows.DELETE_RETRIES)
async def delete(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    await flows.delete_stage(_context(memo), body, retry)


@kopf.timer(*STAGES, interval=REQUEST_INTERVAL_SECONDS, when=has_restart_request)
async def restart(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    await flows.restart_workers(_context(memo), body, retry)


@kopf.timer(*STAGES, interval=REQUEST_INTERVAL_SECONDS, when=has_replay_work)
async def replay_dlq(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    await flows.replay_dlq(_context(memo), body, retry)


@kopf.timer(*STAGES, interval=KEDA_RECHECK_SECONDS, when=waits_for_keda)
async def adopt_keda(body: kopf.Body, retry: int, memo: kopf.Memo, **_: Any) -> None:
    with observed_reconcile():
        await flows.reconcile_stage(_context(memo), body, retry)
