"""The background loop of the pipelines: a pipeline reconciled when it or one of its stages changed (the watch
touches it in the registry), and every pipeline every refresh interval anyway (its status follows its stages', its
pause moves on)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from phoenix.kube_names import PIPELINE_LABEL
from phoenix.operator.context import OperatorContext
from phoenix.operator.pipeline.reconcile import reconcile_pipeline

logger = logging.getLogger(__name__)

# After a wake, the changes arriving together (a pipeline's stages each written at once) are taken in one pass.
SETTLE_SECONDS = 0.2


def stage_of_pipeline_seen(ctx: OperatorContext, body: Mapping[str, Any]) -> None:
    """A PhoenixStage's watch event: when a pipeline made it, that pipeline is looked at again (a hand edit put
    back, a deleted stage made again, the status summed anew)."""
    meta = body.get("metadata", {})
    pipeline = (meta.get("labels") or {}).get(PIPELINE_LABEL)
    if pipeline is not None:
        ctx.pipelines.touch((meta["namespace"], pipeline))


async def pipelines_forever(ctx: OperatorContext) -> None:
    pipelines = ctx.pipelines
    due = time.monotonic() + ctx.refresh_interval
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pipelines.wake.wait(), max(0.0, due - time.monotonic()))
        await asyncio.sleep(SETTLE_SECONDS)
        pipelines.wake.clear()
        everyone = time.monotonic() >= due
        if everyone:
            due = time.monotonic() + ctx.refresh_interval
        changed, pipelines.changed = pipelines.changed, set()
        for record in pipelines.records():
            if not everyone and record.key not in changed:
                continue
            try:
                await reconcile_pipeline(ctx, record)
            except Exception:  # one pipeline's unforeseen failure must not stop the others' loop
                logger.exception("pipeline %s/%s: reconcile failed", record.namespace, record.name)
