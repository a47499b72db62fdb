"""The producer API (phoenix/producer.py) and `phoenix enqueue --from`: records land where the stage's workers read
them, in their partition, with the replica check, on one Redis and on a cluster node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
import redis as redis_sync
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from phoenix.keys import StageKeys
from phoenix.producer import BATCH, NotReplicated, Producer, Record, SyncProducer, _pipelines, _Target
from phoenix.worker_runtime.ownership import claim
from tests.fixtures.cli import run_phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.replies import stream_entries, stream_entries_now
from tests.fixtures.valkey_cluster import single_node_cluster

STAGE = StageKeys.for_stage("parser", "team", partitions=4)


async def _records_by_stream(client: aioredis.Redis | AsyncRedisCluster, streams: list[str]) -> dict[str, list[str]]:
    return {s: [f["record_id"] for _, f in await stream_entries(client, s)] for s in streams}


async def _set_layout(client: aioredis.Redis | AsyncRedisCluster, partitions: int) -> None:
    await client.hset(STAGE.layout, "partitions", partitions)


async def test_a_stage_without_layout_is_one_partition_and_ids_come_back_in_order(redis: aioredis.Redis) -> None:
    producer = Producer(redis, "parser", "team")
    ids = await producer.send_many(Record(f"r{i}", {"i": i}, "u1") for i in range(BATCH + 5))
    entries = await stream_entries(redis, STAGE.input)  # the one partition's names: phoenix:{team}:parser:input
    assert STAGE.input == "phoenix:{team}:parser:input"
    assert [entry_id for entry_id, _ in entries] == ids
    fields = entries[7][1]
    assert fields == {"record_id": "r7", "user_id": "u1", "data": '{"i": 7}', "entered_at": fields["entered_at"]}
    # entered_at: when the producer wrote it, which the entry id's clock (the server's, the same host) follows.
    assert abs(int(entries[7][0].partition("-")[0]) - int(fields["entered_at"])) < 5000
    assert await producer.send("one", {"x": 1}) == (await stream_entries(redis, STAGE.input, "-", "+"))[-1][0]


async def test_records_go_to_their_partition_as_the_layout_says(redis: aioredis.Redis) -> None:
    producer = Producer(redis, "parser", "team")
    await producer.send("before", {})  # no layout yet: the one-partition stream
    await _set_layout(redis, 4)  # the operator creates the stage: the producer looks again, then keeps it
    ids = await producer.send_many(
        Record(f"r{i}", traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01") for i in range(50)
    )
    lanes = [lane.input for lane in STAGE.lanes]
    by_stream = await _records_by_stream(redis, lanes)
    assert sum(map(len, by_stream.values())) == 50 and all(by_stream.values())  # spread over all four
    for stream, record_ids in by_stream.items():
        assert {STAGE.lane_of(r).input for r in record_ids} == {stream}
    for i, entry_id in enumerate(ids):  # each id is its record's entry, in its lane (ids repeat across streams)
        [(_, fields)] = await stream_entries(redis, STAGE.lane_of(f"r{i}").input, entry_id, entry_id)
        assert fields["record_id"] == f"r{i}"
    assert (await stream_entries(redis, lanes[0], count=1))[0][1]["traceparent"].startswith("00-111")
    assert [f["record_id"] for _, f in await stream_entries(redis, STAGE.input)] == ["before"]


async def test_a_stage_whose_phoenixstage_names_its_input_gets_its_records_there(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """spec.input: the stage's workers read that stream, and its owner marker (claimed with its keys) says so; the
    producer and `phoenix enqueue --service` write there, not to the default name no worker of it reads."""
    named = StageKeys.for_stage("billing", "team", input="orders:incoming")
    await claim(redis, named, "billing-uid", adopt=True)
    await Producer(redis, "billing", "team").send_many([Record("o1"), Record("o2")])
    run_phoenix(redis_url, "enqueue", "--namespace", "team", "--service", "billing", "--record-id", "o3")
    with redis_sync.Redis.from_url(redis_url, decode_responses=True) as client:
        SyncProducer(client, "billing", "team").send("o4")
    assert [f["record_id"] for _, f in await stream_entries(redis, "orders:incoming")] == ["o1", "o2", "o3", "o4"]
    assert await redis.exists(StageKeys.for_stage("billing", "team").input) == 0


async def test_an_explicit_stream_and_an_explicit_count_need_no_layout(redis: aioredis.Redis) -> None:
    await Producer(redis, stream="jobs").send_many([Record("a"), Record("b")])
    assert [f["record_id"] for _, f in await stream_entries(redis, "jobs")] == ["a", "b"]
    await Producer(redis, "parser", "team", partitions=4).send("c")
    assert await redis.xlen(STAGE.lane_of("c").input) == 1
    with pytest.raises(ValueError, match="a stage or a stream"):
        Producer(redis, "parser", stream="jobs")
    with pytest.raises(ValueError, match="needs a record_id"):
        await Producer(redis, stream="jobs").send("")


# The batch as pipelines and the ids from their replies: what both producers share, decided without Redis.

_TWO_NODES = (ClusterNode("127.0.0.1", 7000), ClusterNode("127.0.0.1", 7001))


def _node_of(key: str) -> ClusterNode:
    """A two-primary cluster's slot map: the lower half of the slots on the first node."""
    return _TWO_NODES[key_slot(key.encode()) >= 8192]


