"""Trace context travels from stage to stage in the `traceparent` field."""

from __future__ import annotations

import redis.asyncio as aioredis

from tests.fixtures.eventually import wait_until
from tests.fixtures.records import committed
from tests.fixtures.stage_s import IN, OUT, outputs
from tests.fixtures.workers import WorkerPool

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_traceparent_is_carried_to_the_next_stage(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await redis.xadd(IN, {"record_id": "t1", "data": "{}", "traceparent": TRACEPARENT})
    await redis.xadd(IN, {"record_id": "t2", "data": "{}"})
    workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: committed(redis, "s", "t2"), "both processed")
    by_id = {o["record_id"]: o for o in await outputs(redis)}
    # With the OpenTelemetry API and no SDK the context passes through unchanged (same trace, same parent).
    assert by_id["t1"]["traceparent"] == TRACEPARENT
    assert "traceparent" not in by_id["t2"]
