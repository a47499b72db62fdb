"""What the e2e tests on a Redis set of their own share (test_cluster.py on the Valkey Cluster of valkey_cluster.py,
test_sentinel.py on the Sentinel set of sentinel.py): the namespace they own, the objects a set is made of (its
stage Secret, headless Services, StatefulSets of restricted server pods), waiting for them, and the router stage on
the set, watched for its replicas; and the wait for a client through a fresh port-forward (conftest's too)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis as redis_client

from tests.e2e.kubectl import is_ready, kubectl, kubectl_json, pods
from tests.e2e.pipeline import DOCUMENTS_URL, FETCH_IN_CLUSTER, RESTRICTED
from tests.e2e.pipeline import NAMESPACE as PIPELINE_NAMESPACE

# The pipeline's documents server, from another namespace.
DOCUMENTS = DOCUMENTS_URL.replace("documents:", f"documents.{PIPELINE_NAMESPACE}.svc:")
# The stage's Secret, which the set's servers also read their password from.
SECRET = "phoenix-redis"


@contextlib.contextmanager
def fresh_namespace(namespace: str) -> Iterator[None]:
    """`namespace` created empty (an earlier run's deleted first), deleted afterwards without waiting."""
    kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true", timeout=300)
    kubectl("create", "namespace", namespace)
    yield
    kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def stage_secret(url: str, password: str) -> dict[str, Any]:
    """The Secret the stage's spec.redis names: the set's URL and password."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "type": "Opaque",
        "stringData": {"url": url, "password": password},
    }


def headless_service(name: str, port: int) -> dict[str, Any]:
    """The Service that gives each pod of StatefulSet `name` its DNS name. Not-ready pods get theirs too: a node
    is resolved by its peers (a Sentinel, a cluster node) before it answers."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "redis", "port": port, "targetPort": "redis"}],
        },
    }


def server_statefulset(
    name: str,
    part_of: str,
    replicas: int,
    image: str,
    start: dict[str, list[str]],
    ports: dict[str, int],
    volumes: dict[str, tuple[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """`replicas` pods of one server container under the restricted standard, started by `start` (the container's
    `args` or `command`), its password from the stage Secret as $REDIS_PASSWORD, `ports` by name ("redis" is
    probed), a writable emptyDir at /data and `volumes` by name: (mount path, source), a Secret's read-only."""
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": part_of}
    mounted = {**(volumes or {}), "data": ("/data", {"emptyDir": {}})}
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        **start,
        "env": [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "password"}}}],
        "ports": [{"name": port_name, "containerPort": port} for port_name, port in ports.items()],
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {**RESTRICTED, "runAsUser": 65532, "runAsGroup": 65532},
        "volumeMounts": [
            {"name": volume, "mountPath": path, **({"readOnly": True} if "secret" in source else {})}
            for volume, (path, source) in mounted.items()
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    # fsGroup: the server's user reads a mounted Secret (mode 0440).
                    "securityContext": {
                        "runAsNonRoot": True,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": [{"name": volume, **source} for volume, (_, source) in mounted.items()],
                },
            },
        },
    }


def wait_statefulsets(namespace: str, names: tuple[str, ...], timeout: int = 240) -> None:
    """Every pod of each StatefulSet rolled out and ready."""
    for name in names:
        kubectl(
            "rollout", "status", "-n", namespace, f"statefulset/{name}", f"--timeout={timeout}s", timeout=timeout + 30
        )


def until_answering(clients: list[redis_client.Redis], timeout: float = 30) -> None:
    """Each client answers PING (a fresh port-forward takes a moment to accept connections)."""
    deadline = time.monotonic() + timeout
    for client in clients:
        while True:
            try:
                client.ping()
                break
            except redis_client.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def router_stage(
    name: str, image: str, output: str, max_replicas: int, redis: dict[str, Any], lag_count: int = 10, **spec: Any
) -> dict[str, Any]:
    """The router's processor as a final stage on the set through the stage Secret (`redis`: the rest of
    spec.redis; `spec`: more fields), CPU-limited so that a backlog lasts, KEDA's polling and cooldown shortened."""
    return {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": name},
        "spec": {
            "processor": "router",
            "image": image,
            "output": {"stream": output},
            "redis": {
                "urlSecretRef": {"name": SECRET, "key": "url"},
                "passwordSecretRef": {"name": SECRET, "key": "password"},
                **redis,
            },
            "replicas": {"min": 0, "max": max_replicas},
            "autoscaling": {"lagCount": lag_count, "pollingInterval": 2, "cooldownPeriod": 15},
            "worker": {"claimIdleMs": 5000, "lockTimeout": 20},
            "resources": {"requests": {"cpu": "50m", "memory": "96Mi"}, "limits": {"cpu": "150m", "memory": "256Mi"}},
            **spec,
            "env": [*spec.get("env", []), FETCH_IN_CLUSTER],
        },
    }


class StageReplicas:
    """The replicas of one stage's Deployment as a test waits on them, every desired count seen kept (`peak`)."""

    def __init__(self, namespace: str, stage: str) -> None:
        self.namespace, self.stage = namespace, stage
        self.desired_seen: list[int] = []

    def now(self) -> tuple[int, int]:
        """(the Deployment's desired replicas, ready pods)."""
        desired = kubectl_json("get", "deployment", "-n", self.namespace, self.stage)["spec"].get("replicas", 0)
        self.desired_seen.append(desired)
        return desired, sum(is_ready(pod) for pod in pods(self.namespace, f"phoenix.io/stage={self.stage}"))

    @property
    def peak(self) -> int:
        return max(self.desired_seen)

    def until(self, condition: Callable[..., bool], what: str, timeout: float) -> None:
        """Polls `condition` every second; past `timeout` fails saying what it waited for and the replicas.
        (`...`: a condition may bind loop variables as defaults of its lambda.)"""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what} (replicas desired/ready: {self.now()})")
            time.sleep(1)
