"""docs/operations.md's troubleshooting tree, followed literally: each section's state is produced with real worker
processes and a real Valkey, then its marked command blocks run in bash and print what the document shows.

The substitutions are the ones a reader makes: their Redis in REDIS_URL, and their stage's CLAIM_IDLE_MS passed to
the commands that judge whether a worker is dead (here the workers use 2 s, so the test need not wait 5 minutes).
In a documented output, a line `...` stands for any lines, and `...` inside a line for any text; runs of spaces
compare equal, so column widths may differ.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.fixtures.docs import marked_block
from tests.fixtures.eventually import wait_until
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.records import committed, locked
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.workers import WorkerPool

OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
BIN = Path(sys.executable).parent
IN, OUT, DLQ, RETRY = (
    "phoenix:{default}:router:input",
    "phoenix:{default}:parser:input",
    "phoenix:{default}:router:dlq",
    "phoenix:{default}:router:retry",
)
CLAIM_IDLE_MS = "2000"
# Long enough that the dead worker's lock is still there when the documented commands run.
STAGE = {"OUTPUT_QUEUE": OUT, "CLAIM_IDLE_MS": CLAIM_IDLE_MS, "LOCK_TIMEOUT": "120"}
# The reader's substitution: the stage's CLAIM_IDLE_MS for the commands that take it.
_PRELUDE = f"""phoenix() {{
  case "$1" in
    inspect|unlock|reclaim) command phoenix "$@" --claim-idle-ms {CLAIM_IDLE_MS} ;;
    *) command phoenix "$@" ;;
  esac
}}
"""


def run_documented(marker: str, redis_url: str, cwd: Path) -> str:
    """Run the block in bash as a reader would and check its output against the block `{marker} output`."""
    _, code = marked_block(marker, OPERATIONS)
    env = {**os.environ, "REDIS_URL": redis_url, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _PRELUDE + code],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{marker} failed:\n{done.stdout}"
    _, expected = marked_block(f"{marker} output", OPERATIONS)
    assert matches(expected, done.stdout), f"{marker} printed:\n{done.stdout}\ndocumented:\n{expected}"
    return done.stdout


def matches(documented: str, printed: str) -> bool:
    def line_pattern(line: str) -> str:
        if line.strip() == "...":
            return r"(?:[^\n]*\n)*?"
        parts = [re.escape(re.sub(r" +", " ", part)) for part in line.split("...")]
        return ".*?".join(parts) + r"\n"

    pattern = "".join(line_pattern(line) for line in documented.splitlines())
    normalized = "".join(re.sub(r" +", " ", line).rstrip() + "\n" for line in printed.splitlines())
    return re.fullmatch(pattern, normalized, re.DOTALL) is not None


def test_output_patterns() -> None:
    assert matches("a ... c\n...\nz\n", "a  b c\nx\ny\nz\n")
    assert not matches("a ... c\nz\n", "a b c\nx\nz\n")


async def add(redis: aioredis.Redis, record_id: str, **data: str) -> str:
    return await add_entry(redis, IN, {"record_id": record_id, "user_id": "u1", "data": json.dumps(data)})


async def _consumers_idle_over(redis: aioredis.Redis, ms: int) -> bool:
    consumers = await redis.xinfo_consumers(IN, "router-group")
    return bool(consumers) and all(int(c["idle"]) > ms for c in consumers)


@pytest.mark.timeout(120)
async def test_messages_not_processed(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool, tmp_path: Path
) -> None:
    await add(redis, "r-17", action="crash-before")
    worker = workers.start("router", **STAGE)
    await wait_until(worker.exited, "the worker killed while holding r-17")
    await wait_until(lambda: _consumers_idle_over(redis, int(CLAIM_IDLE_MS)), "the dead consumer past CLAIM_IDLE_MS")
    run_documented("not-processed status", redis_url, tmp_path)
    run_documented("not-processed inspect", redis_url, tmp_path)
    run_documented("not-processed fix", redis_url, tmp_path)
    workers.start("router", **STAGE)
    await wait_until(lambda: committed(redis, "router", "r-17"), "r-17 processed by the next worker")


@pytest.mark.timeout(60)
async def test_duplicates(redis: aioredis.Redis, redis_url: str, workers: WorkerPool, tmp_path: Path) -> None:
    await add(redis, "r-17")
    # The documented output lists both input entries: the trimmer (every second by default) would remove the
    # first one, acknowledged by then, before a slow machine has started `phoenix inspect`.
    workers.start("router", **STAGE, TRIM_INTERVAL="3600")
    await wait_until(lambda: committed(redis, "router", "r-17"), "r-17 committed")
    await add(redis, "r-17")  # delivered again: skipped as a duplicate
    await wait_until(lambda: _drained(redis, 2), "the duplicate acknowledged")
    run_documented("duplicates inspect", redis_url, tmp_path)
    run_documented("duplicates reprocess", redis_url, tmp_path)
    await wait_until(lambda: _forwarded(redis, 2), "r-17 processed a second time")


@pytest.mark.timeout(90)
async def test_dlq_growing(redis: aioredis.Redis, redis_url: str, workers: WorkerPool, tmp_path: Path) -> None:
    for record in ("r-20", "r-21", "r-22"):
        await add(redis, record, action="missing")
    worker = workers.start("router", **STAGE)
    await wait_until(lambda: _length(redis, DLQ, 3), "three dead letters")
    worker.stop()  # the cause is "fixed" by replaying into a stage nobody reads right now
    run_documented("dlq list", redis_url, tmp_path)
    run_documented("dlq replay", redis_url, tmp_path)
    run_documented("dlq purge", redis_url, tmp_path)
    assert await redis.xlen(DLQ) == 0
    exported = [json.loads(line) for line in (tmp_path / "router-dlq.jsonl").read_text().splitlines()]
    assert [e["record_id"] for e in exported] == ["r-21", "r-22"]
    assert (await stream_entries(redis, IN))[-1][1]["record_id"] == "r-20"  # replayed


@pytest.mark.timeout(60)
async def test_high_latency(redis: aioredis.Redis, redis_url: str, workers: WorkerPool, tmp_path: Path) -> None:
    await add(redis, "r-1", action="sleep:60")
    for record in ("r-2", "r-3", "r-4"):
        await add(redis, record)
    workers.start("router", CONCURRENCY="1", **STAGE)
    await wait_until(lambda: locked(redis, "router", "r-1"), "the slow record in flight")
    run_documented("latency status", redis_url, tmp_path)


async def test_circuit_open(redis: aioredis.Redis, redis_url: str, workers: WorkerPool, tmp_path: Path) -> None:
    await redis.set("dependency-down:router", 1)
    await add(redis, "r-30")
    workers.start("router", CIRCUIT_FAILURE_THRESHOLD="1", RETRY_BASE_SECONDS="120", RETRY_MAX_SECONDS="120", **STAGE)
    await wait_until(lambda: redis.zcard(RETRY), "r-30 waiting for its retry")
    run_documented("circuit inspect", redis_url, tmp_path)


@pytest.mark.parametrize("billing_port", [free_loopback_port()])
async def test_billing_failures(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool, tmp_path: Path, billing_port: int
) -> None:
    await add(redis, "r-40")
    workers.start(
        "router",
        BILLING_URL=f"http://127.0.0.1:{billing_port}",
        BILLING_MASTER_KEY="sk-master",
        RETRY_BASE_SECONDS="120",
        RETRY_MAX_SECONDS="120",
        **STAGE,
    )  # nothing listens on that port
    await wait_until(lambda: redis.zcard(RETRY), "r-40 waiting for its retry")
    out = run_documented("billing inspect", redis_url, tmp_path)
    assert "sk-master" not in out


async def _drained(redis: aioredis.Redis, acknowledged: int) -> bool:
    groups = await redis.xinfo_groups(IN)
    return groups[0]["lag"] == 0 and groups[0]["pending"] == 0 and await redis.xlen(IN) == acknowledged


async def _forwarded(redis: aioredis.Redis, n: int) -> bool:
    return await redis.xlen(OUT) == n


async def _length(redis: aioredis.Redis, stream: str, n: int) -> bool:
    return await redis.xlen(stream) == n
