"""The background loop of the pipelines: every pipeline reconciled when it or one of its stages changed (the watch
sets the registry's wake), and every refresh interval anyway (its status follows its stages', its pause moves on)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    if PIPELINE_LABEL in (body.get("metadata", {}).get("labels") or {}):
        ctx.pipelines.wake.set()


async def pipelines_forever(ctx: OperatorContext) -> None:
    wake = ctx.pipelines.wake
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), ctx.refresh_interval)
        await asyncio.sleep(SETTLE_SECONDS)
        wake.clear()
        for record in ctx.pipelines.records():
            try:
                await reconcile_pipeline(ctx, record)
            except Exception:  # one pipeline's unforeseen failure must not stop the others' loop
                logger.exception("pipeline %s/%s: reconcile failed", record.namespace, record.name)
