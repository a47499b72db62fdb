"""phoenix_pipeline_latency_seconds: observed at the final stage's commit, once per record, from entered_at; its
bucket counts written into the stage's latency windows in Redis, where the operator's queue figures read them."""

from __future__ import annotations

import time

import aiohttp
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from phoenix.keys import LATENCY_WINDOW_SECONDS, StageKeys
from phoenix.producer import Producer, Record
from phoenix.tools.latency import Buckets, quantile
from phoenix.tools.queue_stats import collect
from phoenix.worker_runtime.latency import KEEP_SECONDS
from tests.fixtures.eventually import wait_until
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.records import committed
from tests.fixtures.workers import WorkerPool

LATENCY = "phoenix_pipeline_latency_seconds"
A, B = StageKeys.for_stage("a"), StageKeys.for_stage("b")


async def _metrics(http: aiohttp.ClientSession, port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _latency(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], suffix: str, **labels: str) -> float:
    wanted = {"stage": "b", "pipeline": "docs", **labels}
    return samples[(LATENCY + suffix, frozenset(wanted.items()))]


async def test_the_final_stage_observes_each_record_once_from_its_entry_into_the_pipeline(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    port_a, port_b = free_loopback_port(), free_loopback_port()
    workers.start("a", OUTPUT_QUEUE=B.input, PIPELINE="docs", HEALTH_PORT=str(port_a))
    workers.start("b", PIPELINE="docs", HEALTH_PORT=str(port_b))  # no output: the end of the path
    sent = time.time()
    ages = {"young": 100.0, "old": 1000.0, "retried": 4000.0}  # seconds in the pipeline before this test sent them
    await Producer(redis, "a").send_many(
        [
            Record("young", {}, entered_at=sent - ages["young"]),
            Record("old", {}, entered_at=sent - ages["old"]),
            # Fails its first attempt at each stage: retried, then committed once.
            Record("retried", {"action": "fail-once"}, entered_at=sent - ages["retried"]),
        ]
    )
    # Straight into b: a dead letter at the final stage is no completion.
    await Producer(redis, "b").send_many([Record("lost", {"action": "missing"}, entered_at=sent - 50)])
    for record_id in ages:
        await wait_until(lambda record_id=record_id: committed(redis, "b", record_id), f"{record_id} at b", 30)
    await wait_until(lambda: redis.xlen(B.dlq), "the dead letter at b", 30)
    # A duplicate of a committed record at the final stage: skipped, not observed again.
    await Producer(redis, "b").send_many([Record("young", {}, entered_at=sent - ages["young"])])

    async with aiohttp.ClientSession() as http:

        async def duplicate_skipped() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
            samples = await _metrics(http, port_b)
            skipped = ("phoenix_messages_total", frozenset({"stage": "b", "outcome": "skipped_duplicate"}.items()))
            return samples if samples.get(skipped) == 1 else None

        samples = await wait_until(duplicate_skipped, "the duplicate skipped at b", 30)
        checked = time.time()
        upstream = await _metrics(http, port_a)

    assert _latency(samples, "_count") == 3
    # Each latency lies between its age when sent and its age when the figures were read.
    total = _latency(samples, "_sum")
    assert sum(ages.values()) <= total <= sum(ages.values()) + 3 * (checked - sent)
    assert checked - sent < 60, "the buckets below assume the records took less than a minute"
    cumulative = {le: _latency(samples, "_bucket", le=le) for le in ("60.0", "120.0", "1200.0", "7200.0", "+Inf")}
    assert cumulative == {"60.0": 0, "120.0": 1, "1200.0": 2, "7200.0": 3, "+Inf": 3}
    # Stage a forwards its results: no end of a path there, nothing observed.
    assert not [name for name, _ in upstream if name.startswith(LATENCY)]


async def test_the_final_stage_writes_its_latencies_into_windows_that_the_queue_figures_read(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    workers.start("a", OUTPUT_QUEUE=B.input, PIPELINE="docs")
    workers.start("b", PIPELINE="docs")
    sent = time.time()
    ages = [100.0, 1000.0, 1000.0, 4000.0]  # seconds in the pipeline before this test sent them
    await Producer(redis, "a").send_many([Record(f"r{i}", {}, entered_at=sent - age) for i, age in enumerate(ages)])

    # Within the flush interval (5 s), into the window of the moment: the buckets' counts, not one write a record.
    async def figures() -> Buckets | None:
        [stats] = await collect(redis, [B])
        return stats.latency if sum(stats.latency.values()) == len(ages) else None

    latency = await wait_until(figures, "the final stage's latencies in its windows", 30)
    assert latency == {"120.0": 1, "1200.0": 2, "7200.0": 1}
    windows = [key async for key in redis.scan_iter(match="phoenix:{default}:*:latency:*")]
    assert windows and all(key.startswith("phoenix:{default}:b:latency:") for key in windows)  # b's only: a forwards
    for key in windows:
        start = int(key.rsplit(":", 1)[1])
        assert start % LATENCY_WINDOW_SECONDS == 0 and sent - LATENCY_WINDOW_SECONDS < start <= time.time()
        assert 0 < await redis.ttl(key) <= KEEP_SECONDS
    # The median is in (600, 1200], the 99th percentile in (3600, 7200]: interpolated within the bucket.
    assert 600 < (quantile(latency, 0.5) or 0) <= 1200
    assert 3600 < (quantile(latency, 0.99) or 0) <= 7200
    [upstream] = await collect(redis, [A])
    assert upstream.latency == {}
