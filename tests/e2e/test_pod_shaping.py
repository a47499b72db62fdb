"""Worker pods shaped by spec.pod, under the restricted Pod Security Standard (the pipeline's namespace enforces
it): a stage with a pull secret, a ServiceAccount, labels, annotations, an envFrom ConfigMap, its processor's
code in a ConfigMap volume, a nodeSelector, a toleration, node affinity, a topology spread constraint and a
PriorityClass runs on the node; that ConfigMap's keys of the operator's own variables (CONSUMER_NAME, OUTPUT_QUEUE)
never reach the worker, and one of them in another letter case (`redis_url`) stops it with one line; a stage
asking for privileges is refused by the API server; a long job survives a scale-in, committed by the pod that is
going, within the termination grace that follows processingTimeout."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_client
import yaml

from phoenix.keys import StageKeys
from phoenix.kube_names import STAGE_LABEL
from phoenix.record_format import committed_by
from tests.e2e.kubectl import apply_documents, delete_stage, is_ready, kubectl, kubectl_json, pods, stage_pods
from tests.e2e.pipeline import NAMESPACE, Pipeline, stage_document
from tests.fixtures.replies import add_entry_now, get_text_now

pytestmark = pytest.mark.e2e

STAGE = "longjob"
JOB_SECONDS = 45  # longer than the 30 s grace pods had before, well inside processingTimeout
PROCESSING_TIMEOUT = 120
# The processor, mounted from a ConfigMap and found through PYTHONPATH (set by envFrom): no image of its own.
SLOW_PROCESSOR = """
import asyncio
import os

from phoenix.worker_runtime import BaseProcessor


class SlowProcessor(BaseProcessor):
    async def process(self, record_id, user_id, data):
        await asyncio.sleep(float(os.environ["SLOW_SECONDS"]))
        return None
