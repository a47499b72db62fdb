"""The repairs that act on a stage (`dlq replay`, `reclaim`, `unlock --force`) look before they leap: `--dry-run`
prints what would be done and changes nothing, without a terminal they refuse unless `--yes`, and every repair
done is in the stage's audit stream (who, what, how many, when), shown by `phoenix audit` and `phoenix inspect`."""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import pty
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis

from phoenix.record_format import LOCKED
from phoenix.tools import audit as audit_log
from tests.fixtures.cli import run_phoenix
from tests.fixtures.records import locked, record_key
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, add

ME = f"{getpass.getuser()}@{socket.gethostname()}"
DEAD_LOCK = LOCKED + "dead-1:0123456789ab"


def ok(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def refused_without_yes(done: subprocess.CompletedProcess[str], question: str) -> None:
    """Exit 1 and one line saying so: the question, why it was not asked, and that nothing changed."""
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"{question} [y/N] refused: not a terminal; pass --yes to confirm (nothing changed)"
    ]


def audit(redis_url: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ok(run_phoenix(redis_url, "audit", "--service", "s", "--json"))]


def recent(at: str) -> bool:
    stamp = datetime.fromisoformat(at.replace("Z", "+00:00"))
    return timedelta(0) <= datetime.now(UTC) - stamp < timedelta(minutes=1)


async def _dead_letters(redis: aioredis.Redis, n: int) -> list[str]:
    fields = {"data": "{}", "error": "gone", "error_type": "RecordNotFoundError"}
    return [await add_entry(redis, DLQ, {"record_id": f"d{i}", **fields}) for i in range(n)]


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_dlq_replay_dry_run_refusal_and_audit(redis: aioredis.Redis, redis_url: str) -> None:
    ids = await _dead_letters(redis, 3)
    assert ok(run_phoenix(redis_url, "audit", "--service", "s")) == ["no repairs recorded in phoenix:{default}:s:audit"]

    dry = ok(run_phoenix(redis_url, "dlq", "replay", "--service", "s", "--count", "2", "--dry-run"))
    assert dry == [
        f"would move {ids[0]} (record d0, RecordNotFoundError)",
        f"would move {ids[1]} (record d1, RecordNotFoundError)",
        "would move 2 of the 3 entries of phoenix:{default}:s:dlq (oldest first) back to "
        "phoenix:{default}:s:input; nothing changed",
    ]
    refused_without_yes(
        run_phoenix(redis_url, "dlq", "replay", "--service", "s", "--count", "2"),
        "Move 2 of the 3 entries of phoenix:{default}:s:dlq (oldest first) back to phoenix:{default}:s:input?",
    )
    assert await redis.xlen(DLQ) == 3 and not await redis.exists(IN)
    assert audit(redis_url) == []  # nothing done, nothing recorded

    assert ok(run_phoenix(redis_url, "dlq", "replay", "--service", "s", "--count", "2", "--yes")) == [
        "moved 2 entries back to phoenix:{default}:s:input"
    ]
    assert [f["record_id"] for _, f in await stream_entries(redis, IN)] == ["d0", "d1"]
    [entry] = audit(redis_url)
    assert recent(entry.pop("at")) and entry.pop("entry_id")
    assert entry == {
        "actor": ME,
        "action": "dlq-replay",
        "count": 2,
        "detail": "moved 2 entries of phoenix:{default}:s:dlq back to phoenix:{default}:s:input",
        "record_id": "",
    }
    [line] = ok(run_phoenix(redis_url, "audit", "--service", "s"))
    assert line.endswith(
        f"  {ME}  dlq-replay (2): moved 2 entries of phoenix:{{default}}:s:dlq back to phoenix:{{default}}:s:input"
    )


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_dlq_replay_asks_on_a_terminal(redis: aioredis.Redis, redis_url: str) -> None:
    await _dead_letters(redis, 1)
    terminal, their_end = pty.openpty()
    try:
        asked = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "phoenix", "dlq", "replay", "--service", "s", "--redis-url", redis_url),
            stdin=their_end,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.write(terminal, b"y\n")
        out, err = await asyncio.wait_for(asked.communicate(), timeout=60)
    finally:
        os.close(their_end)
        os.close(terminal)
    assert asked.returncode == 0, err
    assert out.decode() == (
        "Move 1 of the 1 entries of phoenix:{default}:s:dlq (oldest first) back to phoenix:{default}:s:input? [y/N] "
        "moved 1 entries back to phoenix:{default}:s:input\n"
    )
    assert await redis.xlen(DLQ) == 0
    assert [e["action"] for e in audit(redis_url)] == ["dlq-replay"]


