"""KEDA on partitioned stages and Redis Cluster (pure builders): one lag / pending / retry trigger per partition,
summed by KEDA's scalingModifiers formula; a stage of one partition keeps its unnamed triggers and no formula."""

from __future__ import annotations

from typing import Any

import pytest

from phoenix.keys import StageKeys
from phoenix.operator.builders import (
    AutoscalingConfigError,
    build_scaled_object,
    redis_connection,
    scaled_object_patch,
)
from phoenix.operator.builders.keda import MAX_AUTOSCALED_PARTITIONS
from phoenix.operator.stage.children import _present
from phoenix.operator.stage.drift import differences
from phoenix.redis_spec import RedisSpec
from tests.test_builders import OWNER, REDIS_WITH_PASSWORD, connection_of, make_spec


def scaled(**changes: Any) -> dict[str, Any]:
    spec = make_spec(redis=REDIS_WITH_PASSWORD, **changes)
    return build_scaled_object(OWNER, spec, connection_of("redis://:pw@redis.docs:6380/3"))


def test_a_partitioned_stage_has_the_three_triggers_per_partition_each_named() -> None:
    body = scaled(partitions=4, autoscaling={"lagCount": 25, "activationLagCount": 2}, worker={"concurrency": 16})[
        "spec"
    ]
    lanes = StageKeys.for_stage("parser", "docs", partitions=4).lanes
    connection = {"address": "redis.docs:6380", "databaseIndex": "3", "enableTLS": "false"}
    auth = {"authenticationRef": {"name": "parser-redis"}}
    expected = []
    for p, lane in enumerate(lanes):
        group = {"stream": lane.input, "consumerGroup": "parser-group"}
        expected += [
            {
                "type": "redis-streams",
                "name": f"lag{p}",
                "metadata": {**connection, **group, "lagCount": "25", "activationLagCount": "2"},
                **auth,
            },
            {
                "type": "redis-streams",
                "name": f"pending{p}",
                "metadata": {**connection, **group, "pendingEntriesCount": "16"},
                **auth,
            },
            {
                "type": "redis",
                "name": f"retry{p}",
                "metadata": {**connection, "listName": lane.retry, "listLength": "1000000000"},
                **auth,
            },
        ]
    assert body["triggers"] == expected
    assert lanes[2].input == "phoenix:{docs~2}:parser:input" and lanes[2].retry == "phoenix:{docs~2}:parser:retry"


def test_the_formula_sums_the_partitions_as_one_partitions_triggers_would_count() -> None:
    """KEDA gives the HPA the formula's value alone (target 1 per pod) and decides activity on it alone: so it says
    what the unnamed triggers say, on the sums (one pod per lagCount of total lag, per CONCURRENCY of total pending,
    at least one while lag is above activationLagCount or anything is pending or waiting to retry)."""
    body = scaled(partitions=3, autoscaling={"lagCount": 25, "activationLagCount": 2}, worker={"concurrency": 16})[
        "spec"
    ]
    lag, pending, retry = (f"sum([{kind}0, {kind}1, {kind}2])" for kind in ("lag", "pending", "retry"))
    assert body["advanced"] == {
        "scalingModifiers": {
            "formula": f"({lag} > 2 || {pending} + {retry} > 0) ? max(ceil({lag} / 25), ceil({pending} / 16), 1) : 0",
            "target": "1",
        }
    }
    # Every variable of the formula is a trigger's name (KEDA rejects a formula naming an unknown trigger).
    names = {trigger["name"] for trigger in body["triggers"]}
    assert names == {f"{kind}{p}" for kind in ("lag", "pending", "retry") for p in range(3)}


def test_one_partition_keeps_todays_unnamed_triggers_and_no_formula() -> None:
    body = scaled(partitions=1)["spec"]
    assert "advanced" not in body
    assert [t["type"] for t in body["triggers"]] == ["redis-streams", "redis-streams", "redis"]
    assert all("name" not in t for t in body["triggers"])