"""
PRIORITY_CLASS = "phoenix-e2e-longjob"
PRIORITY = 1000
# Placement the single e2e node meets (it is Linux and untainted): each field is set, none keeps a pod pending.
PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": STAGE}},
        }
    ],
    "priorityClassName": PRIORITY_CLASS,
}
# Every spec.pod field but terminationGracePeriodSeconds, whose default (processingTimeout + 15) the scale-in
# test relies on (the builder tests cover it set).
POD = {
    **PLACEMENT,
    "imagePullSecrets": [{"name": "longjob-registry"}],
    "serviceAccountName": "longjob",
    "labels": {"team": "e2e"},
    "annotations": {"example.com/cost-center": "cc-42"},
    "envFrom": [{"configMapRef": {"name": "longjob-env"}}],
    "volumes": [{"name": "code", "configMap": {"name": "longjob-code"}}],
    "volumeMounts": [{"name": "code", "mountPath": "/processors", "readOnly": True}],
}


# Variables the operator sets in every worker's env, here also in the envFrom ConfigMap: `env` wins, so each pod is
# its own consumer (one name for all would make them take each other's pending entries) and the final stage forwards
# nowhere, as its spec says.
RESERVED_IN_ENV_FROM = {"CONSUMER_NAME": "same-for-all", "OUTPUT_QUEUE": "phoenix:{elsewhere}:stolen:input"}


def longjob_stage(image: str, replicas: int) -> dict[str, Any]:
    """A final stage of `replicas` pods whose records each take JOB_SECONDS; a record left by a killed pod would be
    claimed by another only after 10 minutes, so within the test only the pod that took it can commit it."""
    return stage_document(
        STAGE,
        "slow:SlowProcessor",
        image,
        cpu=("20m", "250m"),
        replicas={"min": replicas, "max": replicas},
        autoscaling={"lagCount": 1, "pollingInterval": 2, "cooldownPeriod": 5},
        worker={"processingTimeout": PROCESSING_TIMEOUT, "claimIdleMs": 600_000, "lockTimeout": 600},
        pod=POD,
    )


def _objects() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": PRIORITY_CLASS},
            "value": PRIORITY,
            "preemptionPolicy": "Never",
            "description": "The e2e's spec.pod.priorityClassName (tests/e2e/test_pod_shaping.py).",
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "longjob"}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "longjob-registry"},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": '{"auths": {}}'},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "longjob-code"},
            "data": {"slow.py": SLOW_PROCESSOR},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "longjob-env"},
            "data": {"PYTHONPATH": "/processors", "SLOW_SECONDS": str(JOB_SECONDS), **RESERVED_IN_ENV_FROM},
        },
    ]


def _until(condition: Any, what: str, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(1)
    return found


@pytest.fixture(scope="module")
def longjob(pipeline: Pipeline, phoenix_image: str) -> Iterator[None]:
    apply_documents([*_objects(), longjob_stage(phoenix_image, replicas=2)], NAMESPACE)
    kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=180s", f"phoenixstage/{STAGE}", timeout=210)
    _until(lambda: sum(is_ready(pod) for pod in stage_pods(NAMESPACE, STAGE)) == 2, "both longjob pods ready", 180)
    yield
    delete_stage(NAMESPACE, STAGE)
    kubectl("delete", "priorityclass", PRIORITY_CLASS, "--ignore-not-found", "--wait=false")


def test_the_namespace_enforces_restricted_and_every_worker_pod_is_admitted(longjob: None) -> None:
    labels = kubectl_json("get", "namespace", NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    for replica_set in kubectl_json("get", "replicasets", "-n", NAMESPACE)["items"]:
        failures = [
            c for c in (replica_set.get("status") or {}).get("conditions") or [] if c["type"] == "ReplicaFailure"
        ]
        assert not failures, f"{replica_set['metadata']['name']}: {failures}"
    workers = pods(NAMESPACE, "app.kubernetes.io/name=phoenix-worker")
    assert {pod["metadata"]["labels"][STAGE_LABEL] for pod in workers} >= {STAGE}
    assert all(is_ready(pod) for pod in workers if pod["metadata"]["labels"][STAGE_LABEL] == STAGE)


def test_a_stage_with_spec_pod_runs_shaped_as_asked(longjob: None) -> None:
    for pod in stage_pods(NAMESPACE, STAGE):
        spec, meta = pod["spec"], pod["metadata"]
        assert spec["imagePullSecrets"] == [{"name": "longjob-registry"}]
        assert spec["serviceAccountName"] == "longjob"
        assert meta["labels"]["team"] == "e2e" and meta["labels"]["app.kubernetes.io/instance"] == STAGE
        assert meta["annotations"]["example.com/cost-center"] == "cc-42"
        assert spec["terminationGracePeriodSeconds"] == PROCESSING_TIMEOUT + 15
        assert spec["nodeSelector"] == PLACEMENT["nodeSelector"]
        assert spec["affinity"] == PLACEMENT["affinity"]
        # Beside the not-ready/unreachable tolerations the API server adds to every pod.
        assert PLACEMENT["tolerations"][0] in spec["tolerations"]
        (spread,) = spec["topologySpreadConstraints"]
        assert PLACEMENT["topologySpreadConstraints"][0].items() <= spread.items()
        # The priority is resolved from the PriorityClass at admission: the class existed and was used.
        assert (spec["priorityClassName"], spec["priority"]) == (PRIORITY_CLASS, PRIORITY)
        (container,) = spec["containers"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
    budget = kubectl_json("get", "poddisruptionbudget", "-n", NAMESPACE, STAGE)
    assert budget["spec"]["maxUnavailable"] == 1


def _started(pod: str) -> dict[str, Any]:
    """The worker_started line of the pod's worker."""
    lines = kubectl("logs", "-n", NAMESPACE, pod).splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    (started,) = [event for event in events if event.get("event") == "worker_started"]
    return started


def test_the_operators_variables_in_an_env_from_configmap_never_reach_the_worker(longjob: None) -> None:
    for pod in stage_pods(NAMESPACE, STAGE):
        name = pod["metadata"]["name"]
        started = _started(name)
        assert started["consumer"] == name  # CONSUMER_NAME from the pod's own name, not the ConfigMap's
        assert started["output"] is None  # a final stage: the ConfigMap's OUTPUT_QUEUE was not read
        (container,) = pod["spec"]["containers"]
        env = {var["name"]: var for var in container["env"]}
        assert env["CONSUMER_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert "value" not in env["OUTPUT_QUEUE"]


CLASH = "envclash"


def test_a_setting_in_another_letter_case_in_env_from_stops_the_worker_with_one_line(
    pipeline: Pipeline, phoenix_image: str
) -> None:
    """The kubelet puts a ConfigMap's `redis_url` beside the operator's REDIS_URL, in an order of its own; the
    worker reads names case-insensitively, so it refuses to start (exit 2) rather than take either, and its line
    names both spellings and no value."""
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{CLASH}-env"},
        "data": {"redis_url": "redis://:hunter2@elsewhere.invalid:6379/0", "CONSUMER_NAME": "same-for-all"},
    }
    stage = stage_document(
        CLASH,
        "router",
        phoenix_image,
        cpu=("20m", "250m"),
        replicas={"min": 1, "max": 1},
        autoscaling={"enabled": False},
        pod={"envFrom": [{"configMapRef": {"name": f"{CLASH}-env"}}]},
    )
    apply_documents([config_map, stage], NAMESPACE)
    try:

        def refused() -> dict[str, Any] | None:
            for pod in stage_pods(NAMESPACE, CLASH):
                for status in (pod.get("status") or {}).get("containerStatuses") or []:
                    if ((status.get("lastState") or {}).get("terminated") or {}).get("exitCode") == 2:
                        return pod
            return None

        pod = _until(refused, "the envclash worker to exit with code 2", 120)

        def exit_line() -> str | None:
            # The kubelet may be starting the container again meanwhile, which drops the previous one's log: ask
            # again, for that container or the next one, which exits the same way.
            text = kubectl("logs", "-n", NAMESPACE, "--previous", pod["metadata"]["name"], check=False)
            return text if text.startswith("phoenix worker:") else None

        log = _until(exit_line, "the envclash worker's exit line", 120)
        assert log == (
            "phoenix worker: invalid configuration: REDIS_URL is set in several letter cases (REDIS_URL, redis_url): "
            "the worker reads its variables case-insensitively and could take either value; keep one spelling\n"
        )
        assert "hunter2" not in log and "elsewhere" not in log
    finally:
        delete_stage(NAMESPACE, CLASH)
        kubectl("delete", "configmap", "-n", NAMESPACE, f"{CLASH}-env", "--ignore-not-found")


