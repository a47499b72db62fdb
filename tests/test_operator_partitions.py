"""The operator on partitioned stages against the real control plane and a real Valkey: spec.partitions reaches
the workers (PARTITIONS, and OUTPUT_PARTITIONS from the stage output.stage names), each lane's keys and the
stage's layout are claimed, status and `kubectl get phx` show the lanes summed, a DLQ replay asked by annotation
puts each dead letter back in its own lane, and a changed count is refused with a condition and a Warning that say
how to change it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as sync_redis
from kubernetes import client

from phoenix.keys import StageKeys, partition_of
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_models import spec_of
from tests.fixtures.operator_process import (
    ServingOperator,
    final_stage,
    kubectl_apply,
    read_or_none,
    stage_condition,
    stage_events,
    stage_status,
    watching_operator,
)
from tests.fixtures.replies import stream_entries_now

pytestmark = pytest.mark.kube


@pytest.fixture(scope="module")
def operator(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Iterator[ServingOperator]:
    with watching_operator(kube_cluster, operator_kubeconfig, "operator-partitions") as served:
        yield served


def _deployment_env(api: client.ApiClient, namespace: str, name: str) -> dict[str, str] | None:
    deployment = read_or_none(client.AppsV1Api(api).read_namespaced_deployment, name, namespace)
    if deployment is None:
        return None
    return {var.name: var.value or "" for var in spec_of(spec_of(deployment).template).containers[0].env or []}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [11], indirect=True)
def test_a_partitioned_pipeline_is_run_shown_replayed_and_guarded_by_its_layout(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    # The next stage first, then one forwarding to it.
    kubectl_apply(kube_cluster, final_stage(url, ns, name="grouper", partitions=4))
    router = final_stage(url, ns, name="router", output={"stage": "grouper"})[1]
    kubectl_apply(kube_cluster, [router])
    grouper = StageKeys.for_stage("grouper", ns, partitions=4)

    env = eventually(lambda: _deployment_env(kube_api, ns, "grouper"), "the grouper's Deployment")
    # Set empty (a partitioned stage names neither): no envFrom key of the names reaches the workers.
    assert env["PARTITIONS"] == "4" and env["INPUT_QUEUE"] == env["DLQ_NAME"] == ""
    router_env = eventually(
        lambda: (
            found
            if (found := _deployment_env(kube_api, ns, "router")) and found.get("OUTPUT_PARTITIONS") == "4"
            else None
        ),
        "the router forwarding to the grouper's 4 partitions",
    )
    assert router_env["PARTITIONS"] == "1" and router_env["OUTPUT_QUEUE"] == f"phoenix:{{{ns}}}:grouper:input"
    assert connection.hgetall(grouper.layout) == {"partitions": "4"}
    for lane in grouper.lanes:
        assert [g["name"] for g in connection.xinfo_groups(lane.input)] == ["grouper-group"]
        assert connection.hget(lane.owner, "stage") == f"{ns}/grouper"

    # Records in several lanes: the status (and kubectl get phx) shows them summed.
    ids = [f"doc-{i}" for i in range(10)]
    assert len({partition_of(r, 4) for r in ids}) >= 3
    for record_id in ids:
        connection.xadd(grouper.lane_of(record_id).input, {"record_id": record_id, "user_id": "u", "data": "{}"})
    for record_id in ("dead-a", "dead-b", "dead-c"):
        connection.xadd(
            grouper.lane_of(record_id).dlq, {"record_id": record_id, "user_id": "u", "data": "{}", "error": "bad"}
        )
    eventually(
        lambda: (
            (stage_status(kube_cluster, ns, "grouper").get("queue") or {}).get("length") == 10
            or stage_status(kube_cluster, ns, "grouper").get("length") == 10
        ),
        "the status summing the lanes' 10 entries",
    )
    shown = kube_cluster.kubectl("get", "phx", "grouper", "-n", ns)
    assert shown.returncode == 0, shown.stderr
    header, row = shown.stdout.splitlines()[:2]
    columns = dict(zip(header.split(), row.split(), strict=False))
    assert (columns.get("BACKLOG"), columns.get("DLQ")) == ("10", "3"), shown.stdout

    # A DLQ replay by annotation: each dead letter back to the input of its own lane.
    annotate = kube_cluster.kubectl("annotate", "phoenixstage", "grouper", "-n", ns, "phoenix.io/replay-dlq=all")
    assert annotate.returncode == 0, annotate.stderr
    last = eventually(lambda: stage_status(kube_cluster, ns, "grouper").get("lastReplay"), "the replay done")
    assert last["moved"] == 3
    for record_id in ("dead-a", "dead-b", "dead-c"):
        lane = grouper.lane_of(record_id)
        assert record_id in [f["record_id"] for _, f in stream_entries_now(connection, lane.input)]
    assert sum(connection.xlen(lane.dlq) for lane in grouper.lanes) == 0

    # Another count on a stage with data: refused, with how to do it; the router keeps forwarding to 4.
    patched = kube_cluster.kubectl(
        "patch", "phoenixstage", "grouper", "-n", ns, "--type=merge", "-p", '{"spec": {"partitions": 2}}'
    )
    assert patched.returncode == 0, patched.stderr
    refused = eventually(
        lambda: (
            stage_condition(kube_cluster, ns, "grouper").get("reason") == "PartitionsChanged"
            and stage_condition(kube_cluster, ns, "grouper")
        ),
        "Ready=False PartitionsChanged",
    )
    assert refused["status"] == "False"
    assert "laid out in 4 partition(s) in Redis, not the 2 asked for" in refused["message"]
    assert "set partitions back to 4" in refused["message"] and "docs/operations.md" in refused["message"]
    warnings = eventually(
        lambda: [e.message or "" for e in stage_events(kube_api, ns, "grouper") if e.reason == "PartitionsChanged"],
        "a PartitionsChanged Warning",
    )
    assert "deletionPolicy Delete" in warnings[0]
    assert connection.hgetall(grouper.layout) == {"partitions": "4"}
    # The workers were not rolled onto the wrong lanes.
    assert (_deployment_env(kube_api, ns, "grouper") or {}).get("PARTITIONS") == "4"
    assert (_deployment_env(kube_api, ns, "router") or {}).get("OUTPUT_PARTITIONS") == "4"


def _forwards_to(env: dict[str, str] | None) -> int | None:
    """The partitions the workers forward to: OUTPUT_PARTITIONS, or the named output `lab`'s in OUTPUTS."""
    if not env:
        return None
    outputs = env.get("OUTPUTS")
    return int(json.loads(outputs)["lab"]["partitions"] if outputs else env["OUTPUT_PARTITIONS"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [11], indirect=True)
@pytest.mark.parametrize("named", [False, True], ids=["output", "outputs"])
def test_a_stage_forwarding_to_one_created_later_follows_its_partitions(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
    named: bool,
) -> None:
    """The next stage (output.stage, or a named output's) does not exist yet: the workers forward as to one
    partition; once it appears with 3, the operator reconciles the forwarding stage again and its workers forward
    to 3 (OUTPUT_PARTITIONS, or the output's partitions in OUTPUTS)."""
    url, _ = redis_db
    ns = kube_namespace
    forward = {"outputs": [{"name": "lab", "stage": "latecomer"}]} if named else {"output": {"stage": "latecomer"}}
    kubectl_apply(kube_cluster, final_stage(url, ns, name="early", **forward))
    env = eventually(lambda: _deployment_env(kube_api, ns, "early"), "the early stage's Deployment")
    assert _forwards_to(env) == 1
    kubectl_apply(kube_cluster, final_stage(url, ns, name="latecomer", partitions=3)[1:])
    eventually(
        lambda: _forwards_to(_deployment_env(kube_api, ns, "early")) == 3,
        "the early stage forwarding to the latecomer's 3 partitions",
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [11], indirect=True)
def test_deleting_a_stage_after_a_refused_partition_change_removes_the_lanes_redis_holds(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    """Its spec asks for 1 partition (refused: the layout has 4); deletionPolicy Delete goes by the layout, so no
    lane is left behind for a new stage of the name to start beside."""
    url, connection = redis_db
    ns = kube_namespace
    kubectl_apply(kube_cluster, final_stage(url, ns, name="lanes", partitions=4, deletionPolicy="Delete"))
    lanes = StageKeys.for_stage("lanes", ns, partitions=4)
    eventually(lambda: connection.hgetall(lanes.layout) == {"partitions": "4"}, "the layout of 4")
    for p, lane in enumerate(lanes.lanes):
        connection.xadd(lane.input, {"record_id": f"r{p}", "user_id": "u", "data": "{}"})
    patch = '{"spec": {"partitions": 1}}'
    assert kube_cluster.kubectl("patch", "phx", "lanes", "-n", ns, "--type=merge", "-p", patch).returncode == 0
    eventually(
        lambda: stage_condition(kube_cluster, ns, "lanes").get("reason") == "PartitionsChanged", "the change refused"
    )
    assert kube_cluster.kubectl("delete", "phx", "lanes", "-n", ns, "--timeout=60s").returncode == 0
    assert sorted(connection.scan_iter(match=f"phoenix:{{{ns}*")) == []
    [deleted] = [e.message or "" for e in stage_events(kube_api, ns, "lanes") if e.reason == "RedisDataDeleted"]
    assert all(lane.input in deleted for lane in lanes.lanes), deleted