def test_a_batch_is_one_pipeline_of_xadds_grouped_by_stream_with_each_records_position() -> None:
    batch = [Record(f"r{i}", {"i": i}, entered_at=1_700_000_000.5) for i in range(12)]
    (pipeline,) = _pipelines(_Target("parser", "team", None, 4).grouped(batch), None)
    streams = [command[1] for command in pipeline.commands]
    assert sorted(streams) == sorted(STAGE.lane_of(f"r{i}").input for i in range(12))
    assert streams == sorted(streams, key=streams.index)  # each stream's XADDs together
    assert pipeline.key == streams[0]
    for position, command in zip(pipeline.positions, pipeline.commands, strict=True):
        assert command == ("XADD", STAGE.lane_of(f"r{position}").input, "*", *_flat(batch[position].fields()))
    assert sorted(pipeline.positions) == list(range(12))


def _flat(fields: dict[str, str]) -> list[str]:
    return [part for item in fields.items() for part in item]


def test_a_producer_that_waits_on_a_cluster_writes_a_pipeline_per_node() -> None:
    batch = [Record(f"r{i}") for i in range(40)]
    pipelines = _pipelines(_Target("parser", "team", None, 4).grouped(batch), _node_of)
    assert {_node_of(p.key).name for p in pipelines} == {node.name for node in _TWO_NODES}  # both hold lanes
    for pipeline in pipelines:  # every XADD on the node of the pipeline's key, where its WAIT runs
        assert {_node_of(command[1]).name for command in pipeline.commands} == {_node_of(pipeline.key).name}
    assert sorted(p for pipeline in pipelines for p in pipeline.positions) == list(range(40))


def test_entry_ids_come_back_in_the_records_order_and_too_few_replicas_raise() -> None:
    batch = [Record(f"r{i}") for i in range(6)]
    pipelines = _pipelines(_Target("parser", "team", None, 4).grouped(batch), _node_of)
    replies = [[f"{position}-0".encode() for position in p.positions] for p in pipelines]
    client = redis.Redis()  # never connected: the ids and the check need no server
    waiting = SyncProducer(client, "parser", "team", min_replicas_ack=1, min_replicas_timeout_ms=50)
    runs = [(p, (r, 1)) for p, r in zip(pipelines, replies, strict=True)]
    assert waiting._entry_ids(6, runs) == [f"{i}-0" for i in range(6)]
    runs[-1] = (pipelines[-1], (replies[-1], 0))  # one node's WAIT short
    with pytest.raises(NotReplicated, match="acknowledged by 0 of 1 replicas within 50 ms") as short:
        waiting._entry_ids(6, runs)
    assert short.value.entry_ids == [f"{i}-0" for i in range(6)]  # written all the same
    no_wait = SyncProducer(client, "parser", "team")  # a WAIT not asked for: its count of 0 is no shortfall
    assert no_wait._entry_ids(6, [(p, (r, 0)) for p, (r, _) in runs]) == [f"{i}-0" for i in range(6)]


def test_the_sync_producer_writes_the_same(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url, decode_responses=True) as client:
        client.hset(STAGE.layout, "partitions", 4)
        ids = SyncProducer(client, "parser", "team").send_many(Record(f"s{i}") for i in range(20))
        for i, entry_id in enumerate(ids):
            [(_, fields)] = stream_entries_now(client, STAGE.lane_of(f"s{i}").input, entry_id, entry_id)
            assert fields["record_id"] == f"s{i}"


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_min_replicas_ack_waits_on_the_writing_connection(replicated: tuple[str, int]) -> None:
    url, replica_pid = replicated
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        await wait_until(lambda: _connected_replicas(client), "the replica connected", timeout=30)
        acked = Producer(client, "parser", "team", partitions=4, min_replicas_ack=1, min_replicas_timeout_ms=20_000)
        assert len(await acked.send_many(Record(f"r{i}") for i in range(30))) == 30
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            short = Producer(client, "parser", "team", partitions=4, min_replicas_ack=1, min_replicas_timeout_ms=300)
            with pytest.raises(NotReplicated, match="acknowledged by 0 of 1 replicas within 300 ms") as raised:
                await short.send_many([Record("late-1"), Record("late-2")])
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        assert len(raised.value.entry_ids) == 2  # written all the same: the ids say where
    finally:
        await client.aclose()


