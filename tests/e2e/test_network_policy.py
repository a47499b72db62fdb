"""The chart's worker NetworkPolicy on a node that enforces it (kube-router's network policy controller, started by
tests/fixtures/node): a stage's worker reaches its own Redis, through the cluster DNS, and nothing else, and only the
monitoring namespace reaches its metrics port.

The namespace `phoenix-netpol` holds the stage and its Redis set (`app.kubernetes.io/part-of: netpol-redis`: the
stage's server on 6379 and a second server of the set on 6380), `phoenix-netpol-other` another Redis on 6379. Every
connection is tried before the policy too and must succeed then, so that each refusal afterwards is the policy's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
import yaml

from phoenix.operator.builders import HEALTH_PORT
from phoenix.stages.data_keys import grouped_key, parsed_key
from tests.e2e.helm import CHART, helm
from tests.e2e.kubectl import apply_documents, is_ready, kubectl, kubectl_json, port_forward, stage_pods
from tests.e2e.pipeline import RESTRICTED, stage_document
from tests.e2e.redis_set import (
    SECRET,
    fresh_namespace,
    headless_service,
    server_statefulset,
    stage_secret,
    until_answering,
    wait_statefulsets,
)
from tests.fixtures.eventually import eventually

pytestmark = pytest.mark.e2e

# The scrapers' namespace is one of the test's own (against your cluster, its `monitoring` stays untouched).
NAMESPACE, OTHER, MONITORING = "phoenix-netpol", "phoenix-netpol-other", "phoenix-netpol-monitoring"
STAGE = "guarded"
PASSWORD = "e2e-netpol-password"
REDIS, SECOND, OTHER_REDIS = "netpol-redis", "netpol-redis-alt", "other-redis"
REDIS_SET = {"app.kubernetes.io/part-of": REDIS}
# A TCP connection from inside a pod: "open", or why not.
CONNECT = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
except OSError as error:
    print(f"refused: {error}")
else:
    print("open")
"""


def valkey(name: str, part_of: str, port: int, image: str) -> list[dict[str, Any]]:
    """One Valkey of `part_of` on `port`, its password from the namespace's stage Secret, and its DNS name."""
    args = ["--port", str(port), "--requirepass", "$(REDIS_PASSWORD)", "--save", "", "--appendonly", "no"]
    start = {"args": [*args, "--dir", "/data"]}
    return [headless_service(name, port), server_statefulset(name, part_of, 1, image, start, {"redis": port})]


def client_pod(name: str, image: str) -> dict[str, Any]:
    """A pod that only waits, to connect from (kubectl exec): the Phoenix image, for its Python."""
    container = {
        "name": "client",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sleep", "infinity"],
        "securityContext": {**RESTRICTED, "runAsUser": 65532},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]},
    }


def guarded_stage(image: str) -> dict[str, Any]:
    """The grouper's processor on the namespace's own Redis, one pod, no autoscaling (KEDA's own pods are not the
    policy's)."""
    redis = {"urlSecretRef": {"name": SECRET, "key": "url"}}
    one_pod = {"replicas": {"min": 1, "max": 1}, "autoscaling": {"enabled": False}}
    return stage_document(STAGE, "grouper", image, ("50m", "500m"), redis=redis, **one_pod)


def api_server_endpoints() -> list[str]:
    """The API server's addresses, found the way values.yaml says for networkPolicy.apiServer.to."""
    slices = kubectl_json("get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes")
    return [address for item in slices["items"] for ep in item["endpoints"] for address in ep["addresses"]]


def worker_policy(home: Path, api_server: list[str]) -> dict[str, Any]:
    """The chart's phoenix-workers policy for NAMESPACE: its Redis set on 6379 only, the scrapers of MONITORING, and
    the chart's default DNS peer (kube-system's kube-dns pods)."""
    values = {
        "networkPolicy": {
            "enabled": True,
            "workerNamespaces": [NAMESPACE],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}}}],
            "redis": [
                {
                    "to": [
                        {
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                            "podSelector": {"matchLabels": REDIS_SET},
                        }
                    ],
                    "ports": [6379],
                }
            ],
            "apiServer": {"ports": [443, 6443], "to": [{"ipBlock": {"cidr": f"{ip}/32"}} for ip in api_server]},
        }
    }
    rendered = helm(
        "template",
        "phoenix",
        str(CHART),
        "--namespace=phoenix-system",
        "--show-only=templates/network-policy.yaml",
        "--values=-",
        home=home,
        input=yaml.safe_dump(values),
    )
    [policy] = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["metadata"]["namespace"] == NAMESPACE]
    return policy


@dataclass(frozen=True)
class Guarded:
    api_server: list[str]
    helm_home: Path


@pytest.fixture(scope="module")
def guarded(
    operator_installed: None, phoenix_image: str, valkey_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Guarded]:
    """The three namespaces with their Redis servers and client pods, and the stage's worker Ready; no policy yet."""
    with fresh_namespace(NAMESPACE), fresh_namespace(OTHER), fresh_namespace(MONITORING):
        url = f"redis://:{PASSWORD}@{REDIS}:6379/0"
        apply_documents(
            [
                stage_secret(url, PASSWORD),
                *valkey(REDIS, REDIS, 6379, valkey_image),
                *valkey(SECOND, REDIS, 6380, valkey_image),
                client_pod("outsider", phoenix_image),
            ],
            NAMESPACE,
        )
        apply_documents([stage_secret(url, PASSWORD), *valkey(OTHER_REDIS, OTHER_REDIS, 6379, valkey_image)], OTHER)
        apply_documents([client_pod("scraper", phoenix_image)], MONITORING)
        wait_statefulsets(NAMESPACE, (REDIS, SECOND))
        wait_statefulsets(OTHER, (OTHER_REDIS,))
        for namespace, pod in ((NAMESPACE, "outsider"), (MONITORING, "scraper")):
            kubectl("wait", "-n", namespace, "--for=condition=Ready", f"pod/{pod}", "--timeout=180s", timeout=210)
        apply_documents([guarded_stage(phoenix_image)], NAMESPACE)
        worker()
        yield Guarded(api_server_endpoints(), tmp_path_factory.mktemp("helm-home"))


