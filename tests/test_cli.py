"""`phoenix enqueue`, `phoenix dlq list|replay` and `phoenix status` as a person runs them."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from tests.fixtures.cli import phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.replies import stream_entries
from tests.fixtures.sample_stage import DLQ, IN, OUT, add, idle
from tests.fixtures.workers import WorkerPool


@pytest.mark.subprocess
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
    [(entry_id, fields)] = await stream_entries(redis, IN)
    assert entry_id == entry
    assert fields == {
        "record_id": "r1",
        "user_id": "u1",
        "data": json.dumps({"pages": 3, "document_url": "file:///tmp/a.pdf"}),
        "entered_at": fields["entered_at"],  # when it was written: the server's clock, the same host's
    }
    assert abs(int(entry_id.partition("-")[0]) - int(fields["entered_at"])) < 5000


@pytest.mark.timeout(60)
async def test_dlq_list_and_replay(redis: aioredis.Redis, redis_url: str, workers: WorkerPool) -> None:
    for i in range(3):
        await add(redis, f"gone{i}", action="missing")
    w = workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: _dlq_length(redis, 3), "three dead letters")
    await wait_until(lambda: idle(redis), "drained")
    w.stop()
    originals = [f["original_id"] for _, f in await stream_entries(redis, DLQ)]

    listed = [json.loads(line) for line in phoenix(redis_url, "dlq", "list", "--service", "s").splitlines()]
    assert [e["record_id"] for e in listed] == ["gone0", "gone1", "gone2"]
    assert {e["error_type"] for e in listed} == {"RecordNotFoundError"}

    assert phoenix(redis_url, "dlq", "replay", "--service", "s", "--count", "2", "--yes").strip() == (
        "moved 2 entries back to phoenix:{default}:s:input"
    )
    assert await redis.xlen(DLQ) == 1
    replayed = [f for _, f in await stream_entries(redis, IN)][-2:]
    assert [f["record_id"] for f in replayed] == ["gone0", "gone1"]
    for fields, original in zip(replayed, originals, strict=False):
        assert fields["retry_count"] == "0" and fields["original_id"] == original
        assert not {"error", "error_type", "stage", "attempts", "failed_at"} & fields.keys()
    assert phoenix(redis_url, "dlq", "replay", "--service", "s", "--yes").strip() == (
        "moved 1 entries back to phoenix:{default}:s:input"
    )
    assert await redis.xlen(DLQ) == 0


@pytest.mark.subprocess
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


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_status_shows_every_namespace_or_the_one_given(redis: aioredis.Redis, redis_url: str) -> None:
    """Two tenants' stages of one name on one database: a row each, told apart by NAMESPACE; --namespace picks one."""
    for namespace, waiting in (("team-a", 2), ("team-b", 1)):
        keys = StageKeys.for_stage("shared", namespace)
        await redis.xgroup_create(keys.input, keys.consumer_group, id="0", mkstream=True)
        for i in range(waiting):
            await redis.xadd(keys.input, {"record_id": f"{namespace}-{i}"})
    await redis.xgroup_create(StageKeys.for_stage("solo", "team-b").input, "solo-group", id="0", mkstream=True)

    def rows(*args: str) -> list[list[str]]:
        lines = phoenix(redis_url, "status", *args).splitlines()
        assert lines[0].split()[:3] == ["NAMESPACE", "STAGE", "LENGTH"]
        return [line.split()[:3] for line in lines[1:]]

    assert rows() == [["team-a", "shared", "2"], ["team-b", "shared", "1"], ["team-b", "solo", "0"]]
    assert rows("--namespace", "team-b") == [["team-b", "shared", "1"], ["team-b", "solo", "0"]]
    assert rows("--namespace", "team-a", "--service", "shared") == [["team-a", "shared", "2"]]
    assert [(r["namespace"], r["stage"]) for r in json.loads(phoenix(redis_url, "status", "--json"))] == [
        ("team-a", "shared"),
        ("team-b", "shared"),
        ("team-b", "solo"),
    ]
    assert "default: every namespace" in " ".join(phoenix(redis_url, "status", "--help").split())


@pytest.mark.subprocess
async def test_commands_default_to_key_namespace(
    redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell set up for a hand-run worker's tenant (KEY_NAMESPACE) reaches that tenant's keys; --namespace wins."""
    monkeypatch.setenv("KEY_NAMESPACE", "team-a")
    phoenix(redis_url, "enqueue", "--service", "s", "--record-id", "r1")
    phoenix(redis_url, "enqueue", "--service", "s", "--record-id", "r2", "--namespace", "team-b")
    for namespace, record in (("team-a", "r1"), ("team-b", "r2")):
        [(_, fields)] = await stream_entries(redis, StageKeys.for_stage("s", namespace).input)
        assert fields["record_id"] == record
    assert not await redis.exists(IN)


async def _dlq_length(redis: aioredis.Redis, n: int) -> bool:
    return await redis.xlen(DLQ) == n
