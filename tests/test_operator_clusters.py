"""Two Kubernetes clusters sharing one Redis, against the real API server, real operator processes and a real
Valkey: the first cluster's operator (PHOENIX_CLUSTER_ID) runs stage team/shared; the cluster is then played by
an operator of another identity (its kube-system namespace's uid, the default), whose own PhoenixStage of the same
namespace and name, another uid, is refused the keys instead of adopting them, and whose deletionPolicy Delete
deletes none of them. One API server plays both clusters in turn: what tells them apart is the operator's
identity, which is what the ownership markers carry."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis as sync_redis
from kubernetes import client

from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.operator_process import (
    condition_of_reason,
    event_messages,
    event_reasons,
    final_stage,
    kubectl_apply,
    serving_operator,
    wait_ready,
)

pytestmark = pytest.mark.kube
OTHER_CLUSTER = "cluster-east"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("redis_db", [12], indirect=True)
def test_a_stage_of_another_cluster_of_the_same_name_is_refused_its_keys_and_deletes_none(
    kube_cluster: ControlPlane,
    operator_kubeconfig: Path,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    stage = final_stage(url, ns, "shared", processor="tests.processors:ScriptedProcessor")
    owner = f"phoenix:{{{ns}}}:shared:owner"
    first = {"PHOENIX_CLUSTER_ID": OTHER_CLUSTER}
    with serving_operator(kube_cluster, operator_kubeconfig, ["--all-namespaces"], log_name="operator-east", env=first):
        kubectl_apply(kube_cluster, stage)
        wait_ready(kube_cluster, ns, "shared")
        east_uid = connection.hget(owner, "uid")
        for i in range(2):
            connection.xadd(f"phoenix:{{{ns}}}:shared:input", {"record_id": f"r{i}", "user_id": "u", "data": "{}"})
    # Gone from the API server (Retain: at once), its keys stay in Redis for its cluster.
    assert kube_cluster.kubectl("delete", "phoenixstage", "shared", "-n", ns, "--timeout=60s").returncode == 0

    with serving_operator(kube_cluster, operator_kubeconfig, ["--all-namespaces"], log_name="operator-west"):
        stage[1]["spec"]["deletionPolicy"] = "Delete"
        kubectl_apply(kube_cluster, stage[1:])
        refused = eventually(
            lambda: condition_of_reason(kube_cluster, ns, "shared", "KeysHeldByAnotherStage"), "the keys refused"
        )
        assert f"held by PhoenixStage {ns}/shared of Kubernetes cluster {OTHER_CLUSTER}" in refused["message"]
        assert "RedisKeysAdopted" not in event_reasons(kube_api, ns, "shared")
        assert kube_cluster.kubectl("delete", "phoenixstage", "shared", "-n", ns, "--timeout=60s").returncode == 0
        [kept] = event_messages(kube_api, ns, "shared", "RedisDataNotOwned")
        assert "deleted none" in kept and OTHER_CLUSTER in kept
    assert connection.hgetall(owner)["uid"] == east_uid and connection.hgetall(owner)["cluster"] == OTHER_CLUSTER
    assert connection.xlen(f"phoenix:{{{ns}}}:shared:input") == 2
    assert [g["name"] for g in connection.xinfo_groups(f"phoenix:{{{ns}}}:shared:input")] == ["shared-group"]
