"""A rotated Redis password reaches the workers and the operator: `phoenix operator` with the manifests/rbac
identity (Secrets: get only) against the local control plane, real `phoenix worker` processes played from the
Deployment it writes, and a real Valkey whose ACL user changes its password mid-run."""

from __future__ import annotations

import asyncio
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
from phoenix.kube_names import REDIS_SECRETS_ANNOTATION
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


def _secret(namespace: str, url: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "rotating-redis", "namespace": namespace},
        "type": "Opaque",
        "stringData": {"url": url},
    }


def _stage(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": STAGE, "namespace": namespace},
        "spec": {
            "processor": "tests.processors:ScriptedProcessor",
            "image": "unused:1",
            "output": {"stream": OUTPUT},
            "redis": {"urlSecretRef": {"name": "rotating-redis", "key": "url"}},
            "replicas": {"min": 1, "max": 1},
            "autoscaling": {"enabled": False},
            "worker": {"concurrency": 4, "claimIdleMs": 2000, "lockTimeout": 5},
        },
    }


def _template_digest(api: client.ApiClient, namespace: str) -> str | None:
    deployment = read_or_none(client.AppsV1Api(api).read_namespaced_deployment, STAGE, namespace)
    if deployment is None:
        return None
    return (metadata_of(spec_of(deployment).template).annotations or {}).get(REDIS_SECRETS_ANNOTATION)


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