async def _connected_replicas(client: aioredis.Redis) -> bool:
    return (await client.info("replication")).get("slave0", {}).get("state") == "online"


@pytest.fixture
async def cluster_client() -> AsyncIterator[AsyncRedisCluster]:
    with single_node_cluster() as url:
        client = AsyncRedisCluster.from_url(url, decode_responses=True)
        try:
            await client.initialize()
            yield client
        finally:
            await client.aclose()


@pytest.mark.subprocess
async def test_on_a_cluster_each_node_gets_its_entries_and_its_own_wait(cluster_client: AsyncRedisCluster) -> None:
    await _set_layout(cluster_client, 4)
    ids = await Producer(cluster_client, "parser", "team").send_many(Record(f"c{i}") for i in range(40))
    by_stream = await _records_by_stream(cluster_client, [lane.input for lane in STAGE.lanes])
    assert Counter(r for rs in by_stream.values() for r in rs) == Counter(f"c{i}" for i in range(40))
    assert len(ids) == 40
    # No replica: the per-node WAIT (on the connection of the XADDs) answers 0 at once.
    no_replica = Producer(cluster_client, "parser", "team", min_replicas_ack=1, min_replicas_timeout_ms=200)
    with pytest.raises(NotReplicated, match="by 0 of 1 replicas") as raised:
        await no_replica.send_many(Record(f"w{i}") for i in range(6))
    assert all(raised.value.entry_ids)
    # The connection was handed back usable.
    assert await cluster_client.xlen(STAGE.lane_of("w0").input) >= 1


async def test_send_once_adds_a_record_id_once_within_its_window(redis: aioredis.Redis) -> None:
    """A retried batch adds nothing a second time and answers the first entries' ids; the marker lives as long as
    the window; a stage of partitions gets each record in its own lane with its marker in that lane's slot."""
    await _set_layout(redis, 4)
    producer = Producer(redis, "parser", "team")
    first = await producer.send_once([Record(f"r{i}", {"i": i}) for i in range(20)], window_seconds=60)
    assert all(sent.new for sent in first)
    again = await producer.send_once([Record("new"), *(Record(f"r{i}", {"i": -1}) for i in range(20))], 60)
    assert again[0].new and not any(sent.new for sent in again[1:])
    assert [sent.entry_id for sent in again[1:]] == [sent.entry_id for sent in first]
    by_stream = await _records_by_stream(redis, [lane.input for lane in STAGE.lanes])
    assert Counter(r for rs in by_stream.values() for r in rs) == Counter([*(f"r{i}" for i in range(20)), "new"])
    for record in ("r0", "r1", "new"):
        lane = STAGE.lane_of(record)
        assert record in by_stream[lane.input]
        marker = lane.ingest_marker(lane.input, record)
        assert key_slot(marker.encode()) == key_slot(lane.input.encode())
        assert 55 <= await redis.ttl(marker) <= 60
    # The entry is what send_many writes.
    (entry_id, fields), *_ = await stream_entries(redis, STAGE.lane_of("r3").input, first[3].entry_id)
    assert entry_id == first[3].entry_id and fields["data"] == '{"i": 3}' and "entered_at" in fields
    # A server that lost the script (a restart) gets it again, and the batch runs once.
    await redis.script_flush()
    assert [s.new for s in await producer.send_once([Record("after-flush"), Record("r1")], 60)] == [True, False]
    # Once the marker is gone (the window passed), the id is new again.
    await redis.delete(STAGE.lane_of("r0").ingest_marker(STAGE.lane_of("r0").input, "r0"))
    assert (await producer.send_once([Record("r0")], 60))[0].new


async def test_send_once_needs_a_stage_and_a_window(redis: aioredis.Redis) -> None:
    with pytest.raises(ValueError, match="needs a stage"):
        await Producer(redis, stream="plain").send_once([Record("a")], 60)
    with pytest.raises(ValueError, match="at least 1"):
        await Producer(redis, "parser", "team").send_once([Record("a")], 0)
    assert await redis.xlen("plain") == 0