@pytest.mark.timeout(180)
@pytest.mark.subprocess
async def test_reclaim_and_forced_unlock_dry_run_refusal_and_audit(redis: aioredis.Redis, redis_url: str) -> None:
    """An entry delivered to consumer dead-1, which holds the record's lock; dead-1 is recent, so it looks alive."""
    await redis.xgroup_create(IN, KEYS.consumer_group, id="0", mkstream=True)
    entry = await add(redis, "a")
    await redis.xreadgroup(KEYS.consumer_group, "dead-1", {IN: ">"}, count=1)
    await redis.set(record_key("s", "a"), DEAD_LOCK)

    # unlock: a dry run says what it would do, with and without --force.
    [would_refuse] = ok(run_phoenix(redis_url, "unlock", "--service", "s", "a", "--dry-run"))
    assert would_refuse.startswith("would refuse: phoenix:{default}:s:record:a is held by dead-1 (idle ")
    assert would_refuse.endswith("), which is alive; nothing changed")
    [would_release] = ok(run_phoenix(redis_url, "unlock", "--service", "s", "a", "--force", "--dry-run"))
    assert would_release.startswith("would release phoenix:{default}:s:record:a held by dead-1 (idle ")
    forced = run_phoenix(redis_url, "unlock", "--service", "s", "a", "--force")
    question = forced.stderr.split(" [y/N]")[0]
    assert question.startswith("Release phoenix:{default}:s:record:a held by dead-1 (idle ")
    refused_without_yes(forced, question)
    assert await redis.get(record_key("s", "a")) == DEAD_LOCK

    # reclaim: the same.
    dry = ok(run_phoenix(redis_url, "reclaim", "--service", "s", "--idle-ms", "0", "--dry-run"))
    assert dry[0].startswith(f"would re-enqueue {entry} (record a, dead-1, idle ")
    assert dry[0].endswith(", 1 deliveries); release its lock")
    assert dry[1] == "would reclaim 1 of 1 entries idle over 0 ms in phoenix:{default}:s:input; nothing changed"
    refused_without_yes(
        run_phoenix(redis_url, "reclaim", "--service", "s", "--idle-ms", "0"),
        "Re-enqueue 1 entries idle over 0 ms in phoenix:{default}:s:input?",
    )
    assert [row["message_id"] for row in await redis.xpending_range(IN, KEYS.consumer_group, "-", "+", 10)] == [entry]
    assert await redis.xlen(IN) == 1 and await redis.get(record_key("s", "a")) == DEAD_LOCK
    assert audit(redis_url) == []

    # Confirmed: done, and recorded.
    [released] = ok(run_phoenix(redis_url, "unlock", "--service", "s", "a", "--force", "--yes"))
    assert released.startswith("released phoenix:{default}:s:record:a held by dead-1 (idle ")
    assert not await locked(redis, "s", "a")
    reclaimed = ok(run_phoenix(redis_url, "reclaim", "--service", "s", "--idle-ms", "0", "--yes"))
    assert reclaimed[-1] == "reclaimed 1 of 1 entries idle over 0 ms in phoenix:{default}:s:input"
    assert await redis.xlen(IN) == 2

    unlocked, moved = audit(redis_url)
    assert (unlocked["actor"], unlocked["action"], unlocked["count"], unlocked["record_id"]) == (ME, "unlock", 1, "a")
    assert unlocked["detail"].startswith("released phoenix:{default}:s:record:a held by dead-1 (idle ")
    assert unlocked["detail"].endswith(", forced")
    assert (moved["actor"], moved["action"], moved["count"]) == (ME, "reclaim", 1)
    assert moved["detail"] == "re-enqueued 1 entries idle over 0 ms in phoenix:{default}:s:input"
    assert all(recent(e["at"]) for e in (unlocked, moved))

    # inspect shows the repairs that named the record.
    report = ok(run_phoenix(redis_url, "inspect", "--service", "s", "a"))
    assert report[-2] == "repairs:"
    assert report[-1].endswith(f"  {ME}  unlock (1): {unlocked['detail']}")
    as_json = json.loads(ok(run_phoenix(redis_url, "inspect", "--service", "s", "a", "--json"))[0])
    assert [r["action"] for r in as_json["repairs"]] == ["unlock"]


async def test_the_audit_stream_is_capped(redis: aioredis.Redis) -> None:
    pipe = redis.pipeline(transaction=False)
    for i in range(audit_log.AUDIT_MAXLEN + 500):
        pipe.xadd(KEYS.audit, {"action": "x", "count": str(i)})
    await pipe.execute()
    await audit_log.record(redis, KEYS.audit, audit_log.Repair(ME, "unlock", 1, "released", "r"))
    # Trimmed by whole nodes (MAXLEN ~): no more than one node (100 entries by default) over the cap.
    assert audit_log.AUDIT_MAXLEN <= await redis.xlen(KEYS.audit) <= audit_log.AUDIT_MAXLEN + 100
    [newest] = await audit_log.recent(redis, KEYS.audit, 1)
    assert (newest.action, newest.record_id) == ("unlock", "r")
