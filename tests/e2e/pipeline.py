"""The e2e suite's pipeline: objects it adds to the samples, and reading the pipeline's Redis and stages."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis as redis_client
import yaml

from phoenix.keys import StageKeys
from phoenix.stages.data_keys import grouped_key
from tests.e2e.kubectl import kubectl_json
from tests.fixtures.cluster_objects import MANIFESTS
from tests.fixtures.replies import stream_entries_now

NAMESPACE = "phoenix-e2e"
DOCUMENTS_URL = "http://documents:8000"  # the Service below, resolved by cluster DNS from the router's pods
RESTRICTED = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

# The Secret the suite creates beside the pipeline, with the Redis URL and password (tests/e2e/conftest.py).
REDIS_SECRET_REFS = {
    "urlSecretRef": {"name": "phoenix-redis", "key": "url"},
    "passwordSecretRef": {"name": "phoenix-redis", "key": "password"},
}


def stage_document(name: str, processor: str, image: str, cpu: tuple[str, str], **spec: Any) -> dict[str, Any]:
    """A PhoenixStage `name` of the tests' own, on the suite's Redis (REDIS_SECRET_REFS, unless `spec` has a
    `redis` of its own), with `cpu` as its pods' (request, limit): a low limit keeps a backlog long enough to see."""
    return {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": name},
        "spec": {
            "processor": processor,
            "image": image,
            "redis": REDIS_SECRET_REFS,
            "resources": {"requests": {"cpu": cpu[0], "memory": "96Mi"}, "limits": {"cpu": cpu[1], "memory": "256Mi"}},
            **spec,
        },
    }


# What the test's overlay changes in the samples: KEDA reacts within seconds and scales down after 20 s instead of
# 15 s polling and 3 min cooldown, and a killed pod's entries are claimed by another after 10 s, not 5 min.
STAGE_TIMINGS = {
    "autoscaling": {"pollingInterval": 2, "cooldownPeriod": 20},
    "worker": {"claimIdleMs": 10000, "lockTimeout": 20},
}
# The suite proves exactly once by reading every forward back from the next stage's input stream, so the stages
# keep what they acknowledged instead of trimming it within a second (the worker tests cover trimming).
KEEP_ACKNOWLEDGED = {"name": "TRIM_INTERVAL", "value": "86400"}
# The documents server is a Service of the cluster, at a private address the router refuses by default
# (docs/durability.md, "Hostile documents"): the router stages allow the ranges clusters give Services (kind's
# 10.96.0.0/12, the local node's 198.18.32.0/24).
FETCH_IN_CLUSTER = {
    "name": "DOCUMENT_ALLOWED_NETWORKS",
    "value": "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,198.18.0.0/15,fc00::/7",
}
# The parser held to a quarter of a core, so that its pods always have entries in flight while a backlog lasts
# (a pod is force-deleted mid-run) instead of finishing each in a few milliseconds. Its rate limits keep the
# samples' shape (the model's quota per downstream and per user) at rates the suite's one user, sending hundreds of
# records within a minute, does not reach: the samples' 30 a minute held most of them back for minutes (the limits
# themselves are proven by tests/test_rate_limits.py with real workers).
PARSER_LIMITS = {
    "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "250m"}},
    "rateLimits": [
        {"rate": 60000, "per": "minute", "scope": "downstream", "downstream": "llm"},
        {"rate": 30000, "per": "minute", "burst": 500, "scope": "user"},
    ],
}


@dataclass(frozen=True)
class Pipeline:
    documents: list[str]  # sample PDF file names served at DOCUMENTS_URL


def stage_patch(name: str) -> dict[str, Any]:
    """A kustomize patch of one sample PhoenixStage with STAGE_TIMINGS."""
    sample = yaml.safe_load((MANIFESTS / "samples" / f"{name}.yaml").read_text())
    # A list in a merge patch replaces the sample's.
    env = [*sample["spec"].get("env", []), KEEP_ACKNOWLEDGED, *([FETCH_IN_CLUSTER] if name == "router" else [])]
    spec = {**STAGE_TIMINGS, "env": env, **(PARSER_LIMITS if name == "parser" else {})}
    patch = {"apiVersion": "phoenix.io/v1alpha1", "kind": "PhoenixStage", "metadata": {"name": name}, "spec": spec}
    return {"patch": json.dumps(patch)}


