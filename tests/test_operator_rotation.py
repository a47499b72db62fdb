"""A rotated Redis password reaches the workers and the operator: `phoenix operator` with the manifests/rbac
identity (Secrets: get only) against the local control plane, real `phoenix worker` processes played from the
Deployment it writes, and a real Valkey whose ACL user changes its password mid-run."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from kubernetes import client

from phoenix.keys import StageKeys
from phoenix.kube_names import SECRET_VERSIONS_ANNOTATION
from phoenix.operator.redis.pool import RedisPool
from phoenix.redis_spec import RedisSpec
from tests.fixtures.chain import enqueue
from tests.fixtures.control_plane import REPO_ROOT, ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.kube_models import metadata_of, name_of, spec_of
from tests.fixtures.operator_process import (
    health,
    kubectl_apply,
    read_or_none,
    redis_db_url,
    running_operator,
    stage_condition,
)
from tests.fixtures.replies import stream_entries_now
from tests.fixtures.workers import FAST

STAGE, OUTPUT = "rotating", "rotated:out"


@pytest.fixture
def acl_user(redis_url: str) -> Iterator[tuple[str, sync_redis.Redis]]:
    """An ACL user of its own on the session's Valkey (any key, any command), removed afterwards."""
    name = f"rot-{uuid.uuid4().hex[:6]}"
    with sync_redis.Redis.from_url(redis_db_url(redis_url, 11), decode_responses=True) as admin:
        admin.flushdb()
        admin.acl_setuser(
            name, enabled=True, passwords=["+old-password"], keys=["*"], channels=["*"], commands=["+@all"]
        )
        try:
            yield name, admin
        finally:
            admin.acl_deluser(name)


def _url(redis_url: str, user: str, password: str) -> str:
    host_port = redis_url.split("://", 1)[1].rsplit("@", 1)[-1].split("/", 1)[0]
    return f"redis://{user}:{password}@{host_port}/11"


