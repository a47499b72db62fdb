"""`phoenix trace`: a record's state in each stage of a pipeline, from Redis, with real workers on Valkey."""

from __future__ import annotations

import json
import re

import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.producer import Producer
from tests.fixtures.cli import phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.records import committed
from tests.fixtures.workers import WorkerPool

A, B, C = (StageKeys.for_stage(name) for name in "abc")
STAGES = ("--stage", "a", "--stage", "b", "--stage", "c")
TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00"


def _trace(redis_url: str, record_id: str) -> list[str]:
    return phoenix(redis_url, "trace", record_id, "--pipeline", "docs", *STAGES).splitlines()


def _matches(lines: list[str], patterns: list[str]) -> None:
    assert len(lines) == len(patterns), lines
    for line, pattern in zip(lines, patterns, strict=True):
        assert re.fullmatch(pattern, line), f"{line!r} !~ {pattern!r}"


async def test_trace_shows_each_stage_s_state_and_where_the_record_is(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    # a -> b -> c; a's retries wait a minute, so a failing record is seen waiting for its next attempt.
    workers.start("a", OUTPUT_QUEUE=B.input, RETRY_BASE_SECONDS="60", RETRY_MAX_SECONDS="60")
    workers.start("b", OUTPUT_QUEUE=C.input)
    last = workers.start("c")
    producer = Producer(redis, "a")
    await producer.send("lost", {"action": "missing-at:c"})
    await producer.send("flaky", {"action": "fail"})
    await wait_until(lambda: redis.xlen(C.dlq), "lost dead-lettered at c", 30)
    await wait_until(lambda: redis.zcard(A.retry), "flaky waiting for its retry at a", 30)

    _matches(
        _trace(redis_url, "lost"),
        [
            "record lost in pipeline docs",
            f"  a  committed at {TIME}",
            f"  b  committed at {TIME}",
            r"  c  dead-lettered at \S+: RecordNotFoundError: record lost does not exist",
            r"now: c: dead-lettered at \S+: RecordNotFoundError: record lost does not exist",
        ],
    )
    _matches(
        _trace(redis_url, "flaky"),
        [
            "record flaky in pipeline docs",
            rf"  a  retrying: failed 1 times, next at {TIME} \(last error: RuntimeError: transient failure\)",
            "  b  not seen",
            "  c  not seen",
            rf"now: a: retrying: failed 1 times, next at {TIME} \(last error: RuntimeError: transient failure\)",
        ],
    )

    # With c stopped, a record goes through a and b and waits in c's input.
    last.stop()
    await producer.send("queued", {})
    await wait_until(lambda: committed(redis, "b", "queued"), "queued through b", 30)
    _matches(
        _trace(redis_url, "queued"),
        [
            "record queued in pipeline docs",
            f"  a  committed at {TIME}",
            f"  b  committed at {TIME}",
            rf"  c  waiting since {TIME} \(\d+\.\d s\)",
            rf"now: c: waiting since {TIME} \(\d+\.\d s\)",
        ],
    )
    _matches(
        _trace(redis_url, "never-sent"),
        [
            "record never-sent in pipeline docs",
            "  a  not seen",
            "  b  not seen",
            "  c  not seen",
            "now: no stage of the pipeline has seen never-sent",
        ],
    )

    found = json.loads(phoenix(redis_url, "trace", "lost", "--pipeline", "docs", *STAGES, "--json"))
    assert [(s["stage"], s["state"]) for s in found["stages"]] == [
        ("a", "committed"),
        ("b", "committed"),
        ("c", "dead-lettered"),
    ]
    assert found["position"] == "c" and found["now"].startswith("c: dead-lettered at ")
    assert found["stages"][2]["report"]["dead_letters"][0]["error_type"] == "RecordNotFoundError"
