"""The chart's NetworkPolicies on a node that enforces them (kube-router's network policy controller, started by
tests/fixtures/node): a stage's worker reaches its own Redis, through the cluster DNS, and nothing else; the operator
its API server and the stages' Redis, and not another Redis; only the scrapers' namespace reaches their metrics port.

The namespace `phoenix-netpol` holds the stage and its Redis set (`app.kubernetes.io/part-of: netpol-redis`: the
stage's server on 6379 and a second server of the set on 6380), `phoenix-netpol-other` another Redis on 6379. Every
connection is tried before the policy too and must succeed then, so that each refusal afterwards is the policy's;
what was tried is in the run's network-policy.txt."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
import yaml

from phoenix.operator.builders import HEALTH_PORT
from phoenix.stages.data_keys import grouped_key, parsed_key
from tests.e2e.helm import CHART, helm
from tests.e2e.kubectl import (
    OPERATOR_NAMESPACE,
    OPERATOR_PODS,
    apply_documents,
    is_ready,
    kubectl,
    kubectl_json,
    pods,
    port_forward,
    stage_pods,
    wait_rollout,
)
from tests.e2e.pipeline import NAMESPACE as PIPELINE
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
PIPELINE_REDIS = {"app.kubernetes.io/name": "redis"}  # manifests/dev/'s, in the suite's pipeline
# A TCP connection from inside a pod: "open", "refused" (the name resolved, the connection rejected: kube-router's
# REJECT) or "failed" (anything else: a name that did not resolve, a timeout).
CONNECT = """import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
except ConnectionRefusedError as error:
    print(f"refused: {error}")
except OSError as error:
    print(f"failed: {error!r}")
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


def peer(namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": labels},
    }


def chart_policies(home: Path, api_server: list[str]) -> dict[str, dict[str, Any]]:
    """The chart's policies by name, for workers in NAMESPACE: Redis on 6379 only, of the stage's set and of the
    suite's pipeline (so the operator keeps serving it), the scrapers of MONITORING, the API server's endpoints, and
    the chart's default DNS peer (kube-system's kube-dns pods)."""
    values = {
        "networkPolicy": {
            "enabled": True,
            "workerNamespaces": [NAMESPACE],
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}}}],
            "redis": [{"to": [peer(NAMESPACE, REDIS_SET), peer(PIPELINE, PIPELINE_REDIS)], "ports": [6379]}],
            "apiServer": {"ports": [443, 6443], "to": [{"ipBlock": {"cidr": f"{ip}/32"}} for ip in api_server]},
        }
    }
    rendered = helm(
        "template",
        "phoenix",
        str(CHART),
        f"--namespace={OPERATOR_NAMESPACE}",
        "--show-only=templates/network-policy.yaml",
        "--values=-",
        home=home,
        input=yaml.safe_dump(values),
    )
    return {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(rendered) if doc}


@dataclass(frozen=True)
class Guarded:
    api_server: list[str]
    policies: dict[str, dict[str, Any]]
    evidence: Path

    def record(self, title: str, seen: dict[str, str]) -> str:
        """`seen` added to the run's evidence; the table, for an assertion's message."""
        table = f"{title}\n" + "".join(f"  {what:<28} {outcome}\n" for what, outcome in seen.items())
        with self.evidence.open("a") as evidence:
            evidence.write(table)
        return table


