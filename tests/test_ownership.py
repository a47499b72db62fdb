"""The ownership marker against a real Valkey: the atomic claim (refuse, adopt, create), deletionPolicy Delete
removing only what its own stage created, and `phoenix worker` refusing keys another stage holds."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys, input_stream, name_marker
from phoenix.operator.redis.ops import Destroyed, NotHeld, destroy
from phoenix.worker_runtime.ownership import (
    Claimed,
    KeyOfAnotherType,
    KeysHeld,
    LayoutDiffers,
    NameHeld,
    claim,
    release_names,
)
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.replies import hash_of
from tests.fixtures.sample_stage import KEYS, add, idle
from tests.fixtures.workers import WorkerPool

A = StageKeys.for_stage("shared", "team-a")
B = StageKeys.for_stage("shared", "team-b")
UID_A, UID_B = "uid-a", "uid-b"


async def _marker(redis: aioredis.Redis, keys: StageKeys) -> dict[str, str]:
    return await hash_of(redis, keys.owner)


async def test_a_claim_creates_group_dlq_and_marker_once(redis: aioredis.Redis) -> None:
    await redis.xadd(A.input, {"record_id": "early"})
    assert await claim(redis, A, UID_A, adopt=True) == Claimed(group=True, dlq=True)
    assert await claim(redis, A, UID_A, adopt=True) == Claimed(group=False, dlq=False)
    assert await _marker(redis, A) == {
        "stage": "team-a/shared",
        "uid": UID_A,
        "input": "phoenix:{team-a}:shared:input",
        "dlq": "phoenix:{team-a}:shared:dlq",
        "group": "shared-group",
        # The input held entries no group read: they were enqueued for this stage, so the stream is its own.
        "created": "input,dlq,group",
    }
    # From 0: the entry enqueued before the stage existed is still to be delivered.
    assert [(g["name"], g["lag"]) for g in await redis.xinfo_groups(A.input)] == [("shared-group", 1)]
    assert (await redis.type(A.dlq), await redis.xlen(A.dlq)) == ("stream", 0)
    # The same name in another namespace: keys of its own.
    assert await claim(redis, B, UID_B, adopt=True) == Claimed(group=True, dlq=True)
    assert (await redis.xlen(A.input), await redis.xlen(B.input)) == (1, 0)


async def test_a_group_with_no_marker_is_refused_and_nothing_is_written(redis: aioredis.Redis) -> None:
    """A worker run by hand created the group (or data was moved there by hand)."""
    await redis.xgroup_create(A.input, A.consumer_group, id="0", mkstream=True)
    with pytest.raises(KeysHeld) as refused:
        await claim(redis, A, UID_A, adopt=True)
    assert refused.value.holder == "" and "no ownership marker" in str(refused.value)
    assert await redis.exists(A.owner, A.dlq) == 0


async def test_an_explicit_input_naming_another_stages_stream_is_refused(redis: aioredis.Redis) -> None:
    await claim(redis, A, UID_A, adopt=True)
    for intruder in (
        StageKeys.for_stage("intruder", "team-a", input=A.input, group=A.consumer_group),
        StageKeys.for_stage("intruder", "team-a", input=A.input, group="another-group"),
        StageKeys.for_stage("shared", "team-b", dlq=A.dlq),
    ):
        with pytest.raises(KeysHeld) as refused:
            await claim(redis, intruder, "uid-x", adopt=True)
        assert refused.value.holder == "team-a/shared"
        assert await redis.exists(intruder.owner) == 0
    assert [g["name"] for g in await redis.xinfo_groups(A.input)] == ["shared-group"]


async def test_a_marker_of_the_same_stage_is_adopted_by_the_operator_only(redis: aioredis.Redis) -> None:
    await claim(redis, A, "old-uid", adopt=True)
    await redis.xadd(A.input, {"record_id": "waiting"})
    with pytest.raises(KeysHeld) as refused:
        await claim(redis, A, UID_A, adopt=False)  # a worker never takes over
    assert refused.value.holder == "team-a/shared (uid old-uid)"
    assert await claim(redis, A, UID_A, adopt=True) == Claimed(group=False, dlq=False, adopted_from="old-uid")
    assert (await _marker(redis, A))["uid"] == UID_A
    assert await claim(redis, A, UID_A, adopt=False) == Claimed(group=False, dlq=False)


async def test_a_marker_written_by_phoenix_migrate_is_adopted_with_its_group(redis: aioredis.Redis) -> None:
    """`phoenix migrate` writes only `stage` and `uid` = "" when it knows no more (ownership.py's contract)."""
    await redis.xgroup_create(A.input, A.consumer_group, id="0", mkstream=True)
    await redis.hset(A.owner, mapping={"stage": "team-a/shared", "uid": ""})
    with pytest.raises(KeysHeld, match="moved by phoenix migrate, not adopted"):
        await claim(redis, A, UID_A, adopt=False)  # the stage's pods wait for the operator to adopt the keys
    assert await claim(redis, A, UID_A, adopt=True) == Claimed(group=False, dlq=True, adopted_from="")
    assert (await _marker(redis, A))["created"] == "input,dlq,group"


async def test_a_key_of_another_type_is_a_conflict_and_nothing_is_written(redis: aioredis.Redis) -> None:
    await redis.set(A.dlq, "not a stream")
    with pytest.raises(KeyOfAnotherType, match="WRONGTYPE"):
        await claim(redis, A, UID_A, adopt=True)
    assert await redis.exists(A.owner, A.input) == 0


async def _fill(redis: aioredis.Redis, keys: StageKeys) -> None:
    await redis.xadd(keys.input, {"record_id": "r1"})
    await redis.xadd(keys.dlq, {"record_id": "dead"})
    await redis.zadd(keys.retry, {"member": 1})
    await redis.set(keys.record("r1"), "done 1-0")
    await redis.set(keys.record("r2"), "lock token")
    await redis.xadd(keys.audit, {"repair": "x"})
    await redis.set(keys.backpressure, 7)
    await redis.set(keys.dlq_trimmed, 3)
    await redis.hset(keys.replay_ledger("req"), "moved", 1)
    await redis.hset(keys.latency_window(time.time()), "1.0", 2)  # a final stage's, of the stage as a whole
    await redis.set(keys.ingest_marker(keys.input, "r1"), "1-0")  # phoenix ingest's, for its dedup window
    await redis.zadd(keys.held, {"r3": 1})  # held back by a rate limit


async def test_delete_removes_what_its_own_stage_created_and_nothing_else(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches smaller than the record keys: SCAN and delete in several calls.
    monkeypatch.setattr("phoenix.operator.redis.ops.DELETE_BATCH", 1)
    for keys, uid in ((A, UID_A), (B, UID_B)):
        await claim(redis, keys, uid, adopt=True)
        await _fill(redis, keys)
    assert await destroy(redis, B, UID_A) == NotHeld("team-b/shared (uid uid-b)")  # not its uid: nothing
    # The twelve and its group (a stage of one partition has no layout).
    assert await destroy(redis, B, UID_B) == Destroyed("shared-group", [B.input, B.dlq], 13)
    assert [key async for key in redis.scan_iter(match="phoenix:{team-b}:*")] == []
    # team-a's keys, all twelve and its marker, untouched.
    assert len([key async for key in redis.scan_iter(match="phoenix:{team-a}:*")]) == 13
    assert await destroy(redis, B, UID_B) == NotHeld("")  # gone, marker too: nothing more to do


async def test_delete_keeps_a_key_of_another_type_and_a_stream_it_did_not_create(redis: aioredis.Redis) -> None:
    # The input existed with another group reading it: the stage created only its own group on it.
    await redis.xgroup_create(A.input, "fan-out-reader", id="0", mkstream=True)
    await redis.xadd(A.input, {"record_id": "r1"})
    await claim(redis, A, UID_A, adopt=True)
    assert (await _marker(redis, A))["created"] == "dlq,group"
    await redis.delete(A.dlq, A.retry)
    await redis.set(A.dlq, "someone's string")
    await redis.hset(A.retry, "a", "hash")
    await redis.set(A.record_prefix + "x", "done")
    await redis.rpush(A.record_prefix + "list", "someone's list")
    # The group and one record key; the string that took the DLQ's name is not the stage's stream.
    assert await destroy(redis, A, UID_A) == Destroyed("shared-group", [], 2)
    assert [g["name"] for g in await redis.xinfo_groups(A.input)] == ["fan-out-reader"]
    assert await redis.xlen(A.input) == 1
    assert (await redis.type(A.dlq), await redis.type(A.retry)) == ("string", "hash")
    assert await redis.type(A.record_prefix + "list") == "list"
    assert await redis.exists(A.owner) == 0


@pytest.mark.timeout(90)
async def test_a_worker_run_by_hand_refuses_keys_a_stage_holds(redis: aioredis.Redis, workers: WorkerPool) -> None:
    await claim(redis, KEYS, "stage-uid", adopt=True)
    hand_run = workers.start("s")
    assert hand_run.process.popen.wait(timeout=60) == 2
    assert hand_run.process.log_path.read_text().splitlines() == [
        "phoenix worker: refusing to start: the keys of phoenix:{default}:s:input are held by PhoenixStage "
        "default/s (uid stage-uid); only that stage's own workers (STAGE_UID) run on them: give this worker keys of "
        "its own (KEY_NAMESPACE, SERVICE_NAME, INPUT_QUEUE)"
    ]
    impostor = workers.start("s", STAGE_UID="another-uid")
    assert impostor.process.popen.wait(timeout=60) == 2
    assert "held by PhoenixStage default/s (uid stage-uid)" in impostor.process.log_path.read_text()
    # The stage's own worker runs, and a worker of other keys is not concerned.
    own = workers.start("s", STAGE_UID="stage-uid")
    await add(redis, "r1")
    await wait_until(lambda: idle(redis), "the stage's own worker processed r1", timeout=60)
    assert own.alive


@pytest.mark.timeout(90)
async def test_the_stages_worker_brings_a_flushed_group_back_with_its_marker(
    redis_url: str, redis: aioredis.Redis
) -> None:
    await claim(redis, KEYS, "stage-uid", adopt=True)
    async with running_worker(redis_url, stage_uid="stage-uid"):
        await redis.flushdb()
        await add(redis, "r1")
        await wait_until(lambda: idle(redis), "r1 processed after the flush", timeout=60)
    # The operator's next claim finds its own marker, not a group of nobody's.
    assert (await _marker(redis, KEYS))["uid"] == "stage-uid"
    assert await claim(redis, KEYS, "stage-uid", adopt=True) == Claimed(group=False, dlq=False)


# --- partitions: a marker per lane, the layout -------------------------------------------------------------------

P4 = StageKeys.for_stage("shared", "team-a", partitions=4)


async def test_a_partitioned_stage_claims_each_lane_and_writes_its_layout(redis: aioredis.Redis) -> None:
    assert await claim(redis, P4, UID_A, adopt=True) == Claimed(group=True, dlq=True)
    assert await redis.hgetall(P4.layout) == {"partitions": "4"}
    for p, lane in enumerate(P4.lanes):
        assert lane.input == f"phoenix:{{team-a~{p}}}:shared:input"
        assert (await _marker(redis, lane))["input"] == lane.input
        assert [g["name"] for g in await redis.xinfo_groups(lane.input)] == ["shared-group"]
        assert (await redis.type(lane.dlq), await redis.xlen(lane.dlq)) == ("stream", 0)
    # The stage-wide marker beside the layout, audit and ledgers; no one-partition stream of the stage.
    assert await _marker(redis, P4) == {"stage": "team-a/shared", "uid": UID_A}
    assert await redis.exists(A.input, A.dlq) == 0
    assert await claim(redis, P4, UID_A, adopt=False) == Claimed(group=False, dlq=False)
    # A lane held by another stage's uid refuses the whole claim again.
    await redis.hset(P4.lanes[2].owner, "uid", "uid-other")
    with pytest.raises(KeysHeld, match=r"team-a/shared \(uid uid-other\)"):
        await claim(redis, P4, UID_A, adopt=False)


async def test_another_partition_count_than_the_layout_is_refused_with_how_to_change_it(
    redis: aioredis.Redis,
) -> None:
    await claim(redis, P4, UID_A, adopt=True)
    with pytest.raises(LayoutDiffers) as refused:
        await claim(redis, StageKeys.for_stage("shared", "team-a", partitions=2), UID_A, adopt=True)
    assert (refused.value.layout, refused.value.wanted) == (4, 2)
    assert "set partitions back to 4" in str(refused.value) and "deletionPolicy Delete" in str(refused.value)
    with pytest.raises(LayoutDiffers):
        await claim(redis, A, UID_A, adopt=True)  # one partition: the same refusal
    assert await redis.hgetall(P4.layout) == {"partitions": "4"}
    assert await redis.exists(A.input, A.dlq) == 0


async def test_a_stage_claimed_before_layouts_existed_is_one_partition(redis: aioredis.Redis) -> None:
    """Keys of one partition have no layout (no layout means one partition): a count of 4 is refused, 1 goes on
    and writes none."""
    await claim(redis, B, UID_B, adopt=True)
    await redis.xadd(B.input, {"record_id": "waiting"})
    with pytest.raises(LayoutDiffers) as refused:
        await claim(redis, StageKeys.for_stage("shared", "team-b", partitions=4), UID_B, adopt=True)
    assert (refused.value.layout, refused.value.wanted) == (1, 4)
    assert await redis.exists(B.layout) == 0
    assert await claim(redis, B, UID_B, adopt=True) == Claimed(group=False, dlq=False)
    assert await redis.exists(B.layout) == 0


async def test_delete_removes_every_lane_and_the_stage_wide_keys(redis: aioredis.Redis) -> None:
    for keys, uid in ((P4, UID_A), (B, UID_B)):
        await claim(redis, keys, uid, adopt=True)
    for lane in P4.lanes:
        await _fill(redis, lane)  # the lane's keys (a replay ledger too), and the stage-wide audit (the same each time)
        await redis.xadd(lane.outbox, {"record_id": "r1"})
    before_b = sorted([key async for key in redis.scan_iter(match="phoenix:{team-b}:*")])
    assert await destroy(redis, P4, UID_B) == NotHeld("team-a/shared (uid uid-a)")
    await redis.hset(P4.lanes[3].owner, "uid", "uid-other")  # one lane adopted by another: nothing deleted
    assert await destroy(redis, P4, UID_A) == NotHeld("team-a/shared (uid uid-other)")
    assert await redis.xlen(P4.lanes[0].input) == 1
    await redis.hset(P4.lanes[3].owner, "uid", UID_A)
    destroyed = await destroy(redis, P4, UID_A)
    assert isinstance(destroyed, Destroyed)
    assert destroyed.streams == [s for lane in P4.lanes for s in (lane.input, lane.dlq)]
    # Per lane: group, input, DLQ, retry, 2 records, ingest marker, replay ledger, backpressure, trim counter, outbox;
    # audit, layout, latency window, held set.
    assert destroyed.keys == 4 * 11 + 4
    assert [key async for key in redis.scan_iter(match="phoenix:{team-a*")] == []
    assert sorted([key async for key in redis.scan_iter(match="phoenix:{team-b}:*")]) == before_b


@pytest.mark.timeout(90)
async def test_a_worker_started_with_another_partition_count_exits_with_one_line(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await claim(redis, KEYS, "stage-uid", adopt=True)
    await add(redis, "r1")
    by_hand = StageKeys.for_stage("h")
    await redis.xadd(by_hand.input, {"record_id": "r1"})  # a stage run by hand before layouts: no layout at all
    # The stage's own worker, and one run by hand.
    for service, env in (("s", {"STAGE_UID": "stage-uid"}), ("h", {})):
        started = workers.start(service, PARTITIONS="4", **env)
        assert started.process.popen.wait(timeout=60) == 2
        lines = started.process.log_path.read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"phoenix worker: refusing to start with PARTITIONS=4: stage default/{service} is laid out in 1 "
            "partition(s) in Redis, not the 4 asked for; its records are in the lanes of the old count: set "
            "partitions back to 1"
        ), lines
    assert (await redis.xlen(KEYS.input), await redis.xlen(by_hand.input)) == (1, 1)
    assert await redis.exists(by_hand.layout) == 0


@pytest.mark.timeout(90)
async def test_a_worker_forwarding_to_another_count_than_the_next_stages_layout_exits_with_one_line(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """OUTPUT_PARTITIONS against the next stage's layout: forwarding to its unpartitioned input (or to lanes of
    another count) would put every result where no worker of it reads."""
    following = StageKeys.for_stage("nxt", partitions=4)
    await claim(redis, following, "nxt-uid", adopt=True)  # writes its layout: 4
    await add(redis, "r1")
    started = workers.start("s", OUTPUT_QUEUE=input_stream("nxt"))  # OUTPUT_PARTITIONS: 1 by default
    assert started.process.popen.wait(timeout=60) == 2
    lines = started.process.log_path.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "phoenix worker: refusing to start with OUTPUT_PARTITIONS=1: the next stage default/nxt is laid out in 4 "
        "partition(s) in Redis, not the 1 this worker would forward to"
    ), lines
    assert "set OUTPUT_PARTITIONS=4" in lines[0]
    assert await redis.exists(input_stream("nxt")) == 0  # nothing forwarded beside its lanes
    assert await redis.xlen(KEYS.input) == 1


# --- names a stage gives its streams itself, Kubernetes clusters, the layout Redis holds --------------------------

ORDERS = "orders"


async def test_a_stream_named_by_a_stage_is_its_namespaces_and_refused_to_another(redis: aioredis.Redis) -> None:
    ingest = StageKeys.for_stage("ingest", "team-a", input=ORDERS)
    assert await claim(redis, ingest, UID_A, adopt=True) == Claimed(group=True, dlq=True)
    assert await hash_of(redis, name_marker(ORDERS)) == {"namespace": "team-a", "stage:ingest": "1"}
    await redis.xadd(ORDERS, {"record_id": "r1"})
    # Another namespace may neither read it, nor dead-letter into it, nor write its results there.
    for intruder in (
        StageKeys.for_stage("ingest", "team-b", input=ORDERS),
        StageKeys.for_stage("thief", "team-b", input=ORDERS, group="ingest-group"),
        StageKeys.for_stage("thief", "team-b", dlq=ORDERS),
        StageKeys.for_stage("thief", "team-b", output=ORDERS),
    ):
        with pytest.raises(NameHeld) as refused:
            await claim(redis, intruder, UID_B, adopt=True)
        assert refused.value.holder == "team-a" and str(refused.value) == (
            "the stream orders is claimed by the stages of namespace team-a"
        )
        assert await redis.exists(intruder.owner) == 0
    assert [g["name"] for g in await redis.xinfo_groups(ORDERS)] == ["ingest-group"]
    assert await redis.exists("phoenix:{team-b}:ingest:dlq", "phoenix:{team-b}:thief:dlq") == 0
    # The namespace's own stages share it: one writes its results there, another reads it with its own group.
    assert await claim(redis, StageKeys.for_stage("intake", "team-a", output=ORDERS), UID_A, adopt=True)
    assert await claim(redis, StageKeys.for_stage("audit", "team-a", input=ORDERS), UID_A, adopt=True)
    assert set(await hash_of(redis, name_marker(ORDERS))) == {
        "namespace",
        "stage:ingest",
        "stage:intake",
        "stage:audit",
    }


async def test_delete_keeps_a_named_stream_others_read_and_the_last_stage_frees_the_name(
    redis: aioredis.Redis,
) -> None:
    ingest, audit = (
        StageKeys.for_stage("ingest", "team-a", input=ORDERS),
        StageKeys.for_stage("audit", "team-a", input=ORDERS),
    )
    await claim(redis, ingest, UID_A, adopt=True)  # created the stream
    await claim(redis, audit, "uid-audit", adopt=True)
    await redis.xadd(ORDERS, {"record_id": "waiting"})
    destroyed = await destroy(redis, ingest, UID_A)
    assert destroyed == Destroyed("ingest-group", [ingest.dlq], 2, kept=[ORDERS])
    assert await release_names(redis, ingest, ingest.claimed_streams, "") == []  # audit still uses it
    assert [(g["name"], g["lag"]) for g in await redis.xinfo_groups(ORDERS)] == [("audit-group", 1)]
    # A stage alone on the stream it created deletes it, and gives the name up.
    alone = StageKeys.for_stage("alone", "team-b", input="payments")
    await claim(redis, alone, UID_B, adopt=True)
    assert await destroy(redis, alone, UID_B) == Destroyed("alone-group", ["payments", alone.dlq], 3)
    assert await release_names(redis, alone, alone.claimed_streams, "") == ["payments"]
    assert await redis.exists("payments", name_marker("payments")) == 0
    # Its name is free: another namespace may claim it now.
    assert await claim(redis, StageKeys.for_stage("alone", "team-c", input="payments"), "uid-c", adopt=True)


async def test_delete_keeps_a_stream_it_created_that_another_group_joined(redis: aioredis.Redis) -> None:
    """A group created by hand (or by a stage before names were claimed) on a stream the stage created."""
    await claim(redis, A, UID_A, adopt=True)
    await redis.xgroup_create(A.input, "joined-by-hand", id="0")
    await redis.xadd(A.input, {"record_id": "theirs"})
    destroyed = await destroy(redis, A, UID_A)
    assert isinstance(destroyed, Destroyed) and destroyed.kept == [A.input] and destroyed.streams == [A.dlq]
    assert [(g["name"], g["lag"]) for g in await redis.xinfo_groups(A.input)] == [("joined-by-hand", 1)]


async def test_another_clusters_stage_of_the_same_name_is_refused_and_deletes_nothing(redis: aioredis.Redis) -> None:
    ingest = StageKeys.for_stage("ingest", "team-a", input=ORDERS)
    await claim(redis, ingest, UID_A, adopt=True, cluster="cluster-1")
    assert (await _marker(redis, ingest))["cluster"] == "cluster-1"
    await redis.xadd(ORDERS, {"record_id": "r1"})
    # Cluster 2 has a PhoenixStage team-a/ingest too (another uid): an adoption there would take cluster 1's keys.
    with pytest.raises(NameHeld, match="team-a of Kubernetes cluster cluster-1"):
        await claim(redis, ingest, "uid-2", adopt=True, cluster="cluster-2")
    await claim(redis, A, UID_A, adopt=True, cluster="cluster-1")
    with pytest.raises(KeysHeld, match=r"team-a/shared of Kubernetes cluster cluster-1"):
        await claim(redis, A, "uid-2", adopt=True, cluster="cluster-2")
    assert await destroy(redis, A, "uid-2", "cluster-2") == NotHeld(
        "team-a/shared (uid uid-a, Kubernetes cluster cluster-1)"
    )
    assert await destroy(redis, ingest, "uid-2", "cluster-2") == NotHeld(
        "team-a/ingest (uid uid-a, Kubernetes cluster cluster-1)"
    )
    assert await release_names(redis, ingest, ingest.claimed_streams, "cluster-2") == []
    assert await redis.xlen(ORDERS) == 1 and await redis.exists(name_marker(ORDERS)) == 1


async def test_a_marker_written_before_clusters_is_taken_by_the_first_cluster(redis: aioredis.Redis) -> None:
    await claim(redis, A, "old-uid", adopt=True)  # an operator that knows no cluster: no field
    assert "cluster" not in await _marker(redis, A)
    assert await claim(redis, A, UID_A, adopt=True, cluster="cluster-1") == Claimed(False, False, "old-uid")
    assert (await _marker(redis, A))["cluster"] == "cluster-1"
    with pytest.raises(KeysHeld, match="of Kubernetes cluster cluster-1"):
        await claim(redis, A, "uid-2", adopt=True, cluster="cluster-2")
    # A worker knowing no cluster (STAGE_CLUSTER unset) neither checks nor changes it.
    assert await claim(redis, A, UID_A, adopt=False) == Claimed(False, False)
    assert (await _marker(redis, A))["cluster"] == "cluster-1"


async def test_delete_after_a_refused_partition_change_removes_the_lanes_redis_holds(redis: aioredis.Redis) -> None:
    """The spec asks for one partition now (refused: the layout has 4); Delete goes by the layout."""
    await claim(redis, P4, UID_A, adopt=True)
    for lane in P4.lanes:
        await redis.xadd(lane.input, {"record_id": f"r{lane.partition}"})
    with pytest.raises(LayoutDiffers):
        await claim(redis, A, UID_A, adopt=True)
    destroyed = await destroy(redis, A, UID_A)
    assert isinstance(destroyed, Destroyed)
    assert destroyed.streams == [s for lane in P4.lanes for s in (lane.input, lane.dlq)]
    assert [key async for key in redis.scan_iter(match="phoenix:{team-a*")] == []
