"""Queue figures against a real Valkey: above all the age of the oldest unfinished entry (OLDEST), and the backlog
and ages checked against the stream's ids after XDEL and XTRIM."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.tools.queue_stats import LAG_UNKNOWN, LAG_WRONG, PENDING_DELETED, collect
from tests.fixtures.replies import read_group, stream_entries

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


async def _ids(redis: aioredis.Redis) -> list[str]:
    return [entry_id for entry_id, _ in await stream_entries(redis, STAGE.input)]


async def test_a_trim_before_delivery_is_caught_by_the_ids_and_said(redis: aioredis.Redis) -> None:
    """XTRIM MAXLEN past the last-delivered id: Redis's lag still counts the trimmed entries, and the pending ones
    trimmed away stay in the group's PEL."""
    await _add_aged(redis, 1000, 900, 800, 700, 600, 500, 400, 300, 200, 100)
    await redis.xgroup_create(STAGE.input, STAGE.consumer_group, id="0")
    await _read(redis, 3)
    (stats,) = await collect(redis, [STAGE])
    assert (stats.lag, stats.disagreements) == (7, ())  # agreeing: nothing to say
    assert stats.oldest_unfinished_seconds == pytest.approx(1000, abs=5)

    await redis.xtrim(STAGE.input, maxlen=4, approximate=False)  # three pending and three undelivered gone
    assert (await redis.xinfo_groups(STAGE.input))[0]["lag"] == 7
    (stats,) = await collect(redis, [STAGE])
    assert stats.lag == 4  # every entry left is after the last-delivered id
    assert stats.oldest_pending_seconds is None  # the three pending entries are gone from the stream
    assert stats.oldest_unfinished_seconds == pytest.approx(400, abs=5)
    (lag, lag_message), (pending, pending_message) = stats.disagreements
    assert (lag, pending) == (LAG_WRONG, PENDING_DELETED)
    assert "reports lag 7 but every one of the stream's 4 entries is after" in lag_message
    assert "BACKLOG shows 4" in lag_message
    assert pending_message.startswith("3 pending entries are no longer in the stream")


async def test_a_deletion_makes_redis_lag_null_and_oldest_is_read_from_the_ids(redis: aioredis.Redis) -> None:
    await _add_aged(redis, 600, 500, 400, 300, 200, 100)
    await redis.xgroup_create(STAGE.input, STAGE.consumer_group, id="0")
    await _read(redis, 2)
    ids = await _ids(redis)

    # An undelivered entry deleted: XINFO's lag is null; the backlog unknown, OLDEST still the oldest pending one.
    await redis.xdel(STAGE.input, ids[4])
    (stats,) = await collect(redis, [STAGE])
    assert stats.lag is None
    assert stats.oldest_undelivered_seconds == pytest.approx(400, abs=5)
    assert stats.oldest_unfinished_seconds == pytest.approx(600, abs=5)
    [(reason, message)] = stats.disagreements
    assert reason == LAG_UNKNOWN and "reports lag null" in message and "at most the stream's 5 entries" in message
    assert "lag" not in {key for key, value in stats.as_status().items() if value is not None}

    # The oldest pending entry deleted: OLDEST is the oldest pending entry still in the stream.
    await redis.xdel(STAGE.input, ids[0])
    (stats,) = await collect(redis, [STAGE])
    assert stats.pending == 2  # XPENDING still counts it
    assert stats.oldest_pending_seconds == pytest.approx(500, abs=5)
    assert stats.oldest_unfinished_seconds == pytest.approx(500, abs=5)
    assert [reason for reason, _ in stats.disagreements] == [LAG_UNKNOWN, PENDING_DELETED]
    assert stats.disagreements[1][1].startswith("1 pending entries are no longer in the stream")

    # Every undelivered entry deleted: nothing is after the last-delivered id, so the backlog is 0, not unknown.
    await redis.xdel(STAGE.input, *ids[2:])
    (stats,) = await collect(redis, [STAGE])
    assert (stats.lag, stats.oldest_undelivered_seconds) == (0, None)
    assert "reports lag null but no entry is left after the group's last-delivered id" in stats.disagreements[0][1]
