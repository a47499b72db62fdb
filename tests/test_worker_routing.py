"""Routing: a stage of named outputs (OUTPUTS) whose processor chooses among them per record (processor.Routed).

The in-process tests run the real Worker on the real Valkey through each way a routed record can end; the chaos
test runs real `phoenix worker` processes, SIGKILLed throughout, and counts each record at the end of its path."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys, input_stream, partition_of
from phoenix.record_format import ROUTE_FIELD
from phoenix.worker_runtime import lanes
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import run_burst, running_worker
from tests.fixtures.replies import get_text, hash_of, stream_entries
from tests.fixtures.workers import WorkerPool, WorkerProcess
from tests.processors import RoutingProcessor

KINDS = ("lab", "imaging", "both", "none", "unknown", "plain")
# Where each kind's record must arrive, by output name: exactly once each.
EXPECTED = {"lab": {"parser"}, "imaging": {"imaging"}, "both": {"parser", "imaging"}}
NEXT = {"parser": "lab", "imaging": "img"}  # output name -> the next stage it names


def outputs(partitions: int = 1) -> dict[str, dict[str, Any]]:
    return {name: {"queue": input_stream(stage), "partitions": partitions} for name, stage in NEXT.items()}


def kind_of(i: int) -> str:
    return KINDS[i % len(KINDS)]


async def feed(client: aioredis.Redis, count: int, **extra: Any) -> None:
    async with client.pipeline(transaction=False) as pipe:
        for i in range(count):
            data = {"i": i, "kind": kind_of(i), **extra}
            pipe.xadd(input_stream("rt"), {"record_id": f"r{i}", "user_id": "u", "data": json.dumps(data)})
        await pipe.execute()


async def arrived(client: aioredis.Redis, stage: str, partitions: int = 1) -> list[dict[str, str]]:
    keys = StageKeys.for_stage(stage, partitions=partitions)
    return [fields for lane in keys.lanes for _, fields in await stream_entries(client, lane.input)]


async def test_each_record_goes_where_its_processor_routes_it(redis: aioredis.Redis, redis_url: str) -> None:
    await feed(redis, 12)
    await run_burst(redis_url, service="rt", processor=RoutingProcessor, outputs=outputs())
    for name, stage in NEXT.items():
        entries = await arrived(redis, stage)
        ids = sorted(e["record_id"] for e in entries)
        want = sorted(f"r{i}" for i in range(12) if name in EXPECTED.get(kind_of(i), ()))
        assert ids == want, name
        # Each output gets its own result, and the entry is a plain forward (no route field, the trace and the
        # deadline absent), with the record's entry time carried on.
        assert all(json.loads(e["data"])["to"] == name and ROUTE_FIELD not in e for e in entries)
        assert set(entries[0]) == {"record_id", "user_id", "data", "entered_at"}
    rt = StageKeys.for_stage("rt")
    dead = [fields for _, fields in await stream_entries(redis, rt.dlq)]
    by_id = {d["record_id"]: d for d in dead}
    assert sorted(by_id) == sorted(f"r{i}" for i in range(12) if kind_of(i) in ("unknown", "plain"))
    unknown = by_id["r4"]
    assert unknown["error_type"] == "UnknownOutput"
    assert "'billing'" in unknown["error"] and "parser, imaging" in unknown["error"]
    assert by_id["r5"]["error_type"] == "UnroutedResult" and "Routed" in by_id["r5"]["error"]
    # A record routed to an unknown output forwards nothing, not even to the outputs it named rightly.
    assert "r4" not in {e["record_id"] for e in await arrived(redis, "lab")}
    # Sent nowhere: committed (its marker set, its entry acknowledged), in no stream and not dead-lettered.
    assert (await get_text(redis, rt.record("r3")) or "").startswith("done ")
    assert (await redis.xpending(rt.input, rt.consumer_group))["pending"] == 0


async def test_a_redelivered_routed_record_is_forwarded_once(redis: aioredis.Redis, redis_url: str) -> None:
    """The same record id entered twice (a producer's retry): its commit is found by its marker, no output gets
    it twice."""
    await feed(redis, 3)
    await feed(redis, 3)
    await run_burst(redis_url, service="rt", processor=RoutingProcessor, outputs=outputs())
    assert sorted(e["record_id"] for e in await arrived(redis, "lab")) == ["r0", "r2"]
    assert sorted(e["record_id"] for e in await arrived(redis, "img")) == ["r1", "r2"]


async def test_forwards_to_stages_of_other_partitions_go_through_the_outbox(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """Outputs of 2 partitions from a stage of 1: each forward's stream depends on the record, so it is relayed,
    named in the outbox entry, and written to its output's partition without the name."""
    settings = WorkerSettings(service_name="rt", processor="x:Y", outputs=outputs(2))
    (route,) = lanes.routes(settings.keys, 1, slots_matter=False, named=settings.outputs)
    assert route.relayed and all(f.relayed and f.stream == route.keys.outbox for f in route.named)
    await feed(redis, 12)
    worker = await run_burst(redis_url, service="rt", processor=RoutingProcessor, outputs=outputs(2))
    await wait_until(lambda: _empty(redis, worker.settings.keys.outbox), "the outbox relayed", 30)
    for name, stage in NEXT.items():
        entries = await arrived(redis, stage, partitions=2)
        assert sorted(e["record_id"] for e in entries) == sorted(
            f"r{i}" for i in range(12) if name in EXPECTED.get(kind_of(i), ())
        )
        assert all(ROUTE_FIELD not in e and json.loads(e["data"])["to"] == name for e in entries)
        keys = StageKeys.for_stage(stage, partitions=2)
        for lane in keys.lanes:  # each record in its own partition
            for _, e in await stream_entries(redis, lane.input):
                assert lane.partition == partition_of(e["record_id"], 2)


async def _empty(redis: aioredis.Redis, stream: str) -> bool:
    return await redis.xlen(stream) == 0


@pytest.mark.parametrize("partitions", [1, 2])
async def test_on_a_cluster_routed_records_reach_outputs_in_their_own_and_in_other_slots(
    cluster: aioredis.Redis, cluster_url: str, partitions: int
) -> None:
    """The single-node cluster refuses CROSSSLOT as a cluster does: outputs of one partition share the router's
    slot (written in its settle script), outputs of two are in slots of their own (relayed through the outbox).
    Either way each record arrives once where its processor sent it, and the DLQ holds the two it could not."""
    await feed(cluster, 24)
    worker = await run_burst(
        cluster_url, service="rt", processor=RoutingProcessor, outputs=outputs(partitions), redis_mode="cluster"
    )
    await wait_until(lambda: _empty(cluster, worker.settings.keys.outbox), "the outbox relayed", 30)
    for name, stage in NEXT.items():
        ids = sorted(e["record_id"] for e in await arrived(cluster, stage, partitions=partitions))
        assert ids == sorted(f"r{i}" for i in range(24) if name in EXPECTED.get(kind_of(i), ())), name
    dead = [fields["record_id"] for _, fields in await stream_entries(cluster, StageKeys.for_stage("rt").dlq)]
    assert sorted(dead) == sorted(f"r{i}" for i in range(24) if kind_of(i) in ("unknown", "plain"))


def test_settings_refuse_outputs_that_name_no_stage_or_clash() -> None:
    with pytest.raises(ValueError, match="OUTPUTS\\[parser\\]: 'orders' is no stage's default input"):
        WorkerSettings(service_name="rt", processor="x:Y", outputs={"parser": {"queue": "orders"}})
    with pytest.raises(ValueError, match="OUTPUT_QUEUE \\(one output\\) or OUTPUTS"):
        WorkerSettings(service_name="rt", processor="x:Y", output_queue="o", outputs=outputs())
    with pytest.raises(ValueError, match="feed itself"):
        WorkerSettings(service_name="rt", processor="x:Y", outputs={"self": {"queue": input_stream("rt")}})
    with pytest.raises(ValueError, match="pattern"):
        WorkerSettings(service_name="rt", processor="x:Y", outputs={"Bad_Name": {"queue": input_stream("lab")}})


# -- real workers, SIGKILLed ---------------------------------------------------------------------------------------

RECORDS = 1200
FINAL = {"lab": "phoenix:final-lab", "img": "phoenix:final-img"}


def _env(stage: str, partitions: int) -> dict[str, str]:
    common = {"CONCURRENCY": "4", "MAX_DELIVERIES": "30"}
    if stage == "rt":
        return {"OUTPUTS": json.dumps(outputs(partitions)), **common}
    return {"OUTPUT_QUEUE": FINAL[stage], "PARTITIONS": str(partitions), **common}


async def _drained(redis: aioredis.Redis, partitions: int) -> bool:
    want = {
        stage: sum(1 for i in range(RECORDS) if name in EXPECTED.get(kind_of(i), ())) for name, stage in NEXT.items()
    }
    for stage, count in want.items():
        if await redis.xlen(FINAL[stage]) < count:
            return False
    for stage, parts in (("rt", 1), ("lab", partitions), ("img", partitions)):
        keys = StageKeys.for_stage(stage, partitions=parts)
        for lane in keys.lanes:
            if await redis.exists(lane.input) and (await redis.xpending(lane.input, keys.consumer_group))["pending"]:
                return False
            if await redis.zcard(lane.retry) or await redis.xlen(lane.outbox):
                return False
    return True


@pytest.mark.timeout(240)
@pytest.mark.parametrize("partitions", [1, 2], ids=["atomic-hop", "relayed-hop"])
async def test_routed_records_arrive_exactly_once_despite_sigkills(
    redis: aioredis.Redis, workers: WorkerPool, partitions: int
) -> None:
    """A router sending lab pages to `parser` and imaging pages to `imaging` (and some to both, some nowhere,
    some to an output it lacks), three workers a stage, a random one SIGKILLed and replaced every quarter second.
    With next stages of one partition each forward is written by the router's commit itself; with two, through
    the outbox and the relay."""
    rng = random.Random(33)
    stages = ("rt", "lab", "img")
    live: dict[str, list[WorkerProcess]] = {
        stage: [
            workers.start(stage, processor="tests.processors:RoutingProcessor", **_env(stage, partitions))
            if stage == "rt"
            else workers.start(stage, **_env(stage, partitions))
            for _ in range(3)
        ]
        for stage in stages
    }
    killed: set[int] = set()

    async def enqueue() -> None:
        for start in range(0, RECORDS, 50):
            async with redis.pipeline(transaction=False) as pipe:
                for i in range(start, start + 50):
                    data = {"i": i, "kind": kind_of(i), "sleep": 0.01, "action": "sleep:0.01"}
                    pipe.xadd(input_stream("rt"), {"record_id": f"r{i}", "user_id": "u", "data": json.dumps(data)})
                await pipe.execute()
            await asyncio.sleep(0.1)

    producer = asyncio.create_task(enqueue())
    kills = 0
    while kills < 24 and not await _drained(redis, partitions):
        await asyncio.sleep(0.25)
        stage = rng.choice(stages)
        victim = live[stage].pop(rng.randrange(3))
        victim.kill()
        killed.add(victim.pid)
        kills += 1
        processor = "tests.processors:RoutingProcessor" if stage == "rt" else "tests.processors:ScriptedProcessor"
        live[stage].append(workers.start(stage, processor=processor, **_env(stage, partitions)))
    await producer
    await wait_until(lambda: _drained(redis, partitions), "every stage drained", timeout=180)

    for name, stage in NEXT.items():
        final = [fields for _, fields in await stream_entries(redis, FINAL[stage])]
        ids = sorted(f["record_id"] for f in final)
        assert ids == sorted(f"r{i}" for i in range(RECORDS) if name in EXPECTED.get(kind_of(i), ())), stage
        assert all(json.loads(f["data"])["to"] == name for f in final)
    dead = [fields for _, fields in await stream_entries(redis, StageKeys.for_stage("rt").dlq)]
    assert sorted(d["record_id"] for d in dead) == sorted(
        f"r{i}" for i in range(RECORDS) if kind_of(i) in ("unknown", "plain")
    )
    effects = await hash_of(redis, "effects:rt")
    assert len(effects) == RECORDS
    for record, count in effects.items():
        if int(count) > 1:  # a repeated call only where a worker died mid-process
            pids = {int(p) for p in await redis.smembers(f"pids:rt:{record}")}
            assert len(pids & killed) >= int(count) - 1, (record, count, pids, killed)
    assert kills >= 8


async def test_a_forward_that_fails_takes_back_the_ones_written_before_it(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """`imaging`'s stream is a string key (WRONGTYPE): a record routed to both outputs has its `parser` forward
    deleted again and its marker taken back, so it is forwarded nowhere and stays pending for a later attempt."""
    await redis.set(input_stream("img"), "not a stream")
    await feed(redis, 3)  # r2 is routed to both
    async with running_worker(redis_url, service="rt", processor=RoutingProcessor, outputs=outputs()):
        await wait_until(
            lambda: _called(redis, "r2", 2), "r2 left pending after its failed commit, and processed again", 30
        )
    assert "r2" not in {e["record_id"] for e in await arrived(redis, "lab")}
    assert [e["record_id"] for e in await arrived(redis, "lab")] == ["r0"]  # the rest of the batch committed
    assert not (await get_text(redis, StageKeys.for_stage("rt").record("r2")) or "").startswith("done ")


async def _called(redis: aioredis.Redis, record: str, times: int) -> bool:
    return int((await hash_of(redis, "effects:rt")).get(record, 0)) >= times
