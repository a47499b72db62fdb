"""`phoenix migrate`: a stage's data moves from the v1 names (`phoenix:<stage>:...`) to the v2 layout of its
namespace without losing or repeating a record, or is refused with one line saying why; an interrupted move is
finished by the next run. Real Valkey, the real CLI, real workers."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis

from phoenix.keys import LegacyStageKeys, StageKeys
from phoenix.record_format import DONE, LOCKED
from phoenix.tools import migrate
from tests.fixtures.cli import run_phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.replies import add_entry, stream_entries
from tests.test_cli_repairs import ME, ok, recent, refused_without_yes

OLD = LegacyStageKeys("s")
NEW = StageKeys.for_stage("s", "team-a")
GROUP = NEW.consumer_group
MIGRATE = ("migrate", "--service", "s", "--namespace", "team-a")
# The v1 workers are gone by the time this runs: their consumer is taken for dead once idle this long.
IDLE_MS = 300


def _entry(record_id: str, **data: str) -> dict[str, str]:
    return {"record_id": record_id, "user_id": "u1", "data": json.dumps(data)}


async def _v1_stage(redis: aioredis.Redis) -> dict[str, str]:
    """A stage as v1 workers left it: waiting entries, one pending on a worker that died (no lock left), one
    record already processed (its marker) whose duplicate waits, a retry due now and one due in an hour, two dead
    letters (and three trimmed ever), an audit entry. Returns the entry ids by record."""
    ids = {}
    await redis.xgroup_create(OLD.input, GROUP, id="0", mkstream=True)
    ids["p1"] = await add_entry(redis, OLD.input, _entry("p1"))
    await redis.xreadgroup(GROUP, "old-1", {OLD.input: ">"}, count=1)
    ids["d1"] = await add_entry(redis, OLD.input, _entry("d1"))
    await redis.set(OLD.record_prefix + "d1", DONE + "1-1", ex=3600)
    for record in ("w1", "w2"):
        ids[record] = await add_entry(redis, OLD.input, _entry(record))
    now_ms = int(time.time() * 1000)
    await redis.zadd(
        OLD.retry,
        {
            json.dumps(["record_id", "r1", "user_id", "u1", "data", "{}", "retry_count", "1"]): now_ms,
            json.dumps(["record_id", "r2", "user_id", "u1", "data", "{}", "retry_count", "1"]): now_ms + 3_600_000,
        },
    )
    for record in ("x1", "x2"):
        ids[record] = await add_entry(
            redis, OLD.dlq, {**_entry(record), "error": "gone", "error_type": "RecordNotFoundError"}
        )
    await redis.set(OLD.dlq_trimmed, 3)
    await redis.xadd(OLD.audit, {"action": "reclaim", "count": "1", "detail": "before the move", "actor": "x"})
    await _consumers_idle(redis, OLD.input)
    return ids


async def _consumers_idle(redis: aioredis.Redis, stream: str) -> None:
    async def idle() -> bool:
        return all(c["idle"] > IDLE_MS for c in await redis.xinfo_consumers(stream, GROUP))

    await wait_until(idle, f"the consumers of {stream} idle over {IDLE_MS} ms")


async def _keys(redis: aioredis.Redis, pattern: str) -> list[str]:
    return sorted([key async for key in redis.scan_iter(match=pattern)])


def _migrate(redis_url: str, *args: str) -> list[str]:
    return ok(run_phoenix(redis_url, *MIGRATE, "--idle-ms", str(IDLE_MS), *args))


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_a_v1_stage_moves_and_a_v2_worker_finishes_every_record_once(
    redis: aioredis.Redis, redis_url: str
) -> None:
    ids = await _v1_stage(redis)
    v1_keys = await _keys(redis, "phoenix:s:*")

    dry = _migrate(redis_url, "--dry-run")
    assert dry == [
        "would move 1 record keys (locks and markers) phoenix:s:record:* to phoenix:{team-a}:s:record:*",
        "would move the retry set phoenix:s:retry to phoenix:{team-a}:s:retry",
        "would move the DLQ phoenix:s:dlq to phoenix:{team-a}:s:dlq",
        "would move the DLQ trimmed counter phoenix:s:dlq:trimmed to phoenix:{team-a}:s:dlq-trimmed",
        "would move the audit stream phoenix:s:audit to phoenix:{team-a}:s:audit",
        "would move the input stream (with its consumer groups and pending entries) phoenix:s:input to "
        "phoenix:{team-a}:s:input",
        "would write the ownership marker phoenix:{team-a}:s:owner (stage team-a/s)",
        "would move stage s to namespace team-a; nothing changed",
    ]
    refused_without_yes(
        run_phoenix(redis_url, *MIGRATE, "--idle-ms", str(IDLE_MS)),
        "Move the 6 keys of stage s from the v1 names to namespace team-a?",
    )
    assert await _keys(redis, "phoenix:s:*") == v1_keys and await _keys(redis, "phoenix:{team-a}:*") == []

    assert _migrate(redis_url, "--yes") == [
        line.removeprefix("would ").replace("move ", "moved ", 1).replace("write ", "wrote ", 1) for line in dry[:-1]
    ] + ["migrated stage s to namespace team-a: start its workers of the new version"]
    assert await _keys(redis, "phoenix:s:*") == []
    # Moved as they were: the group and its pending entry, the entries' ids, the marker with its TTL.
    [group] = await redis.xinfo_groups(NEW.input)
    assert (group["name"], group["pending"], group["lag"]) == (GROUP, 1, 3)
    [pending] = await redis.xpending_range(NEW.input, GROUP, "-", "+", 10)
    assert (pending["message_id"], pending["consumer"]) == (ids["p1"], "old-1")
    assert [entry_id for entry_id, _ in await stream_entries(redis, NEW.input)] == [
        ids[r] for r in ("p1", "d1", "w1", "w2")
    ]
    assert await redis.get(NEW.record("d1")) == DONE + "1-1" and 0 < await redis.ttl(NEW.record("d1")) <= 3600
    assert [entry_id for entry_id, _ in await stream_entries(redis, NEW.dlq)] == [ids["x1"], ids["x2"]]
    assert await redis.get(NEW.dlq_trimmed) == "3" and await redis.zcard(NEW.retry) == 2
    assert await redis.hgetall(NEW.owner) == {"stage": "team-a/s", "uid": ""}
    before, moved = await stream_entries(redis, NEW.audit)
    assert before[1]["detail"] == "before the move"
    assert moved[1]["actor"] == ME and moved[1]["action"] == "migrate" and recent(moved[1]["at"])
    assert moved[1]["detail"] == "moved 6 keys of stage s from the v1 names to namespace team-a"

    async with running_worker(redis_url, key_namespace="team-a") as worker:
        await wait_until(
            lambda: _processed(redis, {"p1", "w1", "w2", "r1"}), "the waiting, pending and due records processed"
        )
        await wait_until(lambda: drained(worker), "input drained")
    effects = await redis.hgetall("effects:s")
    assert effects == {"p1": "1", "w1": "1", "w2": "1", "r1": "1"}  # d1 not again: its marker moved first
    assert await redis.zcard(NEW.retry) == 1 and await redis.xlen(NEW.dlq) == 2


async def _processed(redis: aioredis.Redis, records: set[str]) -> bool:
    return set(await redis.hkeys("effects:s")) >= records


@pytest.mark.subprocess
async def test_refused_while_a_worker_of_the_stage_is_alive(redis: aioredis.Redis, redis_url: str) -> None:
    await _v1_stage(redis)
    v1_keys = await _keys(redis, "phoenix:s:*")
    # A worker still reading the v1 input (as a v1 worker does; it is told the name).
    async with running_worker(redis_url, input_queue=OLD.input, consumer_name="live-1", block_ms=100):
        await wait_until(lambda: _consumer_seen(redis, "live-1"), "the live worker in the group")
        done = await asyncio.to_thread(run_phoenix, redis_url, *MIGRATE, "--yes")
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"refused: consumer live-1 of group {GROUP} on phoenix:s:input was active ")
    assert line.endswith(
        " ms ago: a worker of stage s is alive; scale the stage to 0 (or stop its workers), wait 60 s and run "
        "again (nothing changed)"
    )
    assert await _keys(redis, "phoenix:{team-a}:*") == []
    assert set(await _keys(redis, "phoenix:s:*")) >= set(v1_keys)


async def _consumer_seen(redis: aioredis.Redis, name: str) -> bool:
    return name in {c["name"] for c in await redis.xinfo_consumers(OLD.input, GROUP)}


@pytest.mark.subprocess
async def test_refused_while_a_record_is_locked(redis: aioredis.Redis, redis_url: str) -> None:
    await _v1_stage(redis)
    await redis.set(OLD.record_prefix + "w1", LOCKED + "old-2:0123456789ab", ex=600)
    done = run_phoenix(redis_url, *MIGRATE, "--idle-ms", str(IDLE_MS), "--yes")
    assert done.returncode == 1 and done.stderr.splitlines() == [
        "refused: 1 record keys are locked (phoenix:s:record:w1 by old-2): a worker of stage s is processing, or "
        "was killed less than its LOCK_TIMEOUT ago; stop the workers and let the locks expire (or release them with "
        "phoenix unlock), then run again (nothing changed)"
    ]
    assert await _keys(redis, "phoenix:{team-a}:*") == []


@pytest.mark.subprocess
async def test_refused_when_the_stage_has_v2_keys_already(redis: aioredis.Redis, redis_url: str) -> None:
    await _v1_stage(redis)
    # A worker of the new version started before the move: its group on the v2 input.
    await redis.xgroup_create(NEW.input, GROUP, id="0", mkstream=True)
    why = (
        "phoenix:{team-a}:s:input already exists: stage s has keys in namespace team-a already (a worker or operator "
        "of the new version made them) and migrate never merges; stop what writes them and, if they hold nothing "
        "you need, delete phoenix:{team-a}:s:*, then run again"
    )
    assert _migrate(redis_url, "--dry-run")[-1] == f"would refuse: {why}; nothing changed"
    done = run_phoenix(redis_url, *MIGRATE, "--idle-ms", str(IDLE_MS), "--yes")
    assert done.returncode == 1 and done.stderr.splitlines() == [f"refused: {why} (nothing changed)"]
    assert await _keys(redis, "phoenix:{team-a}:*") == [NEW.input] and await redis.xlen(OLD.input) == 4


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_an_interrupted_move_is_finished_by_the_next_run(redis: aioredis.Redis, redis_url: str) -> None:
    ids = await _v1_stage(redis)
    raw = aioredis.Redis.from_url(redis_url)
    try:
        # Interrupted after the markers and the retry set: the rest is still under the v1 names.
        plan = await migrate.plan_migration(raw, "s", "team-a", alive_idle_ms=IDLE_MS)
        await migrate.begin(raw, plan)
        assert await migrate.move_records(raw, plan) == 1
        await raw.rename(OLD.retry, NEW.retry)
    finally:
        await raw.aclose()
    assert await redis.get(OLD.migrating) == "team-a"

    other = run_phoenix(redis_url, "migrate", "--service", "s", "--namespace", "team-b", "--yes")
    assert other.returncode == 1 and other.stderr.splitlines() == [
        "refused: a move of stage s to namespace team-a was interrupted: run phoenix migrate again with --namespace "
        "team-a to finish it (nothing changed)"
    ]
    assert _migrate(redis_url, "--dry-run")[0] == "would continue the interrupted move of stage s to namespace team-a"
    assert _migrate(redis_url, "--yes") == [
        "continued the interrupted move of stage s to namespace team-a",
        "moved the DLQ phoenix:s:dlq to phoenix:{team-a}:s:dlq",
        "moved the DLQ trimmed counter phoenix:s:dlq:trimmed to phoenix:{team-a}:s:dlq-trimmed",
        "moved the audit stream phoenix:s:audit to phoenix:{team-a}:s:audit",
        "moved the input stream (with its consumer groups and pending entries) phoenix:s:input to "
        "phoenix:{team-a}:s:input",
        "wrote the ownership marker phoenix:{team-a}:s:owner (stage team-a/s)",
        "migrated stage s to namespace team-a: start its workers of the new version",
    ]
    assert await _keys(redis, "phoenix:s:*") == []
    assert await redis.get(NEW.record("d1")) == DONE + "1-1" and await redis.hget(NEW.owner, "stage") == "team-a/s"
    assert [entry_id for entry_id, _ in await stream_entries(redis, NEW.dlq)] == [ids["x1"], ids["x2"]]
    assert _migrate(redis_url, "--yes") == [
        "nothing to migrate: stage s has no keys under the v1 names (phoenix:s:input, ...)"
    ]

    async with running_worker(redis_url, key_namespace="team-a") as worker:
        await wait_until(lambda: _processed(redis, {"p1", "w1", "w2", "r1"}), "every record processed")
        await wait_until(lambda: drained(worker), "input drained")
    assert await redis.hgetall("effects:s") == {"p1": "1", "w1": "1", "w2": "1", "r1": "1"}


@pytest.mark.subprocess
async def test_custom_input_and_dlq_keep_their_names(redis: aioredis.Redis, redis_url: str) -> None:
    await redis.xgroup_create("orders", GROUP, id="0", mkstream=True)
    await add_entry(redis, "orders", _entry("o1"))
    await add_entry(redis, "orders-dead", _entry("o2"))
    await redis.set("orders-dead:trimmed", 2)
    await redis.set(OLD.record_prefix + "o0", DONE + "1-1")
    args = ("--input", "orders", "--dlq", "orders-dead", "--yes")
    assert _migrate(redis_url, *args) == [
        "moved 1 record keys (locks and markers) phoenix:s:record:* to phoenix:{team-a}:s:record:*",
        "moved the DLQ trimmed counter orders-dead:trimmed to phoenix:{team-a}:s:dlq-trimmed",
        "kept the custom DLQ orders-dead as it is (only the names derived from the stage's name move)",
        "kept the custom input stream orders as it is (only the names derived from the stage's name move)",
        "wrote the ownership marker phoenix:{team-a}:s:owner (stage team-a/s)",
        "migrated stage s to namespace team-a: start its workers of the new version",
    ]
    assert await redis.xlen("orders") == 1 and await redis.xlen("orders-dead") == 1


@pytest.mark.subprocess
async def test_a_namespace_its_workers_would_refuse_stops_at_once(redis: aioredis.Redis, redis_url: str) -> None:
    await add_entry(redis, OLD.input, _entry("w1"))
    done = run_phoenix(redis_url, "migrate", "--service", "s", "--namespace", "Team_A", "--yes")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "phoenix migrate: --namespace: String should match pattern '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$'"
    ]
    assert await _keys(redis, "phoenix:s:*") == [OLD.input]
