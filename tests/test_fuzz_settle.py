"""Property-based (issue 30): the settle path under injected faults writes every outcome once. The real Settler and
settle.lua on the real Valkey, through a loopback proxy that loses the replies of settle calls the example picks
(the script ran, the settler sends the batch again), while the retry set is promoted meanwhile; and items the script
fails on alone (a record key someone overwrote with another type: WRONGTYPE), which the settler writes again in
halves around them.

Per item, once the settler has flushed: a commit's marker and one forward, a dead letter's one DLQ entry, a retry's
one member or one promoted entry, a skip's acknowledgement, a leave still pending; an item the script fails on is
left pending (a commit, a leave) or written once (a dead letter, a retry: they come before the release that fails).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from phoenix import lua
from phoenix.keys import StageKeys
from phoenix.record_format import committed_by, packed_pairs
from phoenix.redis_spec import RedisSpec, connect
from phoenix.worker_runtime.dlq import dead_letter_fields
from phoenix.worker_runtime.outcomes import Disposition, Outcome
from phoenix.worker_runtime.retry import RetryScheduler
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.settle import Settler
from tests.fixtures.fuzzing import FUZZ_SCALE, fuzz_settings
from tests.fixtures.replies import get_text, read_group, scored_members, stream_entries
from tests.fixtures.tcp_proxy import TcpProxy, tcp_proxy

pytestmark = pytest.mark.fuzz

LOCK = "lock fuzz:0123456789ab"
KINDS = ["commit", "commit-none", "dead", "retry", "retry-due", "leave", "skip", "intake-dead"]
# The kinds whose script call touches the record's key (a lock to turn into a marker, or to release).
TOUCH_KEY = {"commit", "commit-none", "dead", "retry", "retry-due", "leave"}
_stages = itertools.count()


@dataclass(frozen=True)
class Item:
    kind: str
    wrong_type: bool  # the record's key holds a hash: the script fails on this item

    def __repr__(self) -> str:
        return self.kind + (" (key of another type)" if self.wrong_type else "")


items = st.lists(
    st.builds(Item, st.sampled_from(KINDS), st.sampled_from([False, False, False, True])), min_size=1, max_size=10
)


def _outcome(item: Item, entry_id: str, record_id: str, stage: str) -> Outcome:
    raw = {b"record_id": record_id.encode(), b"data": b"{}"}
    if item.kind in ("commit", "commit-none"):
        fields: tuple[str, ...] = ("u", "{}", "17", "") if item.kind == "commit" else ()
        return Outcome(Disposition.COMMIT, entry_id, record_id, fields, holds_lock=True)
    if item.kind in ("dead", "intake-dead"):
        failure = dead_letter_fields(raw, entry_id, error="bad", error_type="BadInput", stage=stage, attempts=1)
        return Outcome(Disposition.DEAD_LETTER, entry_id, record_id, failure, holds_lock=item.kind == "dead")
    if item.kind in ("retry", "retry-due"):
        member = f'["record_id", "{record_id}", "data", "{{}}", "original_id", "{entry_id}"]'
        delay = 0 if item.kind == "retry-due" else 600_000  # promoted at once, or never within the example
        return Outcome(Disposition.RETRY, entry_id, record_id, (delay, member), holds_lock=True)
    if item.kind == "leave":
        return Outcome(Disposition.LEAVE, entry_id, record_id, holds_lock=True)
    return Outcome(Disposition.SKIP, entry_id, record_id, holds_lock=False)


@pytest.fixture
async def proxy(redis_url: str, redis: aioredis.Redis) -> AsyncIterator[TcpProxy]:
    with tcp_proxy(redis_url) as p:
        yield p


async def _promote_until_cancelled(scheduler: RetryScheduler) -> None:
    while True:
        await scheduler.promote_due()
        await asyncio.sleep(0.02)


@pytest.mark.timeout(120 * FUZZ_SCALE)  # a lost reply costs a socket timeout: about 1 s an example
@fuzz_settings(10)
@given(batch=items, lost=st.integers(0, 2), split=st.integers(0, 10))
async def test_every_outcome_is_written_once_whatever_replies_are_lost_and_items_fail(
    proxy: TcpProxy, redis: aioredis.Redis, raw_redis: aioredis.Redis, batch: list[Item], lost: int, split: int
) -> None:
    stage = f"st{next(_stages)}"
    keys = StageKeys.for_stage(stage)
    output = f"phoenix:{{default}}:{stage}:output"
    settings = WorkerSettings(service_name=stage, processor="p", output_queue=output)
    await redis.xgroup_create(keys.input, keys.consumer_group, id="0", mkstream=True)
    records = [f"r{i}" for i in range(len(batch))]
    for record_id in records:
        await redis.xadd(keys.input, {"record_id": record_id, "data": "{}"})
    entry_ids = [entry_id for entry_id, _ in await read_group(redis, keys.consumer_group, "fuzz", keys.input, 100)]
    for item, record_id in zip(batch, records, strict=True):
        key = keys.record(record_id)
        if item.wrong_type and item.kind in TOUCH_KEY:
            await redis.hset(key, "someone", "else")
        elif item.kind in TOUCH_KEY:
            await redis.set(key, LOCK)
    outcomes = [_outcome(*args, stage) for args in zip(batch, entry_ids, records, strict=True)]

    settle_sha = await redis.script_load(lua.source("settle.lua", "phoenix.worker_runtime"))
    for _ in range(lost):
        proxy.drop_reply_to(settle_sha.encode())
    client = connect(RedisSpec.from_url(proxy.url, socket_timeout=0.5), decode_responses=False)
    settled: list[Outcome] = []
    settler = Settler(client, settings, LOCK, settled.extend)
    tasks = [
        asyncio.create_task(settler.run()),
        asyncio.create_task(_promote_until_cancelled(RetryScheduler(raw_redis, settings))),
    ]
    try:
        for part in (outcomes[:split], outcomes[split:]):
            for outcome in part:
                settler.submit(outcome)
            await asyncio.wait_for(settler.flush(), 30)
        await asyncio.sleep(0.1)  # a retry due at once: promoted by now
        assert not tasks[0].done()
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks)
        await client.aclose()

    assert sorted(o.entry_id for o in settled) == sorted(entry_ids)  # each handed back once
    pending = {row["message_id"] for row in await redis.xpending_range(keys.input, keys.consumer_group, "-", "+", 100)}
    forwards = [f["record_id"] for _, f in await stream_entries(redis, output)]
    dead = [f["original_id"] for _, f in await stream_entries(redis, keys.dlq)]
    members = [packed_pairs(m)["original_id"] for m, _ in await scored_members(redis, keys.retry)]
    promoted = [f.get("original_id") for e, f in await stream_entries(redis, keys.input) if e not in entry_ids]
    for item, entry_id, record_id in zip(batch, entry_ids, records, strict=True):
        failing = item.wrong_type and item.kind in TOUCH_KEY
        if item.kind in ("commit", "commit-none", "leave") and failing:
            assert entry_id in pending and forwards.count(record_id) == 0, item
            continue
        if item.kind in ("commit", "commit-none"):
            assert committed_by(await get_text(redis, keys.record(record_id))) == entry_id, item
            assert forwards.count(record_id) == (item.kind == "commit"), item
        elif item.kind in ("dead", "intake-dead"):
            assert dead.count(entry_id) == 1, (item, dead)
        elif item.kind in ("retry", "retry-due"):
            assert members.count(entry_id) + promoted.count(entry_id) == 1, (item, members, promoted)
        assert (entry_id in pending) == (item.kind == "leave"), item
        if item.kind in TOUCH_KEY - {"commit", "commit-none"} and not failing:
            assert await redis.exists(keys.record(record_id)) == 0, item  # the lock released
