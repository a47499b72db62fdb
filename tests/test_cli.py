"""`phoenix enqueue`, `phoenix dlq list|replay` and `phoenix status` as a person runs them."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from tests.fixtures.cli import phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.stage_s import DLQ, IN, OUT, add, idle
from tests.fixtures.workers import WorkerPool


async def test_enqueue_writes_the_message_format(redis: aioredis.Redis, redis_url: str) -> None:
    entry = phoenix(
        redis_url,
        "enqueue",
        "--service",
        "s",
        "--record-id",
        "r1",
        "--user-id",
        "u1",
        "--data",
        '{"pages": 3}',
        "--field",
        "document_url=file:///tmp/a.pdf",
    ).strip()
    [(entry_id, fields)] = await redis.xrange(IN)
    assert entry_id == entry
    assert fields == {
        "record_id": "r1",
        "user_id": "u1",
        "data": json.dumps({"pages": 3, "document_url": "file:///tmp/a.pdf"}),
    }


async def test_dlq_list_and_replay(redis: aioredis.Redis, redis_url: str, workers: WorkerPool) -> None:
    for i in range(3):
        await add(redis, f"gone{i}", action="missing")
    w = workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: _dlq_length(redis, 3), "three dead letters")
    await wait_until(lambda: idle(redis), "drained")
    w.stop()
    originals = [f["original_id"] for _, f in await redis.xrange(DLQ)]

    listed = [json.loads(line) for line in phoenix(redis_url, "dlq", "list", "--service", "s").splitlines()]
    assert [e["record_id"] for e in listed] == ["gone0", "gone1", "gone2"]
    assert {e["error_type"] for e in listed} == {"RecordNotFoundError"}

    assert phoenix(redis_url, "dlq", "replay", "--service", "s", "--count", "2", "--yes").strip() == (
        "moved 2 entries back to phoenix:{default}:s:input"
    )
    assert await redis.xlen(DLQ) == 1
    replayed = [f for _, f in await redis.xrange(IN)][-2:]
    assert [f["record_id"] for f in replayed] == ["gone0", "gone1"]
    for fields, original in zip(replayed, originals, strict=False):
        assert fields["retry_count"] == "0" and fields["original_id"] == original
        assert not {"error", "error_type", "stage", "attempts", "failed_at"} & fields.keys()
    assert phoenix(redis_url, "dlq", "replay", "--service", "s", "--yes").strip() == (
        "moved 1 entries back to phoenix:{default}:s:input"
    )
    assert await redis.xlen(DLQ) == 0


async def test_status_table(redis: aioredis.Redis, redis_url: str) -> None:
    await redis.xgroup_create(IN, "s-group", id="0", mkstream=True)
    for i in range(4):
        await add(redis, f"r{i}")
    await redis.xreadgroup("s-group", "c1", {IN: ">"}, count=1)
    await redis.xadd(DLQ, {"record_id": "x"})
    lines = phoenix(redis_url, "status").splitlines()
    assert lines[0].split() == ["NAMESPACE", "STAGE", "LENGTH", "PENDING", "LAG", "OLDEST(s)", "DLQ", "CONSUMERS"]
    row = lines[1].split()
    assert row[:2] == ["default", "s"] and row[2:5] == ["4", "1", "3"] and row[6:] == ["1", "1"]
    assert float(row[5]) >= 0


async def _dlq_length(redis: aioredis.Redis, n: int) -> bool:
    return await redis.xlen(DLQ) == n
