"""Stages never share Redis keys, against the real API server and operator: two namespaces with a stage of the same
name on one Redis database keep their streams, groups and records apart; deletionPolicy Delete removes only what
its own stage created; a stage that would join another's keys (an explicit spec.input, a worker run by hand, v1-layout
data) is refused with a condition and a Warning, and converges by itself once the keys are free."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from kubernetes import client

from tests.fixtures.cluster_objects import ensure_namespace
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.operator_process import (
    ServingOperator,
    condition_of_reason,
    event_messages,
    event_reasons,
    existing_stage,
    final_stage,
    kubectl_apply,
    read_or_none,
    stage_events,
    wait_ready,
    watching_operator,
)
from tests.fixtures.workers import ROOT

pytestmark = pytest.mark.kube
TEAMS = ("team-a", "team-b")
# Refusals are retried with kopf's backoff (5 s, 10 s, 20 s, ...): a stage converges within a few attempts.
CONVERGE_SECONDS = 150.0


@pytest.fixture(scope="module")
def operator(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Iterator[ServingOperator]:
    with watching_operator(kube_cluster, operator_kubeconfig, "operator-tenants") as served:
        yield served


@pytest.fixture
def teams(kube_cluster: ControlPlane, kube_api: client.ApiClient) -> Iterator[tuple[str, ...]]:
    for team in TEAMS:
        ensure_namespace(kube_cluster, team)
    yield TEAMS
    for team in TEAMS:
        client.CoreV1Api(kube_api).delete_namespace(team)


def _stage(url: str, namespace: str, name: str, **spec: Any) -> list[dict[str, Any]]:
    """A final stage `name` running the test processor (final_stage), with the sample Secret."""
    return final_stage(url, namespace, name, processor="tests.processors:ScriptedProcessor", **spec)


def _groups(connection: sync_redis.Redis, stream: str) -> dict[str, dict[str, Any]]:
    return {g["name"]: g for g in connection.xinfo_groups(stream)} if connection.exists(stream) else {}


def _deployment_exists(api: client.ApiClient, namespace: str, name: str) -> bool:
    return read_or_none(client.AppsV1Api(api).read_namespaced_deployment, name, namespace) is not None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_two_namespaces_share_no_key_and_delete_removes_only_its_own(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    teams: tuple[str, ...],
    kubelet_player: PlayKubelet,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    for team in teams:
        kubectl_apply(kube_cluster, _stage(url, team, "shared", deletionPolicy="Delete"))
    for team in teams:
        wait_ready(kube_cluster, team, "shared")

    inputs = {team: f"phoenix:{{{team}}}:shared:input" for team in teams}
    for team in teams:
        assert list(_groups(connection, inputs[team])) == ["shared-group"]
        uid = existing_stage(kube_cluster, team, "shared")["metadata"]["uid"]
        assert connection.hgetall(f"phoenix:{{{team}}}:shared:owner")["uid"] == uid
    for i in range(5):
        connection.xadd(inputs["team-a"], {"record_id": f"a{i}", "user_id": "u1", "data": "{}"})
    for i in range(3):
        connection.xadd(inputs["team-b"], {"record_id": f"b{i}", "user_id": "u1", "data": "{}"})
    assert {team: _groups(connection, inputs[team])["shared-group"]["lag"] for team in teams} == {
        "team-a": 5,
        "team-b": 3,
    }
    # team-b's stage ran for a while (a record's marker, an audit line, backpressure), and keys of another type
    # took two names of its kinds: the retry set's, and one under its record prefix.
    connection.set("phoenix:{team-b}:shared:record:b0", "done 1-0")
    connection.xadd("phoenix:{team-b}:shared:audit", {"repair": "x"})
    connection.set("phoenix:{team-b}:shared:backpressure", 7)
    connection.set("phoenix:{team-b}:shared:retry", "someone else's string")
    connection.rpush("phoenix:{team-b}:shared:record:list", "someone else's list")

    assert kube_cluster.kubectl("delete", "phoenixstage", "shared", "-n", "team-b", "--timeout=60s").returncode == 0
    deleted = event_messages(kube_api, "team-b", "shared", "RedisDataDeleted")
    assert len(deleted) == 1 and "consumer group shared-group" in deleted[0]
    left = sorted(connection.scan_iter(match="phoenix:{team-b}:*"))
    assert left == ["phoenix:{team-b}:shared:record:list", "phoenix:{team-b}:shared:retry"]
    # team-a's five records wait, untouched, for team-a's stage.
    assert connection.xlen(inputs["team-a"]) == 5
    assert _groups(connection, inputs["team-a"])["shared-group"]["lag"] == 5

    # team-a's workers (real `phoenix worker` processes, as its pods) process them: its records reach only it.
    kube_cluster.kubectl(
        "patch", "phoenixstage", "shared", "-n", "team-a", "--type=merge", "-p", '{"spec": {"replicas": {"min": 1}}}'
    )
    kubelet_player("team-a", "shared", {"PYTHONPATH": str(ROOT)}).start()
    eventually(
        lambda: (g := _groups(connection, inputs["team-a"])["shared-group"])["lag"] == 0 and g["pending"] == 0,
        "team-a's records processed",
        timeout=90,
    )
    assert connection.get("calls:shared") == "5"


def _refused(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return eventually(
        lambda: condition_of_reason(plane, namespace, name, "KeysHeldByAnotherStage"),
        f"{name} refused its keys",
    )


@pytest.mark.timeout(270)
@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_a_stage_naming_another_stages_input_is_refused_until_the_keys_are_free(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    shared_input = f"phoenix:{{{ns}}}:shared:input"
    kubectl_apply(kube_cluster, _stage(url, ns, "shared", deletionPolicy="Delete"))
    wait_ready(kube_cluster, ns, "shared")
    connection.xadd(shared_input, {"record_id": "r1", "user_id": "u1", "data": "{}"})
    mine = f"phoenix:{{{ns}}}:*"  # the other tests' stages may still be going away, in other namespaces
    before = {key: connection.type(key) for key in connection.scan_iter(match=mine)}

    kubectl_apply(kube_cluster, _stage(url, ns, "intruder", input=shared_input, consumerGroup="shared-group"))
    refused = _refused(kube_cluster, ns, "intruder")
    assert refused["status"] == "False"
    assert f"held by PhoenixStage {ns}/shared" in refused["message"] and "redis://" not in refused["message"]
    warnings = eventually(lambda: stage_events(kube_api, ns, "intruder", type_="Warning"), "a Warning Event")
    assert [e.reason for e in warnings] == ["KeysHeldByAnotherStage"]
    assert f"{ns}/shared" in (warnings[0].message or "")
    # Nothing created or changed in Redis, no Deployment for it.
    assert {key: connection.type(key) for key in connection.scan_iter(match=mine)} == before
    assert list(_groups(connection, shared_input)) == ["shared-group"]
    assert not _deployment_exists(kube_api, ns, "intruder")

    # The holder goes (deletionPolicy Delete takes its keys along): the intruder converges by itself.
    assert kube_cluster.kubectl("delete", "phoenixstage", "shared", "-n", ns, "--timeout=60s").returncode == 0
    wait_ready(kube_cluster, ns, "intruder", timeout=CONVERGE_SECONDS)  # once the keys are free
    assert connection.hgetall(f"phoenix:{{{ns}}}:intruder:owner")["input"] == shared_input
    assert _deployment_exists(kube_api, ns, "intruder")


@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_a_hand_run_workers_keys_are_refused_and_deleting_the_refused_stage_keeps_them(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    own_input = f"phoenix:{{{ns}}}:router:input"
    # What a worker run by hand leaves: its group on the stage's input, with a record pending, and no marker.
    connection.xgroup_create(own_input, "router-group", id="0", mkstream=True)
    connection.xadd(own_input, {"record_id": "r1", "user_id": "u1", "data": "{}"})
    connection.xreadgroup("router-group", "hand-run", {own_input: ">"})

    kubectl_apply(kube_cluster, _stage(url, ns, "router", deletionPolicy="Delete"))
    refused = _refused(kube_cluster, ns, "router")
    assert "no ownership marker" in refused["message"] and f"--namespace {ns} --service router" in refused["message"]
    eventually(lambda: stage_events(kube_api, ns, "router", type_="Warning"), "a Warning Event")
    assert not _deployment_exists(kube_api, ns, "router")
    assert list(connection.scan_iter(match=f"phoenix:{{{ns}}}:*")) == [own_input]

    # Deleting the refused stage is not blocked, and deletes none of the keys it never held.
    assert kube_cluster.kubectl("delete", "phoenixstage", "router", "-n", ns, "--timeout=60s").returncode == 0
    kept = event_messages(kube_api, ns, "router", "RedisDataNotOwned")
    assert len(kept) == 1 and "deleted none" in kept[0]
    assert connection.xlen(own_input) == 1
    assert _groups(connection, own_input)["router-group"]["pending"] == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_a_retained_stages_keys_are_adopted_and_v1_data_asks_for_phoenix_migrate(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    kubectl_apply(kube_cluster, _stage(url, ns, "router"))
    wait_ready(kube_cluster, ns, "router")
    connection.xadd(f"phoenix:{{{ns}}}:router:input", {"record_id": "r1", "user_id": "u1", "data": "{}"})
    assert kube_cluster.kubectl("delete", "phoenixstage", "router", "-n", ns, "--timeout=60s").returncode == 0
    # Its Deployment goes by garbage collection (until then the successor leaves it alone: ChildNotOwned).
    eventually(lambda: not _deployment_exists(kube_api, ns, "router"), "the old Deployment gone", CONVERGE_SECONDS)

    # Its successor of the same name takes the retained keys over, and says so.
    kubectl_apply(kube_cluster, _stage(url, ns, "router"))
    wait_ready(kube_cluster, ns, "router", timeout=CONVERGE_SECONDS)
    adopted = eventually(lambda: stage_events(kube_api, ns, "router", reason="RedisKeysAdopted"), "adopted")
    assert adopted[0].type == "Normal" and "deleted with Retain" in (adopted[0].message or "")
    uid = existing_stage(kube_cluster, ns, "router")["metadata"]["uid"]
    assert connection.hgetall(f"phoenix:{{{ns}}}:router:owner")["uid"] == uid
    assert _groups(connection, f"phoenix:{{{ns}}}:router:input")["router-group"]["lag"] == 1

    # A stage with no v2 data yet whose v1-layout input holds its group is not started empty beside it.
    connection.xgroup_create("phoenix:grouper:input", "grouper-group", id="0", mkstream=True)
    kubectl_apply(kube_cluster, _stage(url, ns, "grouper"))
    legacy = eventually(
        lambda: condition_of_reason(kube_cluster, ns, "grouper", "LegacyKeysFound"),
        "grouper asks for phoenix migrate",
    )
    assert f"phoenix migrate --namespace {ns} --service grouper" in legacy["message"]
    assert event_reasons(kube_api, ns, "grouper", "Warning") == ["LegacyKeysFound"]
    assert not connection.exists(f"phoenix:{{{ns}}}:grouper:input", f"phoenix:{{{ns}}}:grouper:owner")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_a_stream_one_namespace_named_is_refused_to_another(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    neighbour: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns, other = kube_namespace, neighbour
    orders = f"orders-{ns}"  # a stream named outside every namespace's keys (unique to this test's run)
    kubectl_apply(kube_cluster, _stage(url, ns, "ingest", input=orders))
    wait_ready(kube_cluster, ns, "ingest")
    connection.xadd(orders, {"record_id": "o1", "user_id": "u1", "data": "{}"})

    # Another namespace's stages may neither read it nor write into it.
    kubectl_apply(kube_cluster, _stage(url, other, "reader", input=orders))
    kubectl_apply(kube_cluster, _stage(url, other, "writer", output={"stream": orders}))
    for name in ("reader", "writer"):
        refused = _refused(kube_cluster, other, name)
        assert f"the stream {orders} is claimed by the stages of namespace {ns}" in refused["message"]
        warnings = eventually(lambda n=name: stage_events(kube_api, other, n, type_="Warning"), "a Warning Event")
        assert [e.reason for e in warnings] == ["KeysHeldByAnotherStage"]
        assert not _deployment_exists(kube_api, other, name)
    assert list(_groups(connection, orders)) == ["ingest-group"] and connection.xlen(orders) == 1


@pytest.mark.timeout(180)
@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_delete_keeps_a_named_stream_another_stage_reads(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    """The stage that created the stream goes with deletionPolicy Delete: its group goes, the stream and the
    records waiting for the group of another stage (of its namespace, sharing the name) stay."""
    url, connection = redis_db
    ns = kube_namespace
    orders = f"orders-{ns}"
    kubectl_apply(kube_cluster, _stage(url, ns, "ingest", input=orders, deletionPolicy="Delete"))
    wait_ready(kube_cluster, ns, "ingest")
    kubectl_apply(kube_cluster, _stage(url, ns, "audit", input=orders))
    wait_ready(kube_cluster, ns, "audit")
    for i in range(3):
        connection.xadd(orders, {"record_id": f"o{i}", "user_id": "u1", "data": "{}"})
    assert kube_cluster.kubectl("delete", "phoenixstage", "ingest", "-n", ns, "--timeout=60s").returncode == 0
    [deleted] = event_messages(kube_api, ns, "ingest", "RedisDataDeleted")
    assert "consumer group ingest-group" in deleted and f"kept {orders}" in deleted
    assert list(_groups(connection, orders)) == ["audit-group"]
    assert _groups(connection, orders)["audit-group"]["lag"] == 3 and connection.xlen(orders) == 3


@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_an_output_into_another_namespaces_keys_is_refused(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    neighbour: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    """output.stream naming another namespace's input would inject records (billed to its users) into its
    pipeline: refused from the spec and the namespace, before anything runs."""
    url, connection = redis_db
    ns, other = kube_namespace, neighbour
    kubectl_apply(kube_cluster, _stage(url, other, "shared"))
    wait_ready(kube_cluster, other, "shared")
    theirs = f"phoenix:{{{other}}}:shared:input"
    for name, spec in (
        ("injector", {"output": {"stream": theirs}}),
        ("lane-injector", {"output": {"stream": f"phoenix:{{{other}~0}}:shared:input"}}),
        ("reader", {"input": theirs, "consumerGroup": "reader-group"}),
    ):
        kubectl_apply(kube_cluster, _stage(url, ns, name, **spec))
        invalid = eventually(lambda n=name: condition_of_reason(kube_cluster, ns, n, "InvalidSpec"), "InvalidSpec")
        assert f"is a key of namespace {other}" in invalid["message"]
        eventually(lambda n=name: "InvalidSpec" in event_reasons(kube_api, ns, n, "Warning"), "a Warning Event")
        assert not _deployment_exists(kube_api, ns, name)
    assert list(_groups(connection, theirs)) == ["shared-group"] and connection.xlen(theirs) == 0
