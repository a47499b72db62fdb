"""Two `phoenix operator --leader-election` processes against the real API server: one acts, the other stands
by and takes over within 30 s when the leader is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from phoenix.operator.options import DEFAULT_LEASE_NAME
from tests.fixtures.cluster_objects import OPERATOR_NAMESPACE
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_models import spec_of
from tests.fixtures.operator_process import (
    VENV_BIN,
    ServingOperator,
    get_stage,
    kubectl_apply,
    sample_documents,
    serving_operator,
)

ARGS = ["--all-namespaces", "--leader-election", f"--lease-namespace={OPERATOR_NAMESPACE}"]
# The rules the operator uses (kube/leader.py): a standby waits for 15 s without renewal, polling every 2 s.
TAKEOVER_LIMIT_SECONDS = 30


def _lease(api: client.ApiClient) -> dict[str, Any]:
    lease = client.CoordinationV1Api(api).read_namespaced_lease(DEFAULT_LEASE_NAME, OPERATOR_NAMESPACE)
    return {"holder": spec_of(lease).holder_identity, "transitions": spec_of(lease).lease_transitions or 0}


def _reconciled(plane: ControlPlane, namespace: str, name: str) -> bool:
    return bool(((get_stage(plane, namespace, name) or {}).get("status") or {}).get("streams"))


def _reconciles(operator: ServingOperator) -> float:
    return sum(v for k, v in operator.metrics().items() if k.startswith("phoenix_operator_reconciles_total{"))


@pytest.mark.timeout(90)
@pytest.mark.subprocess
def test_leader_election_outside_a_pod_needs_the_lease_namespace() -> None:
    env = {key: value for key, value in os.environ.items() if key != "POD_NAMESPACE"}
    result = subprocess.run(
        [str(VENV_BIN / "phoenix"), "operator", "--leader-election"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "phoenix operator: --leader-election needs --lease-namespace (or $POD_NAMESPACE) when not running in a pod"
    )


@pytest.mark.timeout(300)
@pytest.mark.kube
def test_the_standby_takes_over_within_30_seconds_of_the_leaders_death(
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: Path,
    kube_namespace: str,
    redis_url: str,
) -> None:
    ns = kube_namespace
    secret, first = sample_documents(f"{redis_url.rsplit('/', 1)[0]}/13", ns)[:2]
    first["metadata"]["name"] = "before-failover"
    second = {**first, "metadata": {**first["metadata"], "name": "after-failover"}}

    with serving_operator(kube_cluster, operator_kubeconfig, ARGS, log_name="operator-a") as leader:
        eventually(lambda: leader.role() == "leader", "the first operator leading", timeout=30)
        with serving_operator(kube_cluster, operator_kubeconfig, ARGS, log_name="operator-b") as standby:
            kubectl_apply(kube_cluster, [secret, first])
            eventually(lambda: _reconciled(kube_cluster, ns, "before-failover"), "the leader reconciling")
            # Only the leader acted: the standby runs no handler at all.
            assert standby.role() == "standby"
            assert _reconciles(standby) == 0 and standby.metrics()["phoenix_operator_leader{}"] == 0
            # The reconcile is counted when its handler returns, just after the status it wrote.
            eventually(lambda: _reconciles(leader) >= 1, "the leader's reconcile counted")
            held = _lease(kube_api)

            os.killpg(leader.process.popen.pid, signal.SIGKILL)
            leader.process.popen.wait()
            killed = time.monotonic()
            eventually(
                lambda: standby.role() == "leader",
                "the standby taking over",
                timeout=TAKEOVER_LIMIT_SECONDS,
                interval=0.5,
            )
            print(f"takeover {time.monotonic() - killed:.1f} s after SIGKILL")
            taken = _lease(kube_api)
            assert taken["holder"] != held["holder"]
            assert taken["transitions"] == held["transitions"] + 1

            kubectl_apply(kube_cluster, [second])
            eventually(lambda: _reconciled(kube_cluster, ns, "after-failover"), "the new leader reconciling")
            eventually(lambda: _reconciles(standby) >= 1, "the new leader's reconcile counted")
        # A clean stop hands the Lease back at once.
        assert _lease(kube_api)["holder"] is None


@pytest.mark.timeout(150)
@pytest.mark.kube
def test_a_leader_that_finds_its_lease_taken_exits_at_once(
    kube_cluster: ControlPlane, kube_api: client.ApiClient, operator_kubeconfig: Path
) -> None:
    coordination = client.CoordinationV1Api(kube_api)
    with serving_operator(kube_cluster, operator_kubeconfig, ARGS, log_name="operator-usurped") as operator:
        eventually(lambda: operator.role() == "leader", "the operator leading", timeout=30)
        try:
            coordination.patch_namespaced_lease(
                DEFAULT_LEASE_NAME, OPERATOR_NAMESPACE, {"spec": {"holderIdentity": "another-replica"}}
            )
            eventually(lambda: not operator.process.alive, "the operator exiting", timeout=15)
            assert operator.process.popen.returncode == 1
            assert "lost the leader Lease" in operator.process.log_tail()
        finally:
            # The next test need not wait for that holder's Lease to expire.
            coordination.delete_namespaced_lease(DEFAULT_LEASE_NAME, OPERATOR_NAMESPACE)