@pytest.mark.parametrize(
    ("pod", "refusal"),
    [
        ({"securityContext": {"privileged": True}}, "spec.pod.securityContext is refused"),
        ({"volumes": [{"name": "node", "hostPath": {"path": "/"}}]}, "hostPath volumes are refused"),
    ],
)
def test_a_stage_asking_for_privileges_is_refused_by_the_api_server(
    pipeline: Pipeline, phoenix_image: str, pod: dict[str, Any], refusal: str
) -> None:
    stage = longjob_stage(phoenix_image, replicas=1)
    stage["metadata"]["name"] = "privileged"
    stage["spec"]["pod"] = pod
    with pytest.raises(RuntimeError) as refused:
        kubectl("create", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(stage))
    assert refusal in str(refused.value), refused.value
    assert not kubectl("get", "phoenixstage", "-n", NAMESPACE, "privileged", "--ignore-not-found").strip()


def test_a_long_job_survives_a_scale_in(longjob: None, redis: redis_client.Redis, phoenix_image: str) -> None:
    """Two records, one in flight on each pod; the stage's bounds drop to one pod (KEDA's HPA and the operator
    bring the Deployment down): the pod that goes drains its record for up to processingTimeout and commits it
    before it exits. No other pod could have (the record would be claimed only after 10 minutes)."""
    streams = kubectl_json("get", "phoenixstage", "-n", NAMESPACE, STAGE)["status"]["streams"]
    keys = StageKeys.for_stage(STAGE, NAMESPACE, input=streams["input"], group=streams["consumerGroup"])
    records = {f"job-{n}-{time.time_ns()}": "" for n in range(2)}
    for record in records:
        records[record] = add_entry_now(redis, keys.input, {"record_id": record, "user_id": "e2e"})

    def consumers_of_pending() -> dict[str, str] | None:
        entries = redis.xpending_range(keys.input, keys.consumer_group, "-", "+", 10)
        owners = {str(entry["message_id"]): str(entry["consumer"]) for entry in entries}  # decoded: str already
        return owners if len(owners) == 2 and len(set(owners.values())) == 2 else None

    owners = _until(consumers_of_pending, "one record in flight on each pod", 60)
    started = time.monotonic()
    apply_documents([longjob_stage(phoenix_image, replicas=1)], NAMESPACE)

    def terminating() -> dict[str, Any] | None:
        gone = [pod for pod in stage_pods(NAMESPACE, STAGE) if pod["metadata"].get("deletionTimestamp")]
        return gone[0] if gone else None

    going = _until(terminating, "a pod to be scaled in", 60)
    name = going["metadata"]["name"]
    (entry,) = [entry for entry, consumer in owners.items() if consumer == name]
    record = next(record for record, entry_id in records.items() if entry_id == entry)
    state = keys.record_prefix + record
    assert committed_by(get_text_now(redis, state)) is None, "the record was done before the scale-in: no long job left"

    _until(lambda: committed_by(get_text_now(redis, state)) == entry, f"{record} committed", JOB_SECONDS + 60)
    assert time.monotonic() - started < PROCESSING_TIMEOUT
    # Committed by the going pod itself: acknowledged, never delivered to another consumer.
    assert redis.xpending(keys.input, keys.consumer_group)["pending"] <= 1
    assert not redis.xpending_range(keys.input, keys.consumer_group, entry, entry, 1)
    _until(lambda: not any(pod["metadata"]["name"] == name for pod in stage_pods(NAMESPACE, STAGE)), f"{name} gone", 60)
    other = next(r for r in records if r != record)
    _until(
        lambda: committed_by(get_text_now(redis, keys.record_prefix + other)) == records[other],
        "the other committed",
        120,
    )
