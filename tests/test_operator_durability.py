"""The Backpressure, RedisRisk, OutputUnread and QueueFiguresDisagree conditions: pure builders, fed by what the
workers and the server report."""

from __future__ import annotations

import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.operator.stage.refresh import queue_status
from phoenix.operator.status.durability import (
    backpressure_condition,
    output_unread_condition,
    queue_figures_condition,
    redis_risk_condition,
)
from phoenix.operator.status.readiness import ready_condition
from phoenix.operator.status.writer import merged_status
from phoenix.tools.queue_stats import collect
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
    stage = StageKeys.for_stage("a")
    [before] = await collect(redis, [stage])
    assert before.backpressure is None
    await redis.set(
        StageKeys.for_stage("a").backpressure, 123_456, ex=5
    )  # as Backpressure.measure writes it while paused
    [after] = await collect(redis, [stage])
    assert after.backpressure == 123_456


def test_output_unread_condition_names_the_stream_and_what_follows() -> None:
    stops = output_unread_condition("sink:results", True, None, generation=2).to_k8s()
    assert (stops["type"], stops["status"], stops["reason"]) == ("OutputUnread", "True", "NoConsumerGroup")
    assert "sink:results" in stops["message"] and "OUTPUT_HIGH_WATER" in stops["message"]
    assert "spec.output.retention" in stops["message"] and stops["observedGeneration"] == 2
    kept = output_unread_condition("sink:results", True, "maxlen:1000")
    assert (kept.status, kept.reason) == ("True", "RetentionApplies") and "maxlen:1000" in kept.message
    read = output_unread_condition("sink:results", False, "maxlen:1000")
    assert (read.status, read.reason) == ("False", "ReadByConsumerGroup")
    assert (output_unread_condition(None, False, None).reason) == "NoOutput"


async def test_collect_tells_whether_a_group_reads_the_output(redis: aioredis.Redis) -> None:
    final = StageKeys.for_stage("a")
    feeding = StageKeys.for_stage("a", output="sink:results")
    missing, final_stats = await collect(redis, [feeding, final])
    assert (missing.output_unread, final_stats.output_unread) == (True, None)  # no stream yet: nobody reads it
    await redis.xadd("sink:results", {"record_id": "r1"})
    [unread] = await collect(redis, [feeding])
    assert unread.output_unread is True
    await redis.xgroup_create("sink:results", "reader", id="0")
    [read] = await collect(redis, [feeding])
    assert read.output_unread is False


async def test_an_xdel_makes_the_figures_disagree_and_the_unknown_lag_leaves_the_status(redis: aioredis.Redis) -> None:
    stage = StageKeys.for_stage("s")
    ids = [await redis.xadd(stage.input, {"record_id": f"r{i}"}) for i in range(4)]
    await redis.xgroup_create(stage.input, stage.consumer_group, id="0")
    await redis.xreadgroup(stage.consumer_group, "c1", {stage.input: ">"}, count=1)
    (agreeing,) = await collect(redis, [stage])
    assert queue_figures_condition(agreeing.disagreements).to_k8s()["reason"] == "FiguresAgree"
    await redis.xdel(stage.input, ids[2])
    (stats,) = await collect(redis, [stage])
    found = queue_figures_condition(stats.disagreements, generation=2).to_k8s()
    assert (found["status"], found["reason"], found["observedGeneration"]) == ("True", "LagUnknown", 2)
    assert "reports lag null" in found["message"]
    # The lag sampled before (3) is removed by the merge patch, not left standing beside the condition.
    assert queue_status(agreeing)["lag"] == 3 and queue_status(stats)["lag"] is None
    # Figures that disagree are no failure of the stage: Ready does not depend on them.
    status = merged_status({}, {}, [queue_figures_condition(stats.disagreements)], None, None)
    assert ready_condition(status["conditions"], None).reason == "Reconciling"
