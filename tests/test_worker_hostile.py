"""Hostile input never stops a stage (issue 30): a record of any content, a result of any shape and a settle whose
reply is lost end committed, retried or dead-lettered, once; the worker stays up, and when one of its own tasks
ends all the same it says why and exits non-zero. Real Valkey, real `phoenix worker` processes and the real Worker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from phoenix import lua
from tests.fixtures.eventually import wait_until
from tests.fixtures.health import probe
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.records import committed
from tests.fixtures.replies import add_entry, get_text, read_group, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, add, idle, outputs
from tests.fixtures.tcp_proxy import TcpProxy, tcp_proxy
from tests.fixtures.workers import WorkerPool

NESTED_LISTS = "[" * 3000 + "]" * 3000
NESTED_OBJECTS = '{"a":' * 3000 + "1" + "}" * 3000


@pytest.mark.timeout(60)
async def test_deeply_nested_data_is_dead_lettered_and_the_records_behind_it_flow(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """6 KB of nested lists stopped a whole stage: the reader's RecursionError ended the intake and the worker
    exited 0, to read the same entry after its restart."""
    lists = await add_entry(redis, IN, {"record_id": "lists", "data": NESTED_LISTS})
    objects = await add_entry(redis, IN, {"record_id": "objects", "data": NESTED_OBJECTS})
    for i in range(40):
        await add(redis, f"ok{i}")
    w = workers.start("s", OUTPUT_QUEUE=OUT, MAX_DELIVERIES="2")
    await wait_until(lambda: committed(redis, "s", "ok39"), "the good records behind the nested ones", 30)
    await wait_until(lambda: idle(redis), "queue drained")
    assert sorted(o["record_id"] for o in await outputs(redis)) == sorted(f"ok{i}" for i in range(40))
    dead = {fields["original_id"]: fields for _, fields in await stream_entries(redis, DLQ)}
    assert set(dead) == {lists, objects}
    for fields in dead.values():
        assert fields["error_type"] == "MalformedMessage"
        assert fields["error"] == "data nests deeper than 1024 levels"
    assert w.alive


async def test_the_poison_limit_is_checked_before_the_entry_is_parsed(redis: aioredis.Redis, redis_url: str) -> None:
    """An entry delivered past MAX_DELIVERIES is dead-lettered before anything reads its content, so that content
    that ends a worker for a reason nobody foresaw still ends in the DLQ (it was parsed first, and could end it
    again)."""
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    entry = await add_entry(redis, IN, {"record_id": "r", "data": "{not json"})
    await read_group(redis, KEYS.consumer_group, "gone", IN, 10)  # delivered to a worker that died, three times
    for _ in range(2):
        await redis.xclaim(IN, KEYS.consumer_group, "gone", 0, [entry])
    async with running_worker(redis_url, max_deliveries=3, claim_idle_ms=100) as worker:
        await wait_until(lambda: drained(worker), "the entry dead-lettered")
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["error_type"], dead["attempts"]) == ("PoisonMessage", "4")


@pytest.mark.timeout(60)
async def test_a_worker_whose_own_task_ends_fails_healthz_drains_and_exits_non_zero(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """A task of the worker's that ended by itself (here the trimmer, cancelled from inside) made the worker stop
    as if asked to, and exit 0: Kubernetes saw a clean exit, and nobody why."""
    await add(redis, "slow", sleep=2)
    await add(redis, "breaks", end_task="trimmer")
    port = free_loopback_port()
    w = workers.start("s", processor="tests.processors:TaskEndingProcessor", CONCURRENCY="2", HEALTH_PORT=str(port))
    async with aiohttp.ClientSession() as http:

        async def failing() -> str | None:
            answer = await probe(http, port)
            return answer[1] if answer and answer[0] == 503 else None

        reason = await wait_until(failing, "/healthz to fail", 20, interval=0.05)
    assert reason.strip() == "worker task trimmer was cancelled"
    assert w.process.popen.wait(timeout=30) == 1
    [line] = [e for e in w.events() if e["event"] == "worker_task_ended"]
    assert line["level"] == "error" and line["reason"] == reason.strip()
    # The records in hand were finished first: nothing left pending for the next worker.
    assert await committed(redis, "s", "slow") and await committed(redis, "s", "breaks")
    assert await idle(redis)


LOST_REPLY_CASES: dict[str, tuple[dict[str, str], dict[str, Any], int, int]] = {
    # record's entry, WorkerSettings, the processor calls and entries of the record it takes
    "dead-letter": ({"data": '{"action": "invalid"}'}, {}, 1, 1),
    "intake-dead-letter": ({"data": "{not json"}, {}, 0, 1),
    "retry": ({"data": '{"action": "fail"}'}, {"max_attempts": 2}, 2, 2),
}


@pytest.mark.parametrize("case", list(LOST_REPLY_CASES))
async def test_a_settle_whose_reply_is_lost_writes_no_second_dead_letter_or_retry(
    redis: aioredis.Redis, redis_url: str, case: str
) -> None:
    """The settle script ran, its reply never came: the settler sends the batch again after its socket timeout.
    A dead letter was written twice, and a retry the retry set had promoted meanwhile was added again (run twice)."""
    fields, settings, calls, entries = LOST_REPLY_CASES[case]
    # Loaded beforehand, so that the call whose reply is lost runs the script (not a NOSCRIPT answer).
    settle_sha = await redis.script_load(lua.source("settle.lua", "phoenix.worker_runtime"))
    first = await add_entry(redis, IN, {"record_id": "r", **fields})
    with tcp_proxy(redis_url) as proxy:
        proxy.drop_reply_to(settle_sha.encode())
        async with running_worker(proxy.url, socket_timeout=1.0, output_queue=OUT, **settings) as worker:
            await wait_until(lambda: _dropped(proxy), "a settle's reply lost", 10)
            await asyncio.wait_for(worker.settler.flush(), 10)  # sent again after the timeout
            await wait_until(lambda: idle(redis), "queue drained")
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["original_id"] == first and dead["record_id"] == "r"
    assert int(await get_text(redis, "calls:s") or 0) == calls
    of_record = [e for e, f in await stream_entries(redis, IN) if f.get("original_id", e) == first]
    assert len(of_record) == entries


async def _dropped(proxy: TcpProxy) -> bool:
    return proxy.replies_dropped == 1
