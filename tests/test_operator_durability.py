"""The Backpressure and RedisRisk conditions: pure builders, fed by what the workers and the server report."""

from __future__ import annotations

import redis.asyncio as aioredis

from phoenix.keys import backpressure_key
from phoenix.operator.status.durability import backpressure_condition, redis_risk_condition
from phoenix.operator.status.readiness import ready_condition
from phoenix.operator.status.writer import merged_status
from phoenix.worker_runtime.queue_stats import StageQueues, collect
from phoenix.worker_runtime.redis_risk import RedisRisk, assess_redis


def test_backpressure_condition_names_the_figure_and_leaves_ready_alone() -> None:
    paused = backpressure_condition(120_000, generation=3).to_k8s()
    assert (paused["type"], paused["status"], paused["reason"]) == ("Backpressure", "True", "OutputOverHighWater")
    assert "120000 unfinished entries" in paused["message"] and paused["observedGeneration"] == 3
    reading = backpressure_condition(None).to_k8s()
    assert (reading["status"], reading["reason"]) == ("False", "OutputBelowHighWater")
    # A throttled stage is healthy: it waits for the next one, so Ready does not depend on it.
    status = merged_status({}, {}, [backpressure_condition(120_000)], None, None)
    assert ready_condition(status["conditions"], None).reason == "Reconciling"


def test_redis_risk_condition_per_finding() -> None:
    safe = RedisRisk(True, (), "maxmemory-policy=noeviction, appendonly=yes")
    risky = RedisRisk(True, ("no persistence (appendonly no, no save points): a restart empties every stream",), "")
    unknown = RedisRisk(False, (), "CONFIG GET or INFO refused: NOPERM")
    assert [(c.status, c.reason) for c in map(redis_risk_condition, (safe, risky, unknown))] == [
        ("False", "Durable"),
        ("True", "DataLossPossible"),
        ("Unknown", "CannotCheck"),
    ]
    assert "no persistence" in redis_risk_condition(risky).message
    assert "could not be checked" in redis_risk_condition(unknown).message


async def test_the_session_valkey_without_persistence_is_named(redis: aioredis.Redis) -> None:
    """The tests' Valkey keeps nothing on disk (save "", appendonly no): exactly what the check must name."""
    risk = await assess_redis(redis)
    assert risk.checked
    config = await redis.config_get("*")
    no_persistence = config["appendonly"] == "no" and not config["save"]
    assert any(p.startswith("no persistence") for p in risk.problems) == no_persistence, risk
    assert f"maxmemory-policy={config['maxmemory-policy']}" in risk.settings


async def test_collect_reads_what_a_paused_worker_reports(redis: aioredis.Redis) -> None:
    stage = StageQueues("a", "phoenix:a:input", "a-group", "phoenix:a:dlq")
    [before] = await collect(redis, [stage])
    assert before.backpressure is None
    await redis.set(backpressure_key("a"), 123_456, ex=5)  # as Backpressure.measure writes it while paused
    [after] = await collect(redis, [stage])
    assert after.backpressure == 123_456
