"""The worker Deployment the operator builds, created on the real API server and its pods played by the kubelet
player (tests/fixtures/kubelet_player.py: `env` over `envFrom`, from the real ConfigMap): a ConfigMap of
spec.pod.envFrom cannot set the operator's variables. Each pod is its own consumer, by its name, whatever
CONSUMER_NAME the ConfigMap says; a final stage forwards nowhere whatever OUTPUT_QUEUE it says; and a variable of
the worker's in another letter case (`redis_url`) stops the worker with one line naming both spellings.
`make e2e` shows the same with the real kubelet (tests/e2e/test_pod_shaping.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis as sync_redis
from kubernetes import client

from phoenix.crds import PhoenixStage
from phoenix.keys import StageKeys
from phoenix.operator.builders import Owner, build_deployment
from tests.fixtures.control_plane import REPO_ROOT, ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.kube_models import name_of, status_of, uid_of
from tests.fixtures.kubelet_player import KubeletPlayer
from tests.fixtures.operator_process import final_stage, kubectl_apply

pytestmark = pytest.mark.kube

STAGE = "clash"
# Keys of the operator's own variables, as a team's shared settings ConfigMap might hold them.
RESERVED_IN_CONFIG_MAP = {"CONSUMER_NAME": "same-for-all", "OUTPUT_QUEUE": "phoenix:{elsewhere}:stolen:input"}


Deploy = Callable[[dict[str, str]], KubeletPlayer]


@pytest.fixture
def deploy(
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    redis_url: str,
) -> Deploy:
    """`deploy(settings)`: a ConfigMap of `settings`, the stage reading it through spec.pod.envFrom (no operator
    runs: nothing acts on it), the Deployment built for it, and the player of its pods."""

    def deploy(settings: dict[str, str]) -> KubeletPlayer:
        client.CoreV1Api(kube_api).create_namespaced_config_map(
            kube_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="settings"), data=settings)
        )
        documents = final_stage(
            redis_url,
            kube_namespace,
            STAGE,
            processor="tests.processors:ScriptedProcessor",
            replicas={"min": 2, "max": 2},
            autoscaling={"enabled": False},
            pod={"envFrom": [{"configMapRef": {"name": "settings"}}]},
        )
        kubectl_apply(kube_cluster, documents)
        stored = json.loads(
            kube_cluster.kubectl("get", "phoenixstage", STAGE, "-n", kube_namespace, "-o", "json").stdout
        )
        stage = PhoenixStage.from_body(stored)
        owner = Owner(stage.api_version, stage.kind, STAGE, kube_namespace, stored["metadata"]["uid"])
        deployment: Any = build_deployment(owner, stage.spec)  # a plain dict, as the operator sends it
        client.AppsV1Api(kube_api).create_namespaced_deployment(kube_namespace, deployment)
        return kubelet_player(kube_namespace, STAGE, {"PYTHONPATH": str(REPO_ROOT)})

    return deploy


def _pods(api: client.ApiClient, namespace: str) -> list[client.V1Pod]:
    return [pod for pod in client.CoreV1Api(api).list_namespaced_pod(namespace).items if uid_of(pod)]


@pytest.mark.timeout(120)
def test_an_env_from_config_map_cannot_set_the_operators_variables(
    deploy: Deploy, kube_api: client.ApiClient, kube_namespace: str, redis_url: str
) -> None:
    player = deploy({**RESERVED_IN_CONFIG_MAP, "LOG_LEVEL": "debug"})
    keys = StageKeys.for_stage(STAGE, kube_namespace)
    with sync_redis.Redis.from_url(redis_url, decode_responses=True) as redis:

        def consumers() -> set[str] | None:
            player.sync()
            if not redis.exists(keys.input):
                return None
            names = {str(c["name"]) for c in redis.xinfo_consumers(keys.input, keys.consumer_group)}
            return names if len(names) == 2 else None

        # Each pod reads under its own name (one shared name would make them take each other's pending entries).
        assert eventually(consumers, "a consumer per pod") == {name_of(pod) for pod in _pods(kube_api, kube_namespace)}
        redis.xadd(keys.input, {"record_id": "r1", "user_id": "u1", "data": "{}"})

        def done() -> bool:
            player.sync()
            (group,) = redis.xinfo_groups(keys.input)
            return bool(group["entries-read"] == 1 and group["pending"] == 0)

        eventually(done, "r1 read and acknowledged")
        assert not redis.exists(RESERVED_IN_CONFIG_MAP["OUTPUT_QUEUE"])  # a final stage: forwarded nowhere
        assert all(process.alive for process in player.processes().values())


@pytest.mark.timeout(120)
def test_a_variable_of_the_worker_in_another_letter_case_stops_it_with_one_line(
    deploy: Deploy, kube_api: client.ApiClient, kube_namespace: str
) -> None:
    player = deploy({"redis_url": "redis://:hunter2@elsewhere.invalid:6379/0", "input_queue": "other"})

    def restarted() -> list[Any] | None:
        player.sync()
        pods = _pods(kube_api, kube_namespace)
        counts = [s.restart_count for pod in pods for s in status_of(pod).container_statuses or []]
        return pods if len(counts) == 2 and min(counts) >= 1 else None

    for pod in eventually(restarted, "both workers to exit and be restarted"):
        first = player.log_path(name_of(pod)).read_text().splitlines()[0]
        assert first == (
            "phoenix worker: invalid configuration: INPUT_QUEUE is set in several letter cases (INPUT_QUEUE, "
            "input_queue); REDIS_URL is set in several letter cases (REDIS_URL, redis_url): the worker reads its "
            "variables case-insensitively and could take either value; keep one spelling"
        )
        assert "hunter2" not in player.log_path(name_of(pod)).read_text()