def _opaque(namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    metadata = {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": data}


def _one_worker_stage(namespace: str, name: str, processor: str, **spec: Any) -> dict[str, Any]:
    """A stage of one worker, no autoscaling, its Redis URL in the Secret `<name>-redis` (key `url`)."""
    return {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "processor": processor,
            "image": "unused:1",
            "redis": {"urlSecretRef": {"name": f"{name}-redis", "key": "url"}},
            "replicas": {"min": 1, "max": 1},
            "autoscaling": {"enabled": False},
            **spec,
        },
    }


def _secret(namespace: str, url: str) -> dict[str, Any]:
    return _opaque(namespace, f"{STAGE}-redis", {"url": url})


def _stage(namespace: str) -> dict[str, Any]:
    worker = {"concurrency": 4, "claimIdleMs": 2000, "lockTimeout": 5}
    return _one_worker_stage(
        namespace, STAGE, "tests.processors:ScriptedProcessor", output={"stream": OUTPUT}, worker=worker
    )


def _template_digest(api: client.ApiClient, namespace: str) -> str | None:
    deployment = read_or_none(client.AppsV1Api(api).read_namespaced_deployment, STAGE, namespace)
    if deployment is None:
        return None
    return (metadata_of(spec_of(deployment).template).annotations or {}).get(SECRET_VERSIONS_ANNOTATION)


def _live_pods(api: client.ApiClient, namespace: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={STAGE}")
    return [pod for pod in pods.items if metadata_of(pod).deletion_timestamp is None]


def _arrived(admin: sync_redis.Redis) -> Counter[str]:
    return Counter(fields["record_id"] for _, fields in stream_entries_now(admin, OUTPUT))


def _enqueue(url: str, keys: StageKeys, ids: list[str]) -> None:
    async def run() -> None:
        async with aioredis.Redis.from_url(url, decode_responses=True) as redis:
            await enqueue(redis, keys.input, ids, action="sleep:0.2")

    asyncio.run(run())


@pytest.mark.timeout(270)
@pytest.mark.kube
def test_a_rotated_password_rolls_the_workers_and_the_operator_follows_with_nothing_lost(
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: Path,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    redis_url: str,
    acl_user: tuple[str, sync_redis.Redis],
) -> None:
    user, admin = acl_user
    ns = kube_namespace
    keys = StageKeys.for_stage(STAGE, ns)
    old_url, new_url = _url(redis_url, user, "old-password"), _url(redis_url, user, "new-password")
    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-rotation") as (process, liveness):
        kubectl_apply(kube_cluster, [_secret(ns, old_url), _stage(ns)])
        eventually(lambda: _template_digest(kube_api, ns) is not None, "the Deployment with its Secrets' digest")
        before = _template_digest(kube_api, ns)
        # FAST timings, and this checkout's code for the processes the player starts.
        kubelet_player(ns, STAGE, {**FAST, "PYTHONPATH": str(REPO_ROOT)}).start()
        _enqueue(old_url, keys, [f"a-{i}" for i in range(150)])
        eventually(lambda: len(_arrived(admin)) >= 20, "records flowing before the rotation", timeout=90)
        old_pods = {name_of(pod) for pod in _live_pods(kube_api, ns)}

        # The rotation as a platform team does it: the server takes both passwords, the Secret moves, and the
        # old password goes once nothing uses it.
        admin.acl_setuser(user, enabled=True, passwords=["+new-password"])
        kubectl_apply(kube_cluster, [_secret(ns, new_url)])
        _enqueue(new_url, keys, [f"b-{i}" for i in range(150)])
        eventually(lambda: _template_digest(kube_api, ns) not in (None, before), "a new digest in the template")

        def rolled() -> bool:
            pods = _live_pods(kube_api, ns)
            return bool(pods) and not {name_of(pod) for pod in pods} & old_pods

        eventually(rolled, "the workers rolled", timeout=120)
        admin.acl_setuser(user, enabled=True, passwords=["-old-password"])
        admin.execute_command("CLIENT", "KILL", "USER", user)  # connections made with the old password go too
        _enqueue(new_url, keys, [f"c-{i}" for i in range(50)])

        expected = {f"{batch}-{i}" for batch, count in (("a", 150), ("b", 150), ("c", 50)) for i in range(count)}
        eventually(lambda: set(_arrived(admin)) == expected, "every record processed", timeout=180)
        assert max(_arrived(admin).values()) == 1, "a record was forwarded twice"
        assert admin.xlen(keys.dlq) == 0
        eventually(lambda: admin.xpending(keys.input, keys.consumer_group)["pending"] == 0, "nothing pending")

        # The operator's own client follows the Secret: after the old password went (and its connections with it),
        # its refresh cycles read this stage's Redis without a failure, the only Redis this operator serves.
        def refreshed() -> bool:
            last = health(liveness)["statusRefresh"].get("last") or {}
            ready = stage_condition(kube_cluster, ns, STAGE)
            return last.get("stages") == 1 and last.get("redis_failures") == 0 and ready.get("status") == "True"

        eventually(refreshed, "a refresh cycle with the new password", timeout=60)
        assert process.alive, process.failure("died during the rotation")


VENDOR = "vendor"


def _vendor_stage(namespace: str) -> dict[str, Any]:
    """A stage whose processor quotes the variables it is told to in its errors (dead-lettered): one from a Secret
    by spec.env's secretKeyRef, the keys of another by spec.pod.envFrom's secretRef."""
    return _one_worker_stage(
        namespace,
        VENDOR,
        "tests.processors:EnvQuotingProcessor",
        env=[{"name": "VENDOR_TOKEN", "secretKeyRef": {"name": "vendor-token", "key": "token"}}],
        pod={"envFrom": [{"secretRef": {"name": "vendor-api"}}]},
    )


def _template(api: client.ApiClient, namespace: str) -> tuple[dict[str, str], dict[str, str]]:
    """The worker pod template's annotations and its literal env."""
    deployment = read_or_none(client.AppsV1Api(api).read_namespaced_deployment, VENDOR, namespace)
    if deployment is None:
        return {}, {}
    template = spec_of(deployment).template
    (worker,) = spec_of(template).containers
    return metadata_of(template).annotations or {}, {var.name: var.value for var in worker.env or () if var.value}


def _versions(api: client.ApiClient, namespace: str, *names: str) -> str:
    """What the pod template must carry: `name=resourceVersion` of each Secret, by name."""
    read = client.CoreV1Api(api).read_namespaced_secret
    return ",".join(f"{name}={metadata_of(read(name, namespace)).resource_version}" for name in sorted(names))


@pytest.mark.timeout(270)
@pytest.mark.kube
@pytest.mark.parametrize("redis_db", [12], indirect=True)
def test_the_pods_own_secrets_are_masked_and_rotating_one_rolls_the_workers(
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: Path,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    """The operator tells the workers which variables come from Secrets (MASKED_ENV, the envFrom Secret's keys read
    with a `get`), so their values are masked in the DLQ and the logs; the pod template carries the Secrets'
    resourceVersions, no secret material; a key added to the envFrom Secret, and a rotated spec.env Secret (as
    BILLING_MASTER_KEY would be), roll the workers, and the new values are masked too."""
    url, admin = redis_db
    ns = kube_namespace
    keys = StageKeys.for_stage(VENDOR, ns)
    token, new_token, extra = (f"{what}-{uuid.uuid4().hex}" for what in ("token", "new-token", "extra"))
    pin = str(100 + uuid.uuid4().int % 900)  # short: masked as a whole token
    names = ("vendor-api", "vendor-redis", "vendor-token")
    secrets = [
        _opaque(ns, "vendor-redis", {"url": url}),
        _opaque(ns, "vendor-token", {"token": token}),
        _opaque(ns, "vendor-api", {"API_PIN": pin}),
    ]
    dead: list[str] = []

    def dead_letter(*quote: str) -> str:
        data = json.dumps({"quote": quote, "permanent": True})
        admin.xadd(keys.input, {"record_id": f"r{len(dead)}", "user_id": "u", "data": data})
        eventually(lambda: admin.xlen(keys.dlq) > len(dead), f"the dead letter quoting {quote}", timeout=60)
        dead.append(stream_entries_now(admin, keys.dlq)[-1][1]["error"])
        return dead[-1]

    def new_workers(old: set[str]) -> set[str]:
        def rolled() -> set[str] | None:
            running = set(player.processes())
            return running if running and not running & old else None

        return eventually(rolled, "the workers rolled", timeout=120)

    def masked_env() -> str | None:
        return _template(kube_api, ns)[1].get("MASKED_ENV")

    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-pod-secrets") as (process, _):
        kubectl_apply(kube_cluster, [*secrets, _vendor_stage(ns)])
        eventually(lambda: _template(kube_api, ns)[0].get(SECRET_VERSIONS_ANNOTATION), "the template's versions")
        annotations = _template(kube_api, ns)[0]
        assert annotations[SECRET_VERSIONS_ANNOTATION] == _versions(kube_api, ns, *names)
        assert "phoenix.io/redis-secrets" not in annotations
        assert masked_env() == "API_PIN,VENDOR_TOKEN"
        player = kubelet_player(ns, VENDOR, {**FAST, "PYTHONPATH": str(REPO_ROOT)})
        player.start()
        first = eventually(lambda: set(player.processes()) or None, "a worker running", timeout=60)
        assert dead_letter("VENDOR_TOKEN", "API_PIN") == "VENDOR_TOKEN=*** API_PIN=***"

        # A key added to the envFrom Secret: a rotation that brings a variable the workers did not have.
        kubectl_apply(kube_cluster, [_opaque(ns, "vendor-api", {"API_PIN": pin, "API_EXTRA": extra})])
        eventually(lambda: masked_env() == "API_EXTRA,API_PIN,VENDOR_TOKEN", "MASKED_ENV with the new key")
        second = new_workers(first)
        assert dead_letter("VENDOR_TOKEN", "API_PIN", "API_EXTRA") == "VENDOR_TOKEN=*** API_PIN=*** API_EXTRA=***"

        # The spec.env Secret rotated (BILLING_MASTER_KEY would be one): the workers roll onto the new value.
        kubectl_apply(kube_cluster, [_opaque(ns, "vendor-token", {"token": new_token})])
        third = new_workers(second)
        assert dead_letter("VENDOR_TOKEN") == "VENDOR_TOKEN=***"
        assert _template(kube_api, ns)[0][SECRET_VERSIONS_ANNOTATION] == _versions(kube_api, ns, *names)
        assert process.alive, process.failure("died during the rotations")
    logs = "\n".join(player.log_path(pod).read_text() for pod in first | second | third)
    assert "vendor_call_failed" in logs
    for text in (logs, json.dumps(dead)):
        for value in (token, extra, new_token):
            assert value not in text
        assert not re.search(rf"(?<!\w){pin}(?!\w)", text)


@pytest.mark.timeout(150)
@pytest.mark.kube
@pytest.mark.parametrize("redis_db", [12], indirect=True)
def test_the_digest_an_earlier_operator_left_in_the_pod_template_is_removed(
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    operator_kubeconfig: Path,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    """phoenix.io/redis-secrets, a salted SHA-256 of the Redis password that anyone who may read a Deployment could
    try passwords against, goes at the first reconcile of an operator of this version."""
    ns = kube_namespace
    retired = {"spec": {"template": {"metadata": {"annotations": {"phoenix.io/redis-secrets": "5d41402abc4b2a76"}}}}}
    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-retired-1"):
        kubectl_apply(kube_cluster, [_opaque(ns, "vendor-redis", {"url": redis_db[0]}), _vendor_stage(ns)])
        eventually(lambda: SECRET_VERSIONS_ANNOTATION in _template(kube_api, ns)[0], "the Deployment")
    client.AppsV1Api(kube_api).patch_namespaced_deployment(VENDOR, ns, retired)  # as an earlier operator wrote it
    assert "phoenix.io/redis-secrets" in _template(kube_api, ns)[0]
    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-retired-2"):
        eventually(lambda: "phoenix.io/redis-secrets" not in _template(kube_api, ns)[0], "the digest removed")


async def test_a_client_refused_for_its_credentials_is_built_again(redis_url: str) -> None:
    """A rotation on the server's side before the Secret moves: the operator drops the refused client, so that
    the next use connects afresh instead of failing on a cached connection for ever."""
    pool = RedisPool()
    target = RedisSpec.from_url(_url(redis_url, "nobody", "wrong"))
    refused = pool.client(target)
    with pytest.raises(sync_redis.AuthenticationError) as caught:
        await refused.ping()
    assert pool.failed(target, caught.value)
    assert pool.client(target) is not refused
    # Any other failure keeps the client: it reconnects by itself once Redis answers again.
    unreachable = RedisSpec.from_url("redis://127.0.0.1:1/0")
    kept = pool.client(unreachable)
    with pytest.raises(sync_redis.ConnectionError) as caught_unreachable:
        await kept.ping()
    assert not pool.failed(unreachable, caught_unreachable.value)
    assert pool.client(unreachable) is kept
    await pool.close()
    await refused.aclose()