@pytest.fixture(scope="module")
def guarded(
    operator_installed: None,
    phoenix_image: str,
    valkey_image: str,
    tmp_path_factory: pytest.TempPathFactory,
    report_dir: Path,
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
        api_server = api_server_endpoints()
        policies = chart_policies(tmp_path_factory.mktemp("helm-home"), api_server)
        evidence = report_dir / "network-policy.txt"
        evidence.unlink(missing_ok=True)
        yield Guarded(api_server, policies, evidence)


def worker(other_than: str = "") -> dict[str, Any]:
    """The stage's one Ready worker pod (one that is not `other_than`)."""

    def ready() -> dict[str, Any] | None:
        found = [pod for pod in stage_pods(NAMESPACE, STAGE) if pod["metadata"]["name"] != other_than]
        return found[0] if len(found) == 1 and is_ready(found[0]) else None

    return eventually(ready, f"a Ready worker of {STAGE}", timeout=180, interval=1)


def connect(namespace: str, pod: str, host: str, port: int) -> str:
    """Whether `pod` (its first container) opens a TCP connection to host:port: CONNECT's answer."""
    return kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", CONNECT, host, str(port)).strip()


def reach(namespace: str, pod: str, api_server: list[str]) -> dict[str, str]:
    """What a pod reaches: the stage's Redis, its Redis set's other server, another namespace's Redis, the API server
    (its Service, and its endpoint as the Service translates to)."""
    targets = {
        "own redis": (f"{REDIS}.{NAMESPACE}.svc", 6379),
        "own set, port 6380": (f"{SECOND}.{NAMESPACE}.svc", 6380),
        "other redis": (f"{OTHER_REDIS}.{OTHER}.svc", 6379),
        "api server service": ("kubernetes.default.svc", 443),
        **{f"api server {ip}": (ip, 6443) for ip in api_server},
    }
    return {what: connect(namespace, pod, host, port) for what, (host, port) in targets.items()}


def to_metrics(ip: str, port: int) -> dict[str, str]:
    """Who reaches a metrics port: a pod of the stage's namespace, a pod of MONITORING."""
    return {
        "metrics from its namespace": connect(NAMESPACE, "outsider", ip, port),
        "metrics from monitoring": connect(MONITORING, "scraper", ip, port),
    }


def enforced(what: str, seen: Callable[[], dict[str, str]]) -> dict[str, str]:
    """What `seen` finds once the node enforces the policy on a new pod (kube-router adds a pod's rules once it has
    its address), or the last of it after a minute."""
    last: dict[str, str] = {}

    def refused_elsewhere() -> bool:
        last.update(seen())
        return last["other redis"] != "open"

    with contextlib.suppress(AssertionError):
        eventually(refused_elsewhere, f"the node to enforce the policy on {what}", timeout=60, interval=2)
    return last


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


def operator_pod() -> dict[str, Any]:
    """A Ready operator pod, once both replicas are."""

    def ready() -> dict[str, Any] | None:
        found = pods(OPERATOR_NAMESPACE, OPERATOR_PODS)
        return found[0] if len(found) == 2 and all(is_ready(pod) for pod in found) else None

    return eventually(ready, "two Ready operator pods", timeout=180, interval=1)


def metrics_port(pod: dict[str, Any]) -> int:
    [container] = pod["spec"]["containers"]
    return int(container["ports"][0]["containerPort"])


def worker_env(variable: str) -> str | None:
    """The value of `variable` in the stage's worker Deployment, as the operator last wrote it."""
    deployment = kubectl_json("get", "deployment", "-n", NAMESPACE, STAGE)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return next((env.get("value") for env in container["env"] if env["name"] == variable), None)


def opened(seen: dict[str, str]) -> set[str]:
    """What `seen` reached; everything else must have been refused (its name resolved, so DNS was let through)."""
    assert all(outcome == "open" or outcome.startswith("refused") for outcome in seen.values()), seen
    return {what for what, outcome in seen.items() if outcome == "open"}


def test_the_worker_policy_admits_its_redis_and_dns_and_scrapes_from_monitoring_only(guarded: Guarded) -> None:
    before = worker()
    name, ip = before["metadata"]["name"], before["status"]["podIP"]
    seen = {**reach(NAMESPACE, name, guarded.api_server), **to_metrics(ip, HEALTH_PORT)}
    table = guarded.record("worker, without a policy", seen)
    # Without a policy the node lets every connection through: what is refused below is the policy's doing.
    assert set(seen.values()) == {"open"}, table

    apply_documents([guarded.policies["phoenix-workers"]], NAMESPACE)
    # A pod started under the policy: its Redis and DNS connections are all new (a connection made before the
    # policy would be let through as established).
    kubectl("delete", "pod", "-n", NAMESPACE, name, "--wait=false")
    after = worker(other_than=name)
    processes_a_record()
    name, ip = after["metadata"]["name"], after["status"]["podIP"]
    seen = enforced("the new worker", lambda: reach(NAMESPACE, name, guarded.api_server))
    seen.update(to_metrics(ip, HEALTH_PORT))
    table = guarded.record("worker, under the chart's worker policy (a new pod)", seen)
    assert opened(seen) == {"own redis", "metrics from monitoring"}, table
    assert "phoenix_" in scraped(ip)


def test_the_operator_policy_admits_its_api_server_and_the_stages_redis_only(guarded: Guarded) -> None:
    pod = operator_pod()
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    seen = {**reach(OPERATOR_NAMESPACE, name, guarded.api_server), **to_metrics(ip, metrics_port(pod))}
    table = guarded.record("operator, without a policy", seen)
    assert set(seen.values()) == {"open"}, table

    apply_documents([guarded.policies["phoenix-operator"]], OPERATOR_NAMESPACE)
    try:
        # Both replicas replaced: the new ones reach the API server (readiness, the Lease) and Redis under the policy.
        kubectl("delete", "pod", "-n", OPERATOR_NAMESPACE, "-l", OPERATOR_PODS, "--wait=false")
        wait_rollout(OPERATOR_NAMESPACE, "phoenix-operator")
        patch = '{"spec": {"worker": {"concurrency": 3}}}'
        kubectl("patch", "phoenixstage", "-n", NAMESPACE, STAGE, "--type=merge", "-p", patch)
        eventually(lambda: worker_env("CONCURRENCY") == "3", "the operator to carry out a spec change", timeout=180)
        pod = operator_pod()
        name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
        seen = enforced("the new operator pod", lambda: reach(OPERATOR_NAMESPACE, name, guarded.api_server))
        seen.update(to_metrics(ip, metrics_port(pod)))
        table = guarded.record("operator, under the chart's operator policy (a new pod)", seen)
        api_server = {"api server service", *(f"api server {address}" for address in guarded.api_server)}
        assert opened(seen) == {"own redis", *api_server, "metrics from monitoring"}, table
    finally:
        kubectl("delete", "networkpolicy", "-n", OPERATOR_NAMESPACE, "phoenix-operator")
