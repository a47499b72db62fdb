"""Redis ACL users (--redis-acl-admin-secret), against the real API server, a real operator process, worker
processes run by the kubelet player and a Valkey of their own whose default user is off: each namespace's workers
log in as its user and reach nothing of another namespace's, whatever their processor sends with whichever client;
the password rotates with the workers rolling and nothing lost; the user goes with its namespace's last stage."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from kubernetes import client

from phoenix.embedded import start_valkey
from phoenix.keys import shared_data_key
from phoenix.kube_names import (
    PASSWORD_ROTATED_ANNOTATION,
    PREVIOUS_PASSWORD_ANNOTATION,
    REDIS_USER_SECRET,
    SECRET_VERSIONS_ANNOTATION,
)
from tests.fixtures.cluster_objects import MANIFESTS, OPERATOR_NAMESPACE, kubectl_checked
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.kube_models import custom_object, metadata_of, spec_of
from tests.fixtures.operator_process import (
    ServingOperator,
    final_stage,
    kubectl_apply,
    read_or_none,
    serving_operator,
    wait_ready,
)
from tests.fixtures.replies import add_entry_now, stream_entries_now
from tests.fixtures.workers import ROOT

pytestmark = pytest.mark.kube
ADMIN_SECRET, ADMIN_USER, ADMIN_PASSWORD = "phoenix-redis-admin", "phoenix-admin", "admin-password-for-tests"
ACL_RBAC = [MANIFESTS / "redis-acl" / name for name in ("cluster-role.yaml", "cluster-role-binding.yaml")]
PYTHONPATH = {"PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def valkey() -> Iterator[tuple[int, sync_redis.Redis]]:
    """A Valkey of its own (ACL users are server-wide): an admin user for the operator, the default user off, so
    that no client without a user's password reaches anything."""
    server = start_valkey()
    with sync_redis.Redis(host=server.host, port=server.port, decode_responses=True) as default:
        default.execute_command("ACL", "SETUSER", ADMIN_USER, "on", f">{ADMIN_PASSWORD}", "~*", "&*", "+@all")
        default.execute_command("ACL", "SETUSER", "default", "off")
    admin = sync_redis.Redis(
        host=server.host, port=server.port, username=ADMIN_USER, password=ADMIN_PASSWORD, decode_responses=True
    )
    try:
        yield server.port, admin
    finally:
        admin.close()
        server.stop()


