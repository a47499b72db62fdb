"""The tools on a stage of 4 partitions, against a real Valkey: the stage's keys claimed as the operator claims
them (a lane each), records written to their lanes as a producer writes them, and each tool finding them there:
the queue figures summed over the lanes, `phoenix status` (and `--partitions`), `phoenix inspect`, the DLQ
commands."""

from __future__ import annotations

import json
import time

import pytest
import redis.asyncio as aioredis

from phoenix.keys import LegacyStageKeys, StageKeys, partition_of
from phoenix.tools.queue_stats import collect
from phoenix.worker_runtime.ownership import claim
from tests.fixtures.cli import phoenix, run_phoenix
from tests.fixtures.replies import add_entry, recent_entries, stream_entries

PARTITIONS = 4
STAGE = StageKeys.for_stage("p", "team-p", partitions=PARTITIONS)
NS = ("--namespace", "team-p", "--service", "p")


def _spread(count: int) -> list[str]:
    """`count` record ids, in at least three different lanes."""
    ids = [f"rec-{i}" for i in range(count)]
    assert len({partition_of(r, PARTITIONS) for r in ids}) >= 3
    return ids


async def _enqueue(redis: aioredis.Redis, record_id: str) -> str:
    lane = STAGE.lane_of(record_id)
    return await add_entry(redis, lane.input, {"record_id": record_id, "user_id": "u1", "data": "{}"})


async def _dead_letter(redis: aioredis.Redis, record_id: str, entry_id: str = "*") -> str:
    fields = {"record_id": record_id, "user_id": "u1", "data": "{}", "error": "bad", "error_type": "ValueError"}
    return await add_entry(redis, STAGE.lane_of(record_id).dlq, fields, id=entry_id)


async def _stage_with_work(redis: aioredis.Redis) -> list[str]:
    """8 records in their lanes, 2 of them delivered (pending), and 3 dead letters in their lanes."""
    await claim(redis, STAGE, "uid-p", adopt=True)
    ids = _spread(8)
    for record_id in ids:
        await _enqueue(redis, record_id)
    # One delivery in each of two lanes: pending there.
    delivered_lanes = sorted({p for r in ids if (p := partition_of(r, PARTITIONS)) is not None})[:2]
    for p in delivered_lanes:
        lane = STAGE.lanes[p]
        await redis.xreadgroup(lane.consumer_group, "c1", {lane.input: ">"}, count=1)
    for record_id in ("dead-1", "dead-2", "dead-3"):
        await _dead_letter(redis, record_id)
    return ids


async def test_queue_figures_are_summed_over_the_lanes(redis: aioredis.Redis) -> None:
    await _stage_with_work(redis)
    (stats,) = await collect(redis, [STAGE])
    assert (stats.length, stats.pending, stats.lag, stats.dlq_length) == (8, 2, 6, 3)
    assert stats.group_exists and stats.consumers == 1
    assert stats.oldest_pending_seconds is not None and stats.oldest_undelivered_seconds is not None


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_status_shows_the_stage_summed_and_each_partition_on_request(
    redis: aioredis.Redis, redis_url: str
) -> None:
    ids = await _stage_with_work(redis)
    lines = phoenix(redis_url, "status", "--namespace", "team-p").splitlines()
    assert lines[0].split() == ["NAMESPACE", "STAGE", "LENGTH", "PENDING", "LAG", "OLDEST(s)", "DLQ", "CONSUMERS"]
    assert len(lines) == 2  # one stage, not one row per lane
    row = lines[1].split()
    assert row[:5] == ["team-p", "p", "8", "2", "6"] and row[6:] == ["3", "1"]
    [summed] = json.loads(phoenix(redis_url, "status", *NS, "--json"))
    assert (summed["partitions"], summed["length"], summed["dlqLength"]) == (PARTITIONS, 8, 3)
    rows = json.loads(phoenix(redis_url, "status", *NS, "--json", "--partitions"))
    assert [row.get("partition") for row in rows] == [None, 0, 1, 2, 3]
    per_lane = [sum(partition_of(r, PARTITIONS) == p for r in ids) for p in range(PARTITIONS)]
    assert [row["length"] for row in rows[1:]] == per_lane
    assert sum(row["dlqLength"] for row in rows[1:]) == 3
    table = phoenix(redis_url, "status", *NS, "--partitions").splitlines()
    assert table[0].split()[:3] == ["NAMESPACE", "STAGE", "PARTITION"]
    assert [line.split()[2] for line in table[1:]] == ["(4)", "#0", "#1", "#2", "#3"]
    assert [int(line.split()[3]) for line in table[2:]] == per_lane