def documents_server(image: str, files_b64: dict[str, str]) -> list[dict[str, Any]]:
    """A web server (Python's http.server in the Phoenix image) for the sample PDFs, from a ConfigMap copied into a
    writable directory so that a test can add a document later (kubectl exec)."""
    labels = {"app.kubernetes.io/name": "documents"}
    container = {
        "name": "http",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", "cp /samples/* /docs/ && exec python3 -m http.server 8000 --directory /docs"],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 2},
        "securityContext": {**RESTRICTED, "runAsUser": 65532},
        "volumeMounts": [{"name": "samples", "mountPath": "/samples"}, {"name": "docs", "mountPath": "/docs"}],
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sample-documents"}, "binaryData": files_b64},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "documents", "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [container],
                        "volumes": [
                            {"name": "samples", "configMap": {"name": "sample-documents"}},
                            {"name": "docs", "emptyDir": {}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "documents"},
            "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
        },
    ]


def stage(name: str) -> dict[str, Any]:
    return kubectl_json("get", "phoenixstage", "-n", NAMESPACE, name)


def streams(name: str) -> dict[str, str]:
    return stage(name)["status"]["streams"]


def enqueue_documents(
    redis: redis_client.Redis, stream: str, documents: list[str], copies: int, server: str = DOCUMENTS_URL
) -> list[str]:
    """One router record per document and copy, with a fresh record id each, fetched from `server`; returns the
    ids."""
    batch = uuid.uuid4().hex[:8]
    ids = []
    pipe = redis.pipeline(transaction=False)
    for copy in range(copies):
        for number, document in enumerate(documents):
            record_id = f"{batch}-{copy}-{number}"
            pipe.xadd(stream, {"record_id": record_id, "document_url": f"{server}/{document}"})
            ids.append(record_id)
    pipe.execute()
    return ids


def record_counts(redis: redis_client.Redis, stream: str, ids: list[str], forwards: bool = False) -> Counter[str]:
    """How many entries of `stream` carry each of `ids`; with `forwards`, of a stage's input, only those the stage
    before it forwarded: a record a rate limit held back, or a retry, comes back into the input as it was, with
    original_id, and was forwarded once all the same."""
    wanted = set(ids)
    return Counter(
        fields["record_id"]
        for _, fields in stream_entries_now(redis, stream)
        if fields.get("record_id") in wanted and not (forwards and "original_id" in fields)
    )


def grouped_count(redis: redis_client.Redis, ids: list[str]) -> int:
    pipe = redis.pipeline(transaction=False)
    for record_id in ids:
        pipe.exists(grouped_key(NAMESPACE, record_id))
    return sum(pipe.execute())


def wait_all_grouped(redis: redis_client.Redis, ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (done := grouped_count(redis, ids)) < len(ids):
        if time.monotonic() > deadline:
            missing = [record_id for record_id in ids if not redis.exists(grouped_key(NAMESPACE, record_id))]
            whereabouts = "\n".join(f"  {record_id}: {_whereabouts(redis, record_id)}" for record_id in missing[:5])
            raise AssertionError(
                f"only {done} of {len(ids)} records reached the grouper within {timeout:.0f} s; where they are:\n"
                f"{whereabouts}"
            )
        time.sleep(1)


def _whereabouts(redis: redis_client.Redis, record_id: str) -> str:
    """Per stage: the record's entries in its input (with their pending state), in its DLQ, and its record key."""
    parts = []
    for name in ("router", "parser", "grouper"):
        names = streams(name)
        keys = StageKeys.for_stage(
            name, NAMESPACE, input=names["input"], group=names["consumerGroup"], dlq=names["dlq"]
        )
        entries = [i for i, f in stream_entries_now(redis, keys.input) if f.get("record_id") == record_id]
        pending = [redis.xpending_range(keys.input, keys.consumer_group, i, i, 1) for i in entries]
        in_dlq = record_counts(redis, keys.dlq, [record_id])[record_id]
        state = keys.record_prefix + record_id
        parts.append(
            f"{name}: entries {entries} pending {pending}, DLQ {in_dlq}, "
            f"{state}={redis.get(state)!r} (ttl {redis.ttl(state)})"
        )
    return "; ".join(parts)


def assert_exactly_once(redis: redis_client.Redis, ids: list[str]) -> None:
    """Every record was forwarded once by the router and once by the parser, grouped, and nothing dead-lettered."""
    for sender, receiver in (("router", "parser"), ("parser", "grouper")):
        counts = record_counts(redis, streams(receiver)["input"], ids, forwards=True)
        assert set(counts) == set(ids), f"{sender} lost {sorted(set(ids) - set(counts))[:5]}"
        duplicated = {record_id: n for record_id, n in counts.items() if n != 1}
        assert not duplicated, f"{sender} forwarded records more than once: {duplicated}"
    for name in ("router", "parser", "grouper"):
        assert record_counts(redis, streams(name)["dlq"], ids) == Counter(), f"{name} dead-lettered records"
    assert grouped_count(redis, ids) == len(ids)
