"""`kubectl phoenix` through the real kubectl and API server, with the operator and a played worker acting on it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from kubernetes import client

from phoenix.cli.kubectl import PluginError, Stages, pipeline_stages
from phoenix.keys import StageKeys
from phoenix.kube_names import PIPELINE_LABEL, REPLAY_ANNOTATION
from tests.fixtures.cluster_objects import service_account_kubeconfig, service_account_with_role
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.operator_process import (
    VENV_BIN,
    existing_stage,
    get_stage,
    kubectl_apply,
    running_operator,
    sample_documents,
)

pytestmark = pytest.mark.kube
REDIS_DB = 12  # a database of its own: stage names, hence keys, repeat across test modules


@pytest.fixture(scope="module")
def operator(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Iterator[None]:
    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-plugin") as (process, _):
        yield
        assert process.alive, process.failure("died during the tests")


@pytest.fixture
def redis_db(redis_url: str) -> Iterator[tuple[str, sync_redis.Redis]]:
    url = f"{redis_url.rsplit('/', 1)[0]}/{REDIS_DB}"
    with sync_redis.Redis.from_url(url, decode_responses=True) as connection:
        connection.flushdb()
        yield url, connection


def kubectl_phoenix(plane: ControlPlane, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess:
    """`kubectl phoenix ...` as a person types it: kubectl finds the kubectl-phoenix executable on the PATH."""
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig or plane.kubeconfig),
    }
    return subprocess.run(
        [str(plane.bin_dir / "kubectl"), "phoenix", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        stdin=subprocess.DEVNULL,  # no terminal, as in CI: questions are refused, not waited on
    )


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def _status(plane: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return (get_stage(plane, ns, name) or {}).get("status") or {}


@pytest.mark.timeout(690)
def test_plugin_against_the_operator(
    operator: None,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    redis_db: tuple[str, sync_redis.Redis],
    tmp_path: Path,
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    kubectl_apply(kube_cluster, sample_documents(url, ns, tmp_path))
    eventually(
        lambda: all(_status(kube_cluster, ns, s).get("queue") for s in ("router", "parser", "grouper")),
        "queues sampled into status",
    )

    # A real router worker dead-letters two records whose documents do not exist; its keys are its namespace's.
    router_keys = StageKeys.for_stage("router", ns)
    router = kubelet_player(ns, "router")
    router.start()
    for record in ("gone-1", "gone-2"):
        data = json.dumps({"document_url": (tmp_path / f"{record}.pdf").as_uri()})
        connection.xadd(router_keys.input, {"record_id": record, "user_id": "u1", "data": data})
    eventually(lambda: connection.xlen(router_keys.dlq) == 2, "two dead letters", timeout=60)

    rows = {
        r["stage"]: r for r in json.loads(ok(kubectl_phoenix(kube_cluster, "status", "--json"))) if r["namespace"] == ns
    }
    assert set(rows) == {"router", "parser", "grouper"}
    eventually(lambda: _plugin_row(kube_cluster, ns, "router").get("dlqLength") == 2, "DLQ 2 in the plugin's status")
    table = ok(kubectl_phoenix(kube_cluster, "status", "-n", ns)).splitlines()
    assert table[0].split() == [
        "NAMESPACE",
        "STAGE",
        "READY",
        "REPLICAS",
        "PAUSED",
        "LAG",
        "PENDING",
        "OLDEST(s)",
        "DLQ",
    ]
    assert [line.split()[1] for line in table[1:]] == ["grouper", "parser", "router"]

    # inspect: the stage's names from its status, its Redis URL from its Secret, read with the caller's rights.
    report = json.loads(ok(kubectl_phoenix(kube_cluster, "inspect", "router", "gone-1", "-n", ns, "--json")))
    assert report["input_stream"] == router_keys.input and report["claim_idle_seconds"] == 300
    assert report["diagnosis"].startswith("dead-lettered at ") and "RecordNotFoundError" in report["diagnosis"]
    # trace: the pipeline found by the router's output edges (router -> parser -> grouper), the record from Redis.
    lines = ok(kubectl_phoenix(kube_cluster, "trace", "gone-1", "--stage", "router", "-n", ns)).splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["router", "parser", "grouper"]
    assert lines[1].split(maxsplit=1)[1].startswith("dead-lettered at ") and "RecordNotFoundError" in lines[1]
    assert lines[2:4] == ["  parser   not seen", "  grouper  not seen"]
    assert lines[4].startswith("now: router: dead-lettered at ")

    rules = [
        client.V1PolicyRule(api_groups=["phoenix.io"], resources=["phoenixstages"], verbs=["get", "list", "patch"])
    ]
    service_account_with_role(kube_api, ns, "oncall", rules)
    oncall = service_account_kubeconfig(kube_cluster, ns, "oncall", tmp_path / "oncall.kubeconfig")
    denied = kubectl_phoenix(kube_cluster, "inspect", "router", "gone-1", "-n", ns, kubeconfig=oncall)
    assert denied.returncode == 1
    assert "may not read Secret 'phoenix-redis' in namespace" in denied.stderr and url not in denied.stderr
    client.RbacAuthorizationV1Api(kube_api).patch_namespaced_role(
        "oncall",
        ns,
        {
            "rules": [
                *rules,
                {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["phoenix-redis"], "verbs": ["get"]},
            ]
        },
    )
    eventually(
        lambda: (
            kubectl_phoenix(kube_cluster, "inspect", "router", "gone-1", "-n", ns, kubeconfig=oncall).returncode == 0
        ),
        "inspect allowed once the Role grants it",
    )

    # replay-dlq N: the operator moves one entry back and reports it.
    out = ok(kubectl_phoenix(kube_cluster, "replay-dlq", "router", "1", "-n", ns, "--wait"))
    assert out.splitlines()[-1].startswith("replayed: 1 entries moved back to the input at ")
    # Without a count: every entry, so it asks first; without a terminal it refuses and asks nothing of the operator.
    unasked = kubectl_phoenix(kube_cluster, "replay-dlq", "router", "-n", ns)
    assert unasked.returncode == 1
    assert unasked.stderr.splitlines() == [
        f"Replay every DLQ entry of {ns}/router (2 at the last status refresh)? [y/N] refused: not a terminal; "
        "pass --yes to confirm (nothing changed)"
    ]
    assert REPLAY_ANNOTATION not in (existing_stage(kube_cluster, ns, "router")["metadata"].get("annotations") or {})
    bad = kubectl_phoenix(kube_cluster, "replay-dlq", "router", "zero", "-n", ns)
    assert bad.returncode == 1 and "must be `all` or a whole number" in bad.stderr

    # restart: a new rollout, acknowledged by the operator.
    out = ok(kubectl_phoenix(kube_cluster, "restart", "router", "-n", ns, "--wait"))
    assert out.splitlines()[-1].startswith("restarted at ")

    # pause and resume: spec.paused, which the operator turns into replicas.
    apps = client.AppsV1Api(kube_api)
    assert ok(kubectl_phoenix(kube_cluster, "pause", "router", "-n", ns)).startswith(f"paused {ns}/router")
    eventually(lambda: apps.read_namespaced_deployment("router", ns).spec.replicas == 0, "paused: scaled to zero")
    assert _plugin_row(kube_cluster, ns, "router")["paused"] is True
    ok(kubectl_phoenix(kube_cluster, "resume", "router", "-n", ns))
    eventually(lambda: apps.read_namespaced_deployment("router", ns).spec.replicas == 1, "resumed: back to min")

    missing = kubectl_phoenix(kube_cluster, "pause", "nosuchstage", "-n", ns)
    assert missing.returncode == 1 and f"PhoenixStage {ns}/nosuchstage not found" in missing.stderr


def _plugin_row(plane: ControlPlane, ns: str, stage: str) -> dict[str, Any]:
    rows = json.loads(ok(kubectl_phoenix(plane, "status", "-n", ns, "--json")))
    return next(r for r in rows if r["stage"] == stage)


def test_trace_finds_a_pipeline_s_stages_by_label_and_output_edges(
    kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, redis_url: str, tmp_path: Path
) -> None:
    """Stored PhoenixStages only (no operator): the samples labelled as one pipeline, listed out of order."""
    ns = kube_namespace
    documents = sample_documents(redis_url, ns)
    for doc in documents:
        if doc["kind"] == "PhoenixStage":
            doc["metadata"]["labels"] = {PIPELINE_LABEL: "docs"}
    kubectl_apply(kube_cluster, list(reversed(documents)))
    stages = Stages(kube_api)

    def names(named: list[str], pipeline: str = "docs") -> list[str]:
        return [body["metadata"]["name"] for body in pipeline_stages(stages, ns, pipeline, named)]

    assert names([]) == ["router", "parser", "grouper"]  # from the one no other stage feeds, by output edges
    assert names(["parser"]) == ["parser", "grouper"]
    assert names(["grouper", "router"]) == ["grouper", "router"]  # several: as given
    with pytest.raises(PluginError, match=r"no pipeline 'other' in \S+ \(stages labelled phoenix\.io/pipeline=other"):
        names([], "other")
