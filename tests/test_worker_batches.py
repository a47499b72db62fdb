"""Batch processors: one process_batch call per read, and still one outcome, lock and marker per record."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.fixtures.eventually import wait_until
from tests.fixtures.records import committed, locked_records
from tests.fixtures.replies import stream_entries
from tests.fixtures.sample_stage import DLQ, OUT, add, idle, outputs
from tests.fixtures.workers import ROOT, WorkerPool

BATCH = "tests.processors:ScriptedBatchProcessor"


async def test_a_failing_record_fails_alone_inside_its_batch(redis: aioredis.Redis, workers: WorkerPool) -> None:
    entries = {
        r: await add(redis, r, action=a) for r, a in [("b1", ""), ("b2", "fail-once"), ("b3", "missing"), ("b4", "")]
    }
    w = workers.start("s", processor=BATCH, OUTPUT_QUEUE=OUT, CONCURRENCY="10")
    await wait_until(lambda: committed(redis, "s", "b2"), "b2 committed after its retry")
    await wait_until(lambda: idle(redis), "queue drained")

    # The four records were read together and handed over in one call.
    assert int((await redis.lrange("batches:s", 0, 0))[0]) == 4
    # b1 and b4 committed with their batch; b2 failed alone, was retried and committed; b3 went to the DLQ.
    assert sorted(o["record_id"] for o in await outputs(redis)) == ["b1", "b2", "b4"]
    for record in ("b1", "b4"):
        assert await committed(redis, "s", f"{record}") == entries[record]
    assert await redis.hgetall("effects:s") == {"b1": "1", "b2": "1", "b4": "1"}
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["record_id"] == "b3" and dead["error_type"] == "RecordNotFoundError"
    assert dead["error"] == "record b3 does not exist" and dead["original_id"] == entries["b3"]
    assert not await committed(redis, "s", "b3")
    assert await locked_records(redis, "s") == []
    retried = [e for e in w.events() if e["event"] == "processing_failed_will_retry"]
    assert [(e["record_id"], e["error"]) for e in retried] == [("b2", "transient failure of b2")]
    done = {e["record_id"] for e in w.events() if e["event"] == "processing_complete"}
    assert done == {"b1", "b2", "b4"}


@pytest.mark.timeout(60)
async def test_a_failing_batch_call_retries_each_of_its_records(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await redis.set("batch-down:s", 1)
    for record in ("c1", "c2", "c3"):
        await add(redis, record)
    w = workers.start("s", processor=BATCH, OUTPUT_QUEUE=OUT, CONCURRENCY="10", CIRCUIT_FAILURE_THRESHOLD="1000")
    await wait_until(lambda: w.logged("processing_failed_will_retry"), "the batch failed")
    assert await redis.xlen(OUT) == 0 and await redis.xlen(DLQ) == 0
    await redis.delete("batch-down:s")
    await wait_until(lambda: idle(redis), "queue drained", timeout=30)
    assert sorted(o["record_id"] for o in await outputs(redis)) == ["c1", "c2", "c3"]
    assert all(json.loads(o["data"])["seen_by"] == "s" for o in await outputs(redis))
    failed = {e["record_id"] for e in w.events() if e["event"] == "processing_failed_will_retry"}
    assert failed == {"c1", "c2", "c3"}
    assert await redis.hgetall("effects:s") == {"c1": "1", "c2": "1", "c3": "1"}


async def test_the_documented_example(redis: aioredis.Redis, workers: WorkerPool, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "batch-processors.md").read_text()
    match = re.search(
        r"<!-- docs-test: batch-example file=(?P<file>\S+) -->\n```python\n(?P<code>.*?)```", text, re.DOTALL
    )
    assert match, "docs/batch-processors.md has no example block"
    (tmp_path / match["file"]).write_text(match["code"])
    await add(redis, "d1", text="one two three")
    await add(redis, "d2")
    await add(redis, "d3", text="four five")
    workers.start(
        "s",
        processor="bulk_wordcount:BulkWordCountProcessor",
        OUTPUT_QUEUE=OUT,
        CONCURRENCY="8",
        PYTHONPATH=f"{ROOT}:{tmp_path}",
    )
    await wait_until(lambda: idle(redis), "queue drained")
    assert (await redis.get("words:d1"), await redis.get("words:d3")) == ("3", "2")
    assert {o["record_id"]: json.loads(o["data"]) for o in await outputs(redis)} == {
        "d1": {"words": 3},
        "d3": {"words": 2},
    }
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["record_id"], dead["error"]) == ("d2", "record d2 has no text")