def worker(other_than: str = "") -> dict[str, Any]:
    """The stage's one Ready worker pod (one that is not `other_than`)."""

    def ready() -> dict[str, Any] | None:
        found = [pod for pod in stage_pods(NAMESPACE, STAGE) if pod["metadata"]["name"] != other_than]
        return found[0] if len(found) == 1 and is_ready(found[0]) else None

    return eventually(ready, f"a Ready worker of {STAGE}", timeout=180, interval=1)


def connect(namespace: str, pod: str, host: str, port: int) -> str:
    """Whether `pod` (its first container) opens a TCP connection to host:port: "open" or "refused: <why>"."""
    return kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", CONNECT, host, str(port)).strip()


def from_worker(pod: str, api_server: list[str]) -> dict[str, str]:
    """What the worker reaches: its Redis, its Redis set's other server, another namespace's Redis, the API server
    (its Service, and its endpoint as the Service translates to)."""
    targets = {
        "own redis": (REDIS, 6379),
        "own set, port 6380": (SECOND, 6380),
        "other redis": (f"{OTHER_REDIS}.{OTHER}.svc", 6379),
        "api server service": ("kubernetes.default.svc", 443),
        **{f"api server {ip}": (ip, 6443) for ip in api_server},
    }
    return {what: connect(NAMESPACE, pod, host, port) for what, (host, port) in targets.items()}


def to_metrics(worker_ip: str) -> dict[str, str]:
    """Who reaches the worker's metrics port: a pod of its own namespace, a pod of MONITORING."""
    return {
        "from its namespace": connect(NAMESPACE, "outsider", worker_ip, HEALTH_PORT),
        "from monitoring": connect(MONITORING, "scraper", worker_ip, HEALTH_PORT),
    }


def scraped(worker_ip: str) -> str:
    """/metrics of the worker as the monitoring namespace's pod reads it."""
    fetch = f"import urllib.request; print(urllib.request.urlopen('http://{worker_ip}:{HEALTH_PORT}/metrics').read())"
    return kubectl("exec", "-n", MONITORING, "scraper", "--", "python3", "-c", fetch)


def processes_a_record() -> None:
    """A record through the worker: its findings written beside it, the grouped result written by the worker."""
    stage = kubectl_json("get", "phoenixstage", "-n", NAMESPACE, STAGE)
    record_id = uuid.uuid4().hex
    with port_forward(NAMESPACE, f"pod/{REDIS}-0", 6379) as port:
        client = redis_client.Redis(port=port, password=PASSWORD, decode_responses=True)
        until_answering([client])
        client.set(parsed_key(NAMESPACE, record_id), json.dumps({"biomarkers": []}))
        client.xadd(stage["status"]["streams"]["input"], {"record_id": record_id})
        key = grouped_key(NAMESPACE, record_id)
        eventually(lambda: client.exists(key), f"the worker to write {key}", timeout=60, interval=0.5)
        client.close()


def connections(title: str, seen: dict[str, str]) -> str:
    return f"{title}\n" + "".join(f"  {what:<28} {outcome}\n" for what, outcome in seen.items())


def test_the_worker_policy_admits_its_redis_and_dns_and_scrapes_from_monitoring_only(
    guarded: Guarded, report_dir: Path
) -> None:
    before = worker()
    reached = {**from_worker(before["metadata"]["name"], guarded.api_server), **to_metrics(before["status"]["podIP"])}
    evidence = connections("without a policy", reached)
    (report_dir / "network-policy.txt").write_text(evidence)
    # Without a policy the node lets every connection through: what is refused below is the policy's doing.
    assert set(reached.values()) == {"open"}, evidence

    apply_documents([worker_policy(guarded.helm_home, guarded.api_server)], NAMESPACE)
    # A pod started under the policy: its Redis and DNS connections are all new (a connection made before the
    # policy would be let through as established).
    kubectl("delete", "pod", "-n", NAMESPACE, before["metadata"]["name"], "--wait=false")
    after = worker(other_than=before["metadata"]["name"])
    processes_a_record()

    name, ip = after["metadata"]["name"], after["status"]["podIP"]
    enforced: dict[str, str] = {}

    def refused_elsewhere() -> bool:
        enforced.update(from_worker(name, guarded.api_server))
        return enforced["other redis"] != "open"

    try:
        eventually(refused_elsewhere, "the node to enforce the policy on the new pod", timeout=60, interval=2)
    finally:
        enforced.update(to_metrics(ip))
        evidence += connections("with the chart's worker policy (a new worker pod)", enforced)
        (report_dir / "network-policy.txt").write_text(evidence)
    allowed = {"own redis", "from monitoring"}
    assert {what for what, outcome in enforced.items() if outcome == "open"} == allowed, evidence
    assert all(enforced[what].startswith("refused") for what in enforced.keys() - allowed), evidence
    assert "phoenix_" in scraped(ip)
