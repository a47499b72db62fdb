"""`kubectl phoenix report` (and `phoenix report`) against the real API server, the operator and a real Valkey.

The stage's Redis is a Valkey of this module's own (an ACL user whose password is a unique marker), its namespace
holds a second Secret the report must never read (referenced from spec.env by secretKeyRef), spec.env has a literal
value of the processor's own (a marker too: the report cannot tell whether it is a secret), and its streams hold
records and dead letters whose every field value is a unique marker: the archive must have what a person is asked
for and none of those values, and be readable by its owner alone. There is no kubelet here, so no pod has logs: the
archive records, per container, the API server's answer instead (the e2e suite checks real logs:
tests/e2e/test_report.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as sync_redis
from kubernetes import client

from phoenix.embedded import embedded_valkey
from phoenix.keys import StageKeys
from phoenix.kube_names import NAME_LABEL, OPERATOR_APP_NAME
from tests.fixtures.cluster_objects import service_account_kubeconfig, service_account_with_role
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.operator_process import VENV_BIN, kubectl_apply, running_operator, sample_documents, stage_status
from tests.test_kubectl_plugin import kubectl_phoenix, ok

pytestmark = pytest.mark.kube


def marker(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def private_redis() -> Iterator[tuple[str, str]]:
    """(url with credentials, password) of a Valkey of this module's own, as an ACL user."""
    password = marker("redis-password")
    with embedded_valkey() as url, sync_redis.Redis.from_url(url) as admin:
        admin.execute_command("ACL", "SETUSER", "reporter", "on", f">{password}", "~*", "&*", "+@all")
        yield url.replace("redis://", f"redis://reporter:{password}@"), password