@pytest.fixture(scope="module")
def acl_rights(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Iterator[None]:
    """manifests/redis-acl's RBAC beside manifests/rbac, for this module's operators only."""
    files = [arg for path in ACL_RBAC for arg in ("-f", str(path))]
    kubectl_checked(kube_cluster, "apply", "--server-side", "--field-manager=phoenix-tests", *files)
    yield
    kubectl_checked(kube_cluster, "delete", "--ignore-not-found", *files)


def _acl_operator(
    plane: ControlPlane, kubeconfig: Path, port: int, log_name: str, *options: str
) -> AbstractContextManager[ServingOperator]:
    """The admin Secret in the operator's namespace, and an operator with Redis ACL users on."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ADMIN_SECRET, "namespace": OPERATOR_NAMESPACE},
        "stringData": {"url": f"redis://{ADMIN_USER}:{ADMIN_PASSWORD}@127.0.0.1:{port}/0"},
    }
    kubectl_apply(plane, [secret])
    args = ["--all-namespaces", f"--redis-acl-admin-secret={ADMIN_SECRET}", *options]
    return serving_operator(plane, kubeconfig, args, log_name=log_name, env={"POD_NAMESPACE": OPERATOR_NAMESPACE})


@pytest.fixture
def operator(
    kube_cluster: ControlPlane, operator_kubeconfig: Path, acl_rights: None, valkey: tuple[int, sync_redis.Redis]
) -> Iterator[ServingOperator]:
    with _acl_operator(kube_cluster, operator_kubeconfig, valkey[0], "operator-acl") as served:
        yield served


def _pipeline(port: int, namespace: str) -> list[dict[str, Any]]:
    """The tenant's Secret (the Redis's address only: no user, no password) and its two stages, ingest -> store."""
    url = f"redis://127.0.0.1:{port}/0"
    one_pod = {"replicas": {"min": 1, "max": 1}}
    secret, ingest = final_stage(
        url,
        namespace,
        "ingest",
        processor="tests.processors:TenantProbeProcessor",
        output={"stage": "store"},
        **one_pod,
    )
    store = final_stage(url, namespace, "store", processor="tests.processors:TenantStoreProcessor", **one_pod)[1]
    return [secret, ingest, store]


def _counts(admin: sync_redis.Redis, namespace: str) -> dict[str, int]:
    return {str(k): int(v) for k, v in admin.hgetall(shared_data_key(namespace, "delivered", "counts")).items()}


def _send(admin: sync_redis.Redis, namespace: str, stage: str, record_id: str, data: dict[str, Any]) -> None:
    fields = {"record_id": record_id, "user_id": "u1", "data": json.dumps(data)}
    admin.xadd(f"phoenix:{{{namespace}}}:{stage}:input", fields)  # type: ignore[arg-type]


def _users(admin: sync_redis.Redis) -> list[str]:
    return list(admin.execute_command("ACL", "USERS"))


def _container_env(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    deployment = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    return {var.name: var for var in spec_of(spec_of(deployment).template).containers[0].env or []}


@pytest.mark.timeout(300)
def test_each_namespaces_workers_reach_only_its_keys_and_its_user_goes_with_its_last_stage(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    neighbour: str,
    kubelet_player: PlayKubelet,
    valkey: tuple[int, sync_redis.Redis],
) -> None:
    port, admin = valkey
    team_a, team_b = kube_namespace, neighbour
    for team in (team_a, team_b):
        kubectl_apply(kube_cluster, _pipeline(port, team))
        for stage in ("ingest", "store"):
            kubelet_player(team, stage, PYTHONPATH).start()
    for team in (team_a, team_b):
        for stage in ("ingest", "store"):
            wait_ready(kube_cluster, team, stage, timeout=90)
    # Each namespace has its user, its password in its Secret, given to its workers and to KEDA.
    for team in (team_a, team_b):
        user = f"phoenix.{team}.{_kube_system_uid(kube_api)}"
        assert user in _users(admin)
        env = _container_env(kube_api, team, "ingest")
        assert env["REDIS_USERNAME"].value == user
        assert env["REDIS_PASSWORD"].value_from.secret_key_ref.name == REDIS_USER_SECRET
        assert set(_secret_data(kube_api, team)) == {"username", "password"}
        authentication = custom_object(
            client.CustomObjectsApi(kube_api), "keda.sh", "v1alpha1", team, "triggerauthentications", "ingest-redis"
        )
        assert {"parameter": "password", "name": REDIS_USER_SECRET, "key": "password"} in authentication["spec"][
            "secretTargetRef"
        ]
    # team-b's dead letter, and the figures its pipeline keeps: what team-a's processor goes for.
    theirs_dlq = f"phoenix:{{{team_b}}}:ingest:dlq"
    dead = add_entry_now(admin, theirs_dlq, {"record_id": "dead", "user_id": "u1", "data": "{}", "error": "bad"})
    theirs_counts = shared_data_key(team_b, "delivered", "counts")
    for i in range(5):
        _send(admin, team_b, "ingest", f"b{i}", {})
    eventually(lambda: _counts(admin, team_b) == {f"b{i}": 1 for i in range(5)}, "team-b's records delivered", 90)
    for i in range(3):
        _send(admin, team_a, "ingest", f"a{i}", {})
    _send(admin, team_a, "ingest", "probe", {"probe": {"stream": theirs_dlq, "entry": dead, "key": theirs_counts}})

    expected = {**{f"a{i}": 1 for i in range(3)}, "probe": 1}
    eventually(lambda: _counts(admin, team_a) == expected, "team-a's records delivered", 90)
    probes = json.loads(admin.hget(shared_data_key(team_a, "delivered", "probes"), "probe") or "{}")
    assert probes == {
        **{
            f"{who} {command}": "NoPermissionError"
            for who in ("worker", "own")
            for command in ("XDEL", "XRANGE", "DEL")
        },
        **{f"url {command}": "AuthenticationError" for command in ("XDEL", "XRANGE", "DEL")},
    }
    # Nothing of team-b's changed; both pipelines delivered everything, once.
    assert [entry_id for entry_id, _ in stream_entries_now(admin, theirs_dlq)] == [dead]
    assert _counts(admin, team_b) == {f"b{i}": 1 for i in range(5)}
    refused = {(entry["username"], entry["object"]) for entry in admin.execute_command("ACL", "LOG")}
    user_a = f"phoenix.{team_a}.{_kube_system_uid(kube_api)}"
    assert {(user_a, key) for key in (theirs_dlq, theirs_counts)} <= refused
    # Refused to anyone else: only the workers' check of the server's settings (CONFIG GET), at their start.
    assert {user for user, refusal in refused if refusal != "config|get"} == {user_a}

    # The user goes with its namespace's last stage, and its Secret with it.
    assert kube_cluster.kubectl("delete", "phoenixstage", "store", "-n", team_a, "--timeout=60s").returncode == 0
    assert user_a in _users(admin)
    assert kube_cluster.kubectl("delete", "phoenixstage", "ingest", "-n", team_a, "--timeout=60s").returncode == 0
    eventually(lambda: user_a not in _users(admin), "team-a's user removed", 60)
    eventually(
        lambda: read_or_none(client.CoreV1Api(kube_api).read_namespaced_secret, REDIS_USER_SECRET, team_a) is None,
        "team-a's user Secret deleted",
        30,
    )
    # team-b's goes on.
    _send(admin, team_b, "ingest", "b5", {})
    eventually(lambda: _counts(admin, team_b).get("b5") == 1, "team-b's pipeline going on", 60)


def _kube_system_uid(api: client.ApiClient) -> str:
    return str(metadata_of(client.CoreV1Api(api).read_namespace("kube-system")).uid)


@pytest.mark.timeout(300)
def test_the_password_rotates_the_workers_roll_and_nothing_is_lost(
    kube_cluster: ControlPlane,
    operator_kubeconfig: Path,
    acl_rights: None,
    kube_api: client.ApiClient,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    valkey: tuple[int, sync_redis.Redis],
) -> None:
    port, admin = valkey
    ns = kube_namespace
    rotation = ["--redis-acl-rotation-seconds=30", "--redis-acl-grace-seconds=10"]
    with _acl_operator(kube_cluster, operator_kubeconfig, port, "operator-acl-rotation", *rotation):
        secret, _, store = _pipeline(port, ns)
        kubectl_apply(kube_cluster, [secret, store])
        player = kubelet_player(ns, "store", PYTHONPATH)
        player.start()
        wait_ready(kube_cluster, ns, "store", timeout=90)
        user = f"phoenix.{ns}.{_kube_system_uid(kube_api)}"
        first = _secret_data(kube_api, ns)["password"]
        digest = _pod_annotations(kube_api, ns)[SECRET_VERSIONS_ANNOTATION]
        before = eventually(lambda: set(player.processes()), "the worker running")
        sent: list[str] = []
        stop = threading.Event()
        producing = threading.Thread(target=_produce, args=(admin, ns, sent, stop), daemon=True)
        producing.start()
        try:
            eventually(lambda: _secret_data(kube_api, ns)["password"] != first, "the password rotated", 90)
            assert _logs_in(port, user, first)  # still, for the grace period: workers not yet rolled reconnect
            eventually(lambda: _pod_annotations(kube_api, ns)[SECRET_VERSIONS_ANNOTATION] != digest, "a new digest", 60)
            eventually(lambda: set(player.processes()) - before, "the workers rolled", 60)
            eventually(
                lambda: PREVIOUS_PASSWORD_ANNOTATION not in _secret_annotations(kube_api, ns),
                "the replaced password's grace over",
                60,
            )
        finally:
            stop.set()
            producing.join()
        assert not _logs_in(port, user, first)
        assert len(sent) > 20
        eventually(lambda: _counts(admin, ns) == dict.fromkeys(sent, 1), "every record delivered once", 90)
        # At once, asked by removing the time of the last rotation (docs/operations.md, Redis ACL users).
        second = _secret_data(kube_api, ns)["password"]
        annotation = f"{PASSWORD_ROTATED_ANNOTATION}-"
        assert kube_cluster.kubectl("annotate", "secret", REDIS_USER_SECRET, "-n", ns, annotation).returncode == 0
        eventually(lambda: _secret_data(kube_api, ns)["password"] != second, "the password rotated on request", 30)
        # A password emptied by hand is replaced, never given to Redis.
        emptied = '{"data": {"password": ""}}'
        assert kube_cluster.kubectl("patch", "secret", REDIS_USER_SECRET, "-n", ns, "-p", emptied).returncode == 0
        eventually(lambda: len(_secret_data(kube_api, ns)["password"]) >= 32, "an emptied password replaced", 30)


def _logs_in(port: int, user: str, password: str) -> bool:
    with sync_redis.Redis(port=port, username=user, password=password) as connection:
        try:
            return bool(connection.ping())
        except sync_redis.AuthenticationError:
            return False


def _pod_annotations(api: client.ApiClient, namespace: str) -> dict[str, str]:
    deployment = client.AppsV1Api(api).read_namespaced_deployment("store", namespace)
    return dict(metadata_of(spec_of(deployment).template).annotations or {})


def _produce(admin: sync_redis.Redis, namespace: str, sent: list[str], stop: threading.Event) -> None:
    while not stop.wait(0.2):
        record_id = f"r{len(sent)}"
        _send(admin, namespace, "store", record_id, {})
        sent.append(record_id)


def _secret(api: client.ApiClient, namespace: str) -> client.V1Secret:
    return client.CoreV1Api(api).read_namespaced_secret(REDIS_USER_SECRET, namespace)


def _secret_data(api: client.ApiClient, namespace: str) -> dict[str, str]:
    """The user Secret's values, decoded."""
    return {key: base64.b64decode(value).decode() for key, value in (_secret(api, namespace).data or {}).items()}


def _secret_annotations(api: client.ApiClient, namespace: str) -> dict[str, str]:
    return dict(metadata_of(_secret(api, namespace)).annotations or {})
