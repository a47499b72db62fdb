"""Queue figures against a real Valkey: above all the age of the oldest unfinished entry (OLDEST)."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.tools.queue_stats import collect
from tests.fixtures.replies import read_group

STAGE = StageKeys.for_stage("s")


async def _add_aged(redis: aioredis.Redis, *ages: int) -> None:
    """Entries whose ids say they were added `ages` seconds ago (oldest first)."""
    now_ms = int(time.time() * 1000)
    for age in ages:
        await redis.xadd(STAGE.input, {"record_id": f"r{age}"}, id=f"{now_ms - age * 1000}-0")


async def _read(redis: aioredis.Redis, count: int) -> list[str]:
    return [entry_id for entry_id, _ in await read_group(redis, STAGE.consumer_group, "c1", STAGE.input, count)]


async def test_oldest_unfinished_is_the_older_of_first_undelivered_and_oldest_pending(redis: aioredis.Redis) -> None:
    await _add_aged(redis, 300, 200, 100)
    await redis.xgroup_create(STAGE.input, STAGE.consumer_group, id="0")

    # Nothing delivered yet: OLDEST is the first entry, though nothing is pending.
    (stats,) = await collect(redis, [STAGE])
    assert (stats.lag, stats.pending, stats.oldest_pending_seconds) == (3, 0, None)
    assert stats.oldest_undelivered_seconds == pytest.approx(300, abs=5)
    assert stats.oldest_unfinished_seconds == stats.oldest_undelivered_seconds

    # The first one finished: the next undelivered one is the oldest unfinished.
    (first,) = await _read(redis, 1)
    await redis.xack(STAGE.input, STAGE.consumer_group, first)
    (stats,) = await collect(redis, [STAGE])
    assert stats.oldest_unfinished_seconds == pytest.approx(200, abs=5)

    # One delivered and not acknowledged: it is older than the remaining backlog; both figures are kept.
    await _read(redis, 1)
    (stats,) = await collect(redis, [STAGE])
    assert stats.oldest_pending_seconds == pytest.approx(200, abs=5)
    assert stats.oldest_undelivered_seconds == pytest.approx(100, abs=5)
    assert stats.oldest_unfinished_seconds == stats.oldest_pending_seconds
    status = stats.as_status()
    assert status["oldestUnfinishedSeconds"] == status["oldestPendingSeconds"]

    # Everything finished: no age at all.
    (last,) = await _read(redis, 1)
    pending = await redis.xpending_range(STAGE.input, STAGE.consumer_group, min="-", max="+", count=10)
    await redis.xack(STAGE.input, STAGE.consumer_group, last, *(p["message_id"] for p in pending))
    (stats,) = await collect(redis, [STAGE])
    assert (stats.oldest_pending_seconds, stats.oldest_undelivered_seconds, stats.oldest_unfinished_seconds) == (
        None,
        None,
        None,
    )


async def test_without_a_group_every_entry_is_undelivered(redis: aioredis.Redis) -> None:
    await _add_aged(redis, 60, 30)
    missing, empty = await collect(redis, [STAGE, StageKeys.for_stage("e")])
    assert not missing.group_exists
    assert missing.oldest_unfinished_seconds == pytest.approx(60, abs=5)
    assert (empty.length, empty.oldest_unfinished_seconds) == (0, None)