def test_sentinel_partitions_use_the_sentinel_triggers() -> None:
    spec = make_spec(
        partitions=2,
        redis={**REDIS_WITH_PASSWORD, "mode": "sentinel", "sentinel": {"masterName": "mymaster"}},
    )
    url = "redis://:pw@sentinel-0:26379,sentinel-1:26379/0"
    connection = redis_connection(RedisSpec.from_url(url, mode="sentinel", sentinel_master="mymaster"))
    triggers = build_scaled_object(OWNER, spec, connection)["spec"]["triggers"]
    assert [t["type"] for t in triggers] == ["redis-sentinel-streams", "redis-sentinel-streams", "redis-sentinel"] * 2
    assert {t["metadata"]["sentinelMaster"] for t in triggers} == {"mymaster"}


def test_too_many_partitions_for_keda_is_a_clear_error() -> None:
    with pytest.raises(AutoscalingConfigError, match=f"spec.partitions {MAX_AUTOSCALED_PARTITIONS + 1}"):
        scaled(partitions=MAX_AUTOSCALED_PARTITIONS + 1)
    assert len(scaled(partitions=MAX_AUTOSCALED_PARTITIONS)["spec"]["triggers"]) == 3 * MAX_AUTOSCALED_PARTITIONS


def test_the_patch_removes_the_formula_of_a_stage_back_to_one_partition_and_a_create_carries_no_nulls() -> None:
    """A merge patch keeps what it does not null: a stage from 4 partitions back to 1 would keep a formula over
    triggers that are gone (KEDA would fail to evaluate it). The create of a new object leaves the nulls out."""
    four, one = scaled_object_patch(scaled(partitions=4)), scaled_object_patch(scaled(partitions=1))
    assert one["spec"]["advanced"] == {"scalingModifiers": None, "horizontalPodAutoscalerConfig": None}
    assert sorted(differences(one, four)) == ["spec.advanced.scalingModifiers", "spec.triggers"]
    assert differences(one, scaled(partitions=1)) == []  # a live object without a formula is no drift
    created = _present(one)
    assert "advanced" not in created["spec"] and "annotations" not in created["metadata"]
    assert created["spec"]["triggers"] == one["spec"]["triggers"]
    assert _present(four)["spec"]["advanced"] == {"scalingModifiers": four["spec"]["advanced"]["scalingModifiers"]}


def test_cluster_partitions_use_the_cluster_triggers_through_the_seed_nodes() -> None:
    """KEDA's redis-cluster-streams and redis-cluster scalers reach every shard from the seeds (`addresses`) and
    take no database index (a cluster has database 0 only); TLS and the ACL user as in the other modes."""
    spec = make_spec(partitions=2, redis={**REDIS_WITH_PASSWORD, "mode": "cluster"})
    url = "rediss://app:pw@valkey-0.valkey:6379,valkey-1.valkey:6379,valkey-2.valkey:6379/0"
    connection = redis_connection(RedisSpec.from_url(url, mode="cluster"))
    scaled_object = build_scaled_object(OWNER, spec, connection)["spec"]
    triggers = scaled_object["triggers"]
    assert [t["type"] for t in triggers] == ["redis-cluster-streams", "redis-cluster-streams", "redis-cluster"] * 2
    seeds = {"addresses": "valkey-0.valkey:6379,valkey-1.valkey:6379,valkey-2.valkey:6379"}
    for trigger in triggers:
        assert {**seeds, "enableTLS": "true", "username": "app"}.items() <= trigger["metadata"].items()
        assert "databaseIndex" not in trigger["metadata"] and "address" not in trigger["metadata"]
        assert trigger["authenticationRef"] == {"name": "parser-redis"}
    assert [t["metadata"].get("stream", t["metadata"].get("listName")) for t in triggers] == [
        "phoenix:{docs~0}:parser:input",
        "phoenix:{docs~0}:parser:input",
        "phoenix:{docs~0}:parser:retry",
        "phoenix:{docs~1}:parser:input",
        "phoenix:{docs~1}:parser:input",
        "phoenix:{docs~1}:parser:retry",
    ]
    assert "sum([lag0, lag1])" in scaled_object["advanced"]["scalingModifiers"]["formula"]
    # One partition on a cluster: today's three unnamed triggers, of the cluster kind, and no formula.
    one = build_scaled_object(OWNER, make_spec(redis={**REDIS_WITH_PASSWORD, "mode": "cluster"}), connection)["spec"]
    assert [t["type"] for t in one["triggers"]] == ["redis-cluster-streams", "redis-cluster-streams", "redis-cluster"]
    assert "advanced" not in one and all("name" not in t for t in one["triggers"])