@pytest.mark.timeout(120)
@pytest.mark.subprocess
async def test_dlq_commands_work_across_the_lanes_and_replay_to_each_records_lane(
    redis: aioredis.Redis, redis_url: str
) -> None:
    await claim(redis, STAGE, "uid-p", adopt=True)
    dead = _spread(6)
    # A millisecond apart: entries of different lanes added in one millisecond have no order between them. From the
    # next millisecond on: claim's marker entry (added, then deleted) left each DLQ's last id at this one or before.
    first_ms = int(time.time() * 1000) + 1
    for i, record_id in enumerate(dead):
        await _dead_letter(redis, record_id, f"{first_ms + i}-0")
    listed = [json.loads(line) for line in phoenix(redis_url, "dlq", "list", *NS, "--count", "4").splitlines()]
    assert [entry["record_id"] for entry in listed] == dead[:4]  # the oldest four over every lane
    assert [entry["partition"] for entry in listed] == [partition_of(r, PARTITIONS) for r in dead[:4]]
    refused = run_phoenix(redis_url, "dlq", "list", *NS, "--dlq", STAGE.lanes[0].dlq)
    assert refused.returncode == 1 and "has 4 partitions, each with its own DLQ and input" in refused.stderr
    # Export everything, one more dead letter arrives, purge exactly what was exported.
    exported = run_phoenix(redis_url, "dlq", "export", *NS)
    assert sorted(json.loads(line)["record_id"] for line in exported.stdout.splitlines()) == sorted(dead)
    through = exported.stderr.split("--through ")[1].strip()
    late = "late-one"
    await _dead_letter(redis, late)
    assert phoenix(redis_url, "dlq", "purge", *NS, "--through", through, "--yes").startswith("deleted 6 entries")
    assert [json.loads(line)["record_id"] for line in phoenix(redis_url, "dlq", "list", *NS).splitlines()] == [late]
    # Replay: each dead letter back to the input of its own lane, where that lane's workers read it.
    for record_id in dead:
        await _dead_letter(redis, record_id)
    dry = phoenix(redis_url, "dlq", "replay", *NS, "--dry-run")
    assert dry.splitlines()[-1].startswith("would move 7 of the 7 entries of the DLQs of its 4 partitions")
    assert phoenix(redis_url, "dlq", "replay", *NS, "--yes").strip() == (
        "moved 7 entries back to the inputs of its 4 partitions"
    )
    for record_id in [*dead, late]:
        lane = STAGE.lane_of(record_id)
        assert record_id in [f["record_id"] for _, f in await stream_entries(redis, lane.input)], record_id
    assert sum([await redis.xlen(lane.dlq) for lane in STAGE.lanes]) == 0
    assert sum([await redis.xlen(lane.input) for lane in STAGE.lanes]) == 7
    [repair, purge] = [fields for _, fields in await recent_entries(redis, STAGE.audit, 2)]
    assert (repair["action"], purge["action"]) == ("dlq-replay", "dlq-purge")


@pytest.mark.timeout(210)
@pytest.mark.subprocess
async def test_inspect_and_the_repairs_find_each_record_in_its_lane(redis: aioredis.Redis, redis_url: str) -> None:
    """A worker died holding two records of two lanes: inspect sees each in its lane, unlock releases the lock
    there, reclaim re-enqueues both in their own lanes, reprocess puts a committed record back in its lane."""
    await claim(redis, STAGE, "uid-p", adopt=True)
    ids = _spread(8)
    held = [ids[0], next(r for r in ids if partition_of(r, PARTITIONS) != partition_of(ids[0], PARTITIONS))]
    for record_id in ids:
        await _enqueue(redis, record_id)
    for record_id in held:  # delivered to a consumer that died holding the record's lock
        lane = STAGE.lane_of(record_id)
        await redis.xreadgroup(lane.consumer_group, "dead-1", {lane.input: ">"}, count=1)
        await redis.set(lane.record(record_id), "lock dead-1:0123456789ab")
    report = json.loads(phoenix(redis_url, "inspect", *NS, held[1], "--json"))
    lane = STAGE.lane_of(held[1])
    assert report["input_stream"] == lane.input
    assert [e["state"] for e in report["entries"]] == ["pending"]
    assert report["lock"]["key"] == lane.record(held[1]) and report["lock"]["holder"] == "dead-1"
    text = phoenix(redis_url, "inspect", *NS, held[1])
    assert f"({lane.input}, group p-group)" in text.splitlines()[0]

    # unlock: the lock in the record's lane, its holder found in that lane's group (idle, alive: forced).
    first = STAGE.lane_of(held[0])
    assert phoenix(redis_url, "unlock", *NS, held[0], "--force", "--yes").startswith(
        f"released {first.record(held[0])} held by"
    )
    assert await redis.get(first.record(held[0])) is None
    # reclaim: both pending entries, each re-enqueued in its own lane (the other's lock released with it).
    reclaimed = phoenix(redis_url, "reclaim", *NS, "--claim-idle-ms", "1", "--yes").splitlines()
    assert reclaimed[-1] == "reclaimed 2 of 2 entries idle over 1 ms in the inputs of its 4 partitions"
    for record_id in held:
        lane = STAGE.lane_of(record_id)
        assert await redis.xpending(lane.input, lane.consumer_group) == {
            "pending": 0,
            "min": None,
            "max": None,
            "consumers": [],
        }
        assert [f["record_id"] for _, f in await stream_entries(redis, lane.input)].count(record_id) == 2
    assert await redis.get(lane.record(held[1])) is None
    # reprocess: a committed record's marker cleared and a copy added to its lane's input.
    done = ids[2]
    lane = STAGE.lane_of(done)
    await redis.set(lane.record(done), "done 1-0")
    out = phoenix(redis_url, "reprocess", *NS, done, "--yes").strip()
    assert out.startswith(f"deleted {lane.record(done)}; enqueued {done} as ") and f" in {lane.input} " in out
    assert [f["record_id"] for _, f in await stream_entries(redis, lane.input)].count(done) == 2
    assert await redis.exists(lane.record(done)) == 0


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_migrate_refuses_to_move_v1_data_into_a_partitioned_stage(redis: aioredis.Redis, redis_url: str) -> None:
    old = LegacyStageKeys("p")
    await redis.xgroup_create(old.input, "p-group", id="0", mkstream=True)
    await redis.xadd(old.input, {"record_id": "v1-record", "user_id": "u1", "data": "{}"})
    await claim(redis, STAGE, "uid-p", adopt=True)
    done = run_phoenix(redis_url, "migrate", *NS, "--yes")
    assert done.returncode == 1 and done.stderr.splitlines() == [
        "refused: stage p of namespace team-p is laid out in 4 partitions; phoenix migrate moves v1 data to a stage "
        "of one partition only: migrate it before setting spec.partitions (nothing changed)"
    ]
    assert await redis.xlen(old.input) == 1
