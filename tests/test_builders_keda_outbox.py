"""KEDA counts the outboxes of a stage's relayed hops (pure builders): a lane whose commits forward through its
outbox (worker_runtime/lanes.py decides which) gets a wake-only streamLength trigger on it, summed into the
formula, so results waiting there wake a stage at zero; a stage whose hops are all atomic gets none."""

from __future__ import annotations

from typing import Any

import pytest

from phoenix.crds import PhoenixStageSpec
from phoenix.keys import StageKeys
from phoenix.operator.builders import build_deployment, build_scaled_object, redis_connection
from phoenix.operator.builders.keda import WAKE_ONLY_TARGET
from phoenix.redis_spec import RedisSpec
from phoenix.worker_runtime import lanes
from phoenix.worker_runtime.settings import WorkerSettings
from tests.test_builders import OWNER, REDIS_WITH_PASSWORD, container, make_spec

URLS = {
    "standalone": "redis://:pw@redis.docs:6379/0",
    "sentinel": "redis://:pw@sentinel-0:26379,sentinel-1:26379/0",
    "cluster": "redis://:pw@valkey-0:6379,valkey-1:6379,valkey-2:6379/0",
}
# spec.output of each case, and the next stage's partitions (OUTPUT_PARTITIONS) where it is a stage.
OUTPUTS: dict[str, tuple[dict[str, str], int]] = {
    "a plain stream": ({"stream": "results"}, 1),
    "a stage of one partition": ({"stage": "next"}, 1),
    "a stage of as many partitions": ({"stage": "next"}, 4),
    "a stage of another count": ({"stage": "next"}, 2),
    "another namespace's stage": ({"stream": "phoenix:{other}:next:input"}, 1),
}


def stage_spec(mode: str, partitions: int, output: dict[str, str] | None) -> PhoenixStageSpec:
    sentinel = {"sentinel": {"masterName": "mymaster"}} if mode == "sentinel" else {}
    return make_spec(partitions=partitions, redis={**REDIS_WITH_PASSWORD, "mode": mode, **sentinel}, output=output)


def scaled(mode: str, partitions: int, output: dict[str, str] | None, output_partitions: int = 1) -> dict[str, Any]:
    spec = stage_spec(mode, partitions, output)
    master = {"sentinel_master": "mymaster"} if mode == "sentinel" else {}
    connection = redis_connection(RedisSpec.from_url(URLS[mode], mode=mode, **master))
    return build_scaled_object(OWNER, spec, connection, output_partitions)["spec"]


def outbox_triggers(scaled_object: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in scaled_object["triggers"] if t["metadata"].get("stream", "").endswith(":outbox")]


def test_a_cluster_stage_forwarding_to_another_slot_counts_each_partitions_outbox_in_the_formula() -> None:
    body = scaled("cluster", 4, {"stream": "results"})
    lanes_of = StageKeys.for_stage("parser", "docs", partitions=4).lanes
    seeds = {"addresses": "valkey-0:6379,valkey-1:6379,valkey-2:6379", "enableTLS": "false"}
    assert outbox_triggers(body) == [
        {
            "type": "redis-cluster-streams",
            "name": f"outbox{p}",
            # No consumerGroup: KEDA measures XLEN (what waits: a relayed entry is deleted), active from one entry.
            "metadata": {
                **seeds,
                "stream": lane.outbox,
                "streamLength": str(WAKE_ONLY_TARGET),
                "activationLagCount": "0",
            },
            "authenticationRef": {"name": "parser-redis"},
        }
        for p, lane in enumerate(lanes_of)
    ]
    assert lanes_of[3].outbox == "phoenix:{docs~3}:parser:outbox"
    lag, pending, retry, outbox = (f"sum([{k}0, {k}1, {k}2, {k}3])" for k in ("lag", "pending", "retry", "outbox"))
    assert body["advanced"]["scalingModifiers"] == {
        "formula": f"({lag} > 0 || {pending} + {retry} + {outbox} > 0) ? max(ceil({lag} / 10), ceil({pending} / 1), 1)"
        " : 0",
        "target": "1",
    }
    # Every variable of the formula is a trigger's name (KEDA rejects a formula naming an unknown trigger).
    assert {t["name"] for t in body["triggers"]} == {
        f"{kind}{p}" for kind in ("lag", "pending", "retry", "outbox") for p in range(4)
    }


def test_one_partition_on_a_cluster_relayed_to_another_namespace_gets_a_fourth_unnamed_trigger() -> None:
    body = scaled("cluster", 1, {"stream": "phoenix:{other}:next:input"})
    assert "advanced" not in body
    assert [(t["type"], t["metadata"].get("stream")) for t in body["triggers"]][3:] == [
        ("redis-cluster-streams", "phoenix:{docs}:parser:outbox")
    ]
    assert all("name" not in t for t in body["triggers"])
    # The next stage of its namespace shares its slot: the hop is atomic, the outbox never written.
    assert outbox_triggers(scaled("cluster", 1, {"stage": "next"})) == []


@pytest.mark.parametrize("mode", ["standalone", "sentinel"])
def test_a_single_redis_whose_hops_are_atomic_gets_no_outbox_trigger(mode: str) -> None:
    for output, output_partitions in [({"stream": "results"}, 1), ({"stage": "next"}, 1), ({"stage": "next"}, 4)]:
        body = scaled(mode, 4, output, output_partitions)
        assert outbox_triggers(body) == []
        assert "outbox" not in body["advanced"]["scalingModifiers"]["formula"]
    assert outbox_triggers(scaled(mode, 1, {"stream": "results"})) == []


def test_a_forward_to_another_partition_count_is_relayed_and_counted_on_every_server() -> None:
    for mode in URLS:
        body = scaled(mode, 4, {"stage": "next"}, output_partitions=2)
        assert [t["name"] for t in outbox_triggers(body)] == ["outbox0", "outbox1", "outbox2", "outbox3"]
        assert "sum([outbox0, outbox1, outbox2, outbox3]) > 0" in body["advanced"]["scalingModifiers"]["formula"]
    # Partition p to the same count's p: one slot, atomic also on a cluster.
    assert outbox_triggers(scaled("cluster", 4, {"stage": "next"}, output_partitions=4)) == []


def test_a_stage_without_output_has_no_outbox_trigger() -> None:
    assert outbox_triggers(scaled("cluster", 4, None)) == []


@pytest.mark.parametrize("mode", list(URLS))
@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.parametrize("case", list(OUTPUTS))
def test_keda_counts_exactly_the_outboxes_the_worker_of_the_deployment_writes(
    mode: str, partitions: int, case: str
) -> None:
    """The operator's choice and the worker's agree: the worker started from the Deployment's env routes its
    lanes (on a cluster, where slots matter), and KEDA counts the outbox of the relayed ones, no other."""
    output, output_partitions = OUTPUTS[case]
    spec = stage_spec(mode, partitions, output)
    env = container(build_deployment(OWNER, spec, output_partitions=output_partitions))["env"]
    plain = {var["name"].lower(): var["value"] for var in env if "value" in var}
    settings = WorkerSettings(**{**plain, "redis_url": URLS[mode]})
    routes = lanes.routes(settings.keys, settings.output_partitions, slots_matter=mode == "cluster")
    written = [route.keys.outbox for route in routes if route.relayed]
    counted = [t["metadata"]["stream"] for t in outbox_triggers(scaled(mode, partitions, output, output_partitions))]
    assert counted == written
