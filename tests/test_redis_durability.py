"""Redis itself: settings that can lose data are named; a Valkey killed and restarted mid-pipeline loses nothing.

Also the hand-off between stages: a record's pages wait for the parser however long it is down.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from phoenix.embedded import embedded_valkey, start_valkey
from phoenix.keys import DEFAULT_NAMESPACE
from phoenix.operator.status.durability import redis_risk_condition
from phoenix.stages.data_keys import grouped_key, pages_key, parsed_key
from phoenix.stages.samples import ensure_samples
from phoenix.worker_runtime.redis_risk import assess_redis
from tests.fixtures.chain import A_IN, B_IN, END, arrived, enqueue
from tests.fixtures.eventually import wait_until
from tests.fixtures.workers import WorkerPool, WorkerProcess


@pytest.mark.subprocess
async def test_evicting_redis_is_named_by_worker_and_operator(tmp_path: Path) -> None:
    with embedded_valkey(**{"maxmemory-policy": "allkeys-lru"}) as url:
        pool = WorkerPool(url, tmp_path)
        w = pool.start("a")
        try:
            warning = await wait_until(lambda: _event(w, "redis_may_lose_data"), "the worker's warning")
            assert "maxmemory-policy is allkeys-lru, not noeviction" in warning["reason"]
            assert warning["level"] == "warning"
            assert [e["event"] for e in w.events()].count("redis_may_lose_data") == 1  # one line, at start
            async with aioredis.Redis.from_url(url, decode_responses=True) as client:
                condition = redis_risk_condition(await assess_redis(client)).to_k8s()
        finally:
            pool.stop_all()
    assert (condition["type"], condition["status"], condition["reason"]) == ("RedisRisk", "True", "DataLossPossible")
    assert "allkeys-lru" in condition["message"]


@pytest.mark.subprocess
async def test_refused_config_reads_as_could_not_be_checked(
    redis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """A managed service that refuses CONFIG: the answer is "could not be checked", never a guess."""
    await redis.acl_setuser(
        "no-config", enabled=True, passwords=["+s3cret-pw"], keys=["*"], channels=["*"], commands=["+@all", "-config"]
    )
    try:
        limited = redis_url.replace("redis://", "redis://no-config:s3cret-pw@", 1)
        pool = WorkerPool(limited, tmp_path)
        w = pool.start("a")
        try:
            warning = await wait_until(lambda: _event(w, "redis_may_lose_data"), "the worker's warning")
        finally:
            pool.stop_all()
        assert "could not be checked" in warning["reason"]
        assert "s3cret-pw" not in w.process.log_path.read_text()
        async with aioredis.Redis.from_url(limited, decode_responses=True) as client:
            condition = redis_risk_condition(await assess_redis(client)).to_k8s()
        assert (condition["status"], condition["reason"]) == ("Unknown", "CannotCheck")
    finally:
        await redis.acl_deluser("no-config")


async def _event(worker: WorkerProcess, name: str) -> dict[str, Any] | None:
    return next((e for e in worker.events() if e["event"] == name), None)


@pytest.mark.timeout(150)
@pytest.mark.subprocess
async def test_valkey_killed_and_restarted_with_aof_mid_pipeline(tmp_path: Path) -> None:
    """SIGKILL of Valkey while records flow through two stages, every connection cut: with appendonly yes every
    record still reaches the end exactly once, and no worker exits."""
    server = start_valkey(data_dir=tmp_path / "valkey", appendonly="yes")
    port = server.port
    url = f"redis://{server.host}:{port}/0"
    pool = WorkerPool(url, tmp_path / "logs")
    client = aioredis.Redis.from_url(url, decode_responses=True)
    ids = [f"r{i}" for i in range(600)]
    try:
        await enqueue(client, A_IN, ids, action="sleep:0.02")
        a = pool.start("a", OUTPUT_QUEUE=B_IN, CONCURRENCY="4")
        b = pool.start("b", OUTPUT_QUEUE=END, CONCURRENCY="4")
        await wait_until(lambda: _arrived_at_least(client, 50), "the pipeline under way")
        await client.client_kill_filter(_type="normal", skipme=True)  # every worker connection cut at once
        await asyncio.sleep(0.3)
        before = await client.xlen(END)
        server.terminate()  # SIGKILL
        await asyncio.sleep(1.5)
        server.start()
        assert server.port == port
        # What Valkey acknowledged before the kill was in the AOF (written before the reply), so it is back.
        assert await wait_until(lambda: _arrived_at_least(client, before), "the data back after the restart")
        await wait_until(lambda: _arrived_at_least(client, len(ids)), "every record at the end", timeout=120)
        await asyncio.sleep(1)  # anything forwarded twice would arrive now
        assert await arrived(client) == Counter(ids)
        assert a.alive and b.alive
        assert "redis_settings_checked" in a.event_names()  # appendonly yes, noeviction: no warning
        assert "redis_may_lose_data" not in a.event_names()
    finally:
        pool.stop_all()
        await client.aclose()
        server.stop()


async def _arrived_at_least(client: aioredis.Redis, n: int) -> bool | None:
    try:
        return await client.xlen(END) >= n
    except RedisError:
        return None  # Valkey restarting


@pytest.mark.timeout(90)
async def test_parser_down_for_long_loses_no_record(redis: aioredis.Redis, workers: WorkerPool, tmp_path: Path) -> None:
    """The hand-off outlives the outage: pages have no TTL, so they wait for a parser that was down for long."""
    documents = ensure_samples(tmp_path / "docs")
    ids = [f"rec-{i}" for i in range(len(documents))]
    for record_id, document in zip(ids, documents, strict=True):
        await redis.xadd(
            "phoenix:{default}:router:input",
            {"record_id": record_id, "data": json.dumps({"document_url": document.resolve().as_uri()})},
        )
    workers.start(
        "router",
        processor="router",
        OUTPUT_QUEUE="phoenix:{default}:parser:input",
        DOCUMENT_ROOT=str(tmp_path / "docs"),
    )
    workers.start("grouper", processor="grouper")
    await wait_until(lambda: _length_at_least(redis, "phoenix:{default}:parser:input", len(ids)), "every record routed")
    assert [await redis.ttl(pages_key(DEFAULT_NAMESPACE, record_id)) for record_id in ids] == [-1] * len(ids)
    await asyncio.sleep(2)  # the parser stays down; nothing expires meanwhile
    workers.start("parser", processor="parser", OUTPUT_QUEUE="phoenix:{default}:grouper:input")
    await wait_until(
        lambda: _all_exist(redis, [grouped_key(DEFAULT_NAMESPACE, r) for r in ids]), "every record grouped", timeout=60
    )
    await wait_until(lambda: _settled(redis, "phoenix:{default}:grouper:input", "grouper-group"), "the grouper settled")
    [group] = await redis.xinfo_groups("phoenix:{default}:grouper:input")
    assert group["entries-read"] == len(ids)  # each record reached the grouper once
    assert (
        await redis.xlen("phoenix:{default}:parser:dlq") == 0 and await redis.xlen("phoenix:{default}:grouper:dlq") == 0
    )
    assert not await redis.keys(pages_key(DEFAULT_NAMESPACE, "*"))  # used up by the parser
    ttls = [await redis.ttl(parsed_key(DEFAULT_NAMESPACE, r)) for r in ids]
    assert all(0 < ttl <= 86400 for ttl in ttls)  # expire with the groups


async def _length_at_least(redis: aioredis.Redis, stream: str, n: int) -> bool:
    return await redis.xlen(stream) >= n


async def _all_exist(redis: aioredis.Redis, keys: list[str]) -> bool:
    return await redis.exists(*keys) == len(keys)


async def _settled(redis: aioredis.Redis, stream: str, group: str) -> bool:
    [info] = [g for g in await redis.xinfo_groups(stream) if g["name"] == group]
    return info["lag"] == 0 and info["pending"] == 0


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_min_replicas_ack_waits_for_a_replica_and_says_when_it_falls_short(tmp_path: Path) -> None:
    primary = start_valkey(appendonly="yes")
    replica = start_valkey(appendonly="yes", replicaof=f"{primary.host} {primary.port}")
    url = f"redis://{primary.host}:{primary.port}/0"
    pool = WorkerPool(url, tmp_path)
    client = aioredis.Redis.from_url(url, decode_responses=True)
    copy = aioredis.Redis.from_url(f"redis://{replica.host}:{replica.port}/0", decode_responses=True)
    replica_pid = int((await copy.info("server"))["process_id"])
    try:
        await wait_until(lambda: _replicas(client, 1), "the replica connected")
        ids = [f"r{i}" for i in range(20)]
        await enqueue(client, A_IN, ids)
        # A generous timeout: on a loaded machine the replica may take a while, and a short count is logged.
        w = pool.start("a", OUTPUT_QUEUE=B_IN, MIN_REPLICAS_ACK="1", MIN_REPLICAS_TIMEOUT_MS="20000", CONCURRENCY="5")
        await wait_until(lambda: _length_at_least(client, B_IN, len(ids)), "every record forwarded")
        assert await arrived(copy, B_IN) == Counter(ids)  # on the replica too
        assert "replicas_behind" not in w.event_names()
        assert (await assess_redis(copy)).problems == ("role is slave: writes go to a replica",)
        pool.stop_all()

        # The replica stops acknowledging (frozen): the commit's own WAIT sees that, and says so.
        os.kill(replica_pid, signal.SIGSTOP)
        try:
            await enqueue(client, A_IN, ["late"])
            w = pool.start("a", OUTPUT_QUEUE=B_IN, MIN_REPLICAS_ACK="1", MIN_REPLICAS_TIMEOUT_MS="2000")
            behind = await wait_until(lambda: _event(w, "replicas_behind"), "the short count logged")
        finally:
            os.kill(replica_pid, signal.SIGCONT)
        assert (behind["acknowledged_by"], behind["wanted"]) == (0, 1)
        # The lock renewals during the 2 s WAIT (every 0.33 s here) find the commit's own marker: not a lost lock.
        assert "lock_lost" not in w.event_names()
        assert await arrived(client, B_IN) == Counter([*ids, "late"])  # committed all the same, once
    finally:
        pool.stop_all()
        await client.aclose()
        await copy.aclose()
        replica.stop()
        primary.stop()


async def _replicas(client: aioredis.Redis, n: int) -> bool:
    info = await client.info("replication")
    return info["connected_slaves"] >= n and info.get("slave0", {}).get("state") == "online"