async def test_send_once_to_a_named_input_marks_in_its_slot(redis: aioredis.Redis) -> None:
    named = StageKeys.for_stage("parser", "team", input="orders")
    await claim(redis, named, "uid-1", adopt=True)
    (sent,) = await Producer(redis, "parser", "team").send_once([Record("o1")], 60)
    assert sent.new and (await stream_entries(redis, "orders"))[0][0] == sent.entry_id
    assert await redis.get(named.ingest_marker("orders", "o1")) == sent.entry_id
    assert named.ingest_marker("orders", "o1") == "phoenix:{orders}:_ingested:team/parser:o1"


@pytest.mark.subprocess
async def test_send_once_on_a_cluster_and_with_a_replica_check(cluster_client: AsyncRedisCluster) -> None:
    await _set_layout(cluster_client, 4)
    producer = Producer(cluster_client, "parser", "team")
    assert all(s.new for s in await producer.send_once([Record(f"c{i}") for i in range(12)], 60))
    assert not any(s.new for s in await producer.send_once([Record(f"c{i}") for i in range(12)], 60))
    no_replica = Producer(cluster_client, "parser", "team", min_replicas_ack=1, min_replicas_timeout_ms=200)
    with pytest.raises(NotReplicated, match="by 0 of 1 replicas") as raised:
        await no_replica.send_once([Record(f"w{i}") for i in range(6)], 60)
    assert all(raised.value.entry_ids)
    assert not any(s.new for s in await producer.send_once([Record(f"w{i}") for i in range(6)], 60))


@pytest.mark.subprocess
def test_sync_producer_on_a_cluster() -> None:
    with single_node_cluster() as url, RedisCluster.from_url(url, decode_responses=True) as client:
        client.hset(STAGE.layout, "partitions", 4)
        SyncProducer(client, "parser", "team").send_many(Record(f"k{i}") for i in range(12))
        with pytest.raises(NotReplicated):
            SyncProducer(client, "parser", "team", min_replicas_ack=1, min_replicas_timeout_ms=100).send("k-w")
        assert sum(client.xlen(lane.input) for lane in STAGE.lanes) == 13


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_enqueue_from_a_file_and_from_stdin(redis: aioredis.Redis, redis_url: str, tmp_path: Path) -> None:
    await _set_layout(redis, 4)
    lines = [json.dumps({"record_id": f"f{i}", "user_id": "u", "data": {"n": i}}) for i in range(BATCH + 10)]
    source = tmp_path / "records.jsonl"
    source.write_text("\n".join(lines) + "\n\n")
    done = run_phoenix(redis_url, "enqueue", "--service", "parser", "--namespace", "team", "--from", str(source))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{BATCH + 10} records enqueued\n"
    piped = subprocess.run(  # noqa: ASYNC221 (a short CLI run, as in tests/fixtures/cli.py)
        [sys.executable, "-m", "phoenix", "enqueue", "--service", "parser", "--namespace", "team", "--from", "-"],
        input=json.dumps({"record_id": "from-stdin"}) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "REDIS_URL": redis_url},
    )
    assert piped.returncode == 0, piped.stderr
    by_stream = await _records_by_stream(redis, [lane.input for lane in STAGE.lanes])
    assert sum(map(len, by_stream.values())) == BATCH + 11
    entry = await stream_entries(redis, STAGE.lane_of("f3").input, count=BATCH)
    assert {"record_id": "f3", "user_id": "u", "data": '{"n": 3}'} in [
        {name: value for name, value in fields.items() if name != "entered_at"} for _, fields in entry
    ]


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_enqueue_from_stops_at_a_bad_line_and_says_what_went_before(
    redis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    good = [json.dumps({"record_id": f"g{i}"}) for i in range(BATCH)]  # one whole batch, sent
    source = tmp_path / "bad.jsonl"
    source.write_text("\n".join([*good, json.dumps({"record_id": "h", "data": [1]}), json.dumps({"record_id": "i"})]))
    done = run_phoenix(redis_url, "enqueue", "--service", "s", "--from", str(source))
    assert done.returncode == 1
    assert f"line {BATCH + 1}: data is not a JSON object; {BATCH} records enqueued before it" in done.stderr
    assert await redis.xlen(StageKeys.for_stage("s").input) == BATCH
    missing = run_phoenix(redis_url, "enqueue", "--service", "s", "--from", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "can't open" in missing.stderr