@pytest.fixture(scope="module")
def operator(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Iterator[None]:
    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-report") as (process, _):
        yield
        assert process.alive, process.failure("died during the tests")


def members(archive: Path) -> dict[str, str]:
    with tarfile.open(archive) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


@pytest.mark.timeout(210)
def test_report_has_the_stage_picture_and_no_secret_or_record_data(
    operator: None,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    private_redis: tuple[str, str],
    tmp_path: Path,
) -> None:
    url, password = private_redis
    ns = kube_namespace
    other_secret, literal = marker("api-token"), marker("vendor-region")
    secret, router = sample_documents(url, ns)[:2]
    secret["stringData"]["password"] = password
    router["spec"].pop("output")
    router["spec"]["env"] = [
        {"name": "VENDOR_REGION", "value": literal},
        {"name": "LOG_LEVEL", "value": "debug"},
        {"name": "VENDOR_TOKEN", "secretKeyRef": {"name": "vendor", "key": "token"}},
    ]
    vendor = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "vendor", "namespace": ns},
        "stringData": {"token": other_secret},
    }
    # A Pod like the operator's (no kubelet runs it): the report looks for its logs by label.
    operator_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "phoenix-operator-0", "namespace": ns, "labels": {NAME_LABEL: OPERATOR_APP_NAME}},
        "spec": {"containers": [{"name": "operator", "image": "ghcr.io/phoenix/phoenix:0.1.0"}]},
    }
    kubectl_apply(kube_cluster, [secret, vendor, router, operator_pod])

    keys = StageKeys.for_stage("router", ns)
    record_values: list[str] = []
    with sync_redis.Redis.from_url(url, decode_responses=True) as redis:
        for i in range(3):
            fields = {"record_id": marker(f"record-{i}"), "user_id": marker("user"), "data": marker("data")}
            redis.xadd(keys.input, fields)
            record_values += fields.values()
        for error_type in ("ValueError", "ValueError", "RecordNotFoundError"):
            fields = {"record_id": marker("dead"), "data": marker("dead-data"), "error": marker("error-text")}
            redis.xadd(keys.dlq, {**fields, "error_type": error_type, "stage": "router", "attempts": "3"})
            record_values += fields.values()
    eventually(lambda: (stage_status(kube_cluster, ns, "router").get("queue") or {}).get("dlqLength") == 3, "status")
    eventually(
        lambda: (
            client.CoreV1Api(kube_api).list_namespaced_pod(ns, label_selector="app.kubernetes.io/instance=router").items
        ),
        "the Deployment's pod (unscheduled: no node)",
    )

    archive = tmp_path / "report.tar.gz"
    done = kubectl_phoenix(kube_cluster, "report", "-n", ns, "--operator-namespace", ns, "-o", str(archive))
    printed = ok(done)
    assert f"wrote {archive}" in printed
    files = members(archive)

    assert os.stat(archive).st_mode & 0o777 == 0o600
    with tarfile.open(archive) as tar:
        assert {member.mode for member in tar.getmembers()} == {0o600}
    stage = json.loads(files[f"stages/{ns}/router.json"])
    assert stage["spec"]["processor"] == "router"
    assert {var["name"]: var.get("value") for var in stage["spec"]["env"]} == {
        "VENDOR_REGION": "<redacted>",  # the processor's own: it may be anything
        "LOG_LEVEL": "debug",  # Phoenix's own setting, no secret
        "VENDOR_TOKEN": None,
    }
    assert stage["status"]["queue"]["dlqLength"] == 3
    assert "managedFields" not in stage["metadata"]
    assert json.loads(files["versions.json"])["kubernetes"].startswith("v1.")
    assert json.loads(files["versions.json"])["redis"][f"{ns}/router"].startswith("valkey ")

    (queue,) = json.loads(files["redis/queue.json"])
    assert (queue["namespace"], queue["stage"], queue["length"], queue["dlqLength"]) == (ns, "router", 3, 3)
    (dead,) = json.loads(files["redis/dlq.json"])
    assert dead["byErrorType"] == {"ValueError": 2, "RecordNotFoundError": 1}
    (server,) = json.loads(files["redis/servers.json"])
    assert "maxmemory-policy=noeviction" in server["risk"]["settings"] and "appendonly=" in server["risk"]["settings"]
    assert server["address"].startswith("redis://reporter:***@127.0.0.1:")

    (deployment,) = json.loads(files[f"workloads/{ns}/deployments.json"])
    env = {var["name"]: var for var in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["VENDOR_REGION"]["value"] == "<redacted>"
    assert (env["LOG_LEVEL"]["value"], env["SERVICE_NAME"]["value"], env["MASKED_ENV"]["value"]) == (
        "debug",
        "router",
        "VENDOR_TOKEN",
    )
    assert env["VENDOR_TOKEN"] == {
        "name": "VENDOR_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "vendor", "key": "token"}},
    }
    workers = json.loads(files[f"pods/{ns}/workers.json"])
    assert workers and all(p["phase"] == "Pending" and p["node"] is None for p in workers)
    assert [p["name"] for p in json.loads(files[f"pods/{ns}/operator.json"])] == ["phoenix-operator-0"]
    events = json.loads(files[f"events/{ns}.json"])
    assert any(e["object"] == "Deployment/router" and e["reason"] == "ScalingReplicaSet" for e in events), events

    # No kubelet, no node: each pod's missing log is an error the archive names.
    errors = json.loads(files["summary.json"])["errors"]
    for pod in [*workers, {"name": "phoenix-operator-0"}]:
        assert f"logs of {ns}/{pod['name']}: no logs, the pod is on no node (phase Pending)" in errors, errors
    assert not [f for f in files if f.startswith("logs/")], {f: files[f] for f in files if f.startswith("logs/")}
    assert len(errors) == len(workers) + 1, errors  # nothing else failed

    # Nothing of a Secret, nothing of a record, anywhere (the archive's bytes, its file names, the command's output).
    with tarfile.open(archive) as tar:
        names = " ".join(tar.getnames())
    everything = "\n".join([*files.values(), names, printed, done.stderr])
    for value in (password, other_secret, literal, *record_values):
        assert value not in everything, f"{value} is in the report: {[n for n, text in files.items() if value in text]}"

    # `phoenix report` is the same command; an archive it writes over is made 0600 too.
    again = tmp_path / "again.tar.gz"
    again.touch(mode=0o644)
    run = subprocess.run(
        [str(VENV_BIN / "phoenix"), "report", "-n", ns, "--operator-namespace", ns, "-o", str(again)],
        env={**os.environ, "KUBECONFIG": str(kube_cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert set(members(again)) == set(files) and os.stat(again).st_mode & 0o777 == 0o600


@pytest.mark.timeout(120)
def test_report_with_no_right_on_secrets(
    kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, tmp_path: Path
) -> None:
    """A caller who may read stages, pods, logs, Events and Deployments but no Secret: with --no-redis the report
    asks for no Secret at all (no error); without, the Secret it would need is named as refused, the rest written."""
    ns = kube_namespace
    secret, router = sample_documents("redis://127.0.0.1:1/0", ns)[:2]
    kubectl_apply(kube_cluster, [secret, router])
    rules = [
        client.V1PolicyRule(api_groups=["phoenix.io"], resources=["phoenixstages"], verbs=["get", "list"]),
        client.V1PolicyRule(api_groups=[""], resources=["pods", "pods/log", "events"], verbs=["get", "list"]),
        client.V1PolicyRule(api_groups=["apps"], resources=["deployments"], verbs=["list"]),
    ]
    service_account_with_role(kube_api, ns, "support", rules)
    support = service_account_kubeconfig(kube_cluster, ns, "support", tmp_path / "support.kubeconfig")
    common = ("report", "-n", ns, "--operator-namespace", ns)

    archive = tmp_path / "no-redis.tar.gz"
    ok(kubectl_phoenix(kube_cluster, *common, "--no-redis", "-o", str(archive), kubeconfig=support))
    files = members(archive)
    assert f"stages/{ns}/router.json" in files
    assert not [f for f in files if f.startswith("redis/")]
    assert json.loads(files["summary.json"])["errors"] == []

    archive = tmp_path / "refused.tar.gz"
    printed = ok(kubectl_phoenix(kube_cluster, *common, "-o", str(archive), kubeconfig=support))
    (error,) = json.loads(members(archive)["summary.json"])["errors"]
    assert error.startswith(f"Redis of stage {ns}/router: your Kubernetes identity may not read Secret 'phoenix-redis'")
    assert f"not collected: {error}" in printed
