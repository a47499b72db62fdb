"""The example pipeline as one PhoenixPipeline (manifests/samples/pipeline/) on a real cluster: applied, READY 3/3,
the sample PDFs through its three stages, paused and resumed as one, deleted with everything it made."""

from __future__ import annotations

import base64
import copy
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
import yaml

from phoenix.stages.data_keys import grouped_key
from tests.e2e.kubectl import (
    VALKEY_IMAGE,
    image_override,
    kubectl,
    kubectl_json,
    port_forward,
    printed_columns,
    wait_rollout,
    write_overlay,
)
from tests.e2e.pipeline import (
    FETCH_IN_CLUSTER,
    KEEP_ACKNOWLEDGED,
    NAMESPACE,
    PARSER_LIMITS,
    STAGE_TIMINGS,
    Pipeline,
    enqueue_documents,
)
from tests.e2e.redis_set import until_answering
from tests.fixtures.cluster_objects import MANIFESTS

pytestmark = pytest.mark.e2e

PIPELINE_NAMESPACE = "phoenix-e2e-pipeline"
STAGES = ("router", "parser", "grouper")
# The suite's documents server, in the sample pipeline's namespace, reached by cluster DNS.
DOCUMENTS = f"http://documents.{NAMESPACE}:8000"


def wait_for(what: str, check: Callable[[], bool], timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(2)


def pipeline_document(image: str) -> dict[str, Any]:
    """manifests/samples/pipeline/pipeline.yaml with the suite's image and what its overlay gives each sample stage
    (tests/e2e/pipeline.py): the same timings, the kept acknowledged entries, the router's in-cluster fetches."""
    document = yaml.safe_load((MANIFESTS / "samples" / "pipeline" / "pipeline.yaml").read_text())
    for entry in document["spec"]["stages"]:
        spec = entry["spec"]
        extra = [KEEP_ACKNOWLEDGED, *([FETCH_IN_CLUSTER] if entry["name"] == "router" else [])]
        changes: dict[str, Any] = {**STAGE_TIMINGS, "image": image, "env": [*spec.get("env", []), *extra]}
        entry["spec"] = merged(merged(spec, changes), PARSER_LIMITS if entry["name"] == "parser" else {})
    return document


def merged(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """`target` after the merge patch `patch` (RFC 7386: objects merge, anything else replaces), as the suite's
    kustomize patches change the sample stages."""
    result = copy.deepcopy(target)
    for key, value in patch.items():
        both = isinstance(value, dict) and isinstance(result.get(key), dict)
        result[key] = merged(result[key], value) if both else copy.deepcopy(value)
    return result


def in_namespace(kind: str) -> list[dict[str, Any]]:
    return list(kubectl_json("get", kind, "-n", PIPELINE_NAMESPACE)["items"])


def stage_specs() -> dict[str, dict[str, Any]]:
    return {item["metadata"]["name"]: item for item in in_namespace("phoenixstages")}


@pytest.fixture
def applied_pipeline(
    pipeline: Pipeline, phoenix_image: str, valkey_image: str, tmp_path: Path
) -> Iterator[redis_client.Redis]:
    """The PhoenixPipeline, its Secret and a Valkey of its own in a namespace of its own (a pipeline never takes
    over the sample stages of the suite's namespace); a client of that Valkey."""
    kubectl("delete", "namespace", PIPELINE_NAMESPACE, "--ignore-not-found", "--wait=true", timeout=300)
    kubectl("create", "namespace", PIPELINE_NAMESPACE)
    kubectl("label", "namespace", PIPELINE_NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    base = tmp_path / "base"
    base.mkdir()
    # kustomize reads files only inside a kustomization: the Valkey and the Secret of manifests/ copied in.
    shutil.copy(MANIFESTS / "dev" / "valkey.yaml", base)
    shutil.copy(MANIFESTS / "samples" / "redis-secret.yaml", base)
    (base / "pipeline.yaml").write_text(yaml.safe_dump(pipeline_document(phoenix_image)))
    (base / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["valkey.yaml", "redis-secret.yaml", "pipeline.yaml"]})
    )
    overlay = write_overlay(
        tmp_path / "overlay",
        base,
        {"namespace": PIPELINE_NAMESPACE, "images": [image_override(VALKEY_IMAGE, valkey_image)]},
    )
    kubectl("apply", "--server-side", "-k", str(overlay))
    wait_rollout(PIPELINE_NAMESPACE, "redis")
    secret = kubectl_json("get", "secret", "-n", PIPELINE_NAMESPACE, "phoenix-redis")
    password = base64.b64decode(secret["data"]["password"]).decode()
    with port_forward(PIPELINE_NAMESPACE, "service/redis", 6379) as port:
        client = redis_client.Redis(port=port, password=password, decode_responses=True)
        until_answering([client])
        yield client
        client.close()
    kubectl("delete", "namespace", PIPELINE_NAMESPACE, "--wait=false", check=False)


def test_the_example_pipeline_as_one_object(applied_pipeline: redis_client.Redis, pipeline: Pipeline) -> None:
    redis = applied_pipeline
    columns = ("phoenixpipeline", "documents", "-n", PIPELINE_NAMESPACE)
    wait_for("READY 3/3", lambda: printed_columns(*columns).get("READY") == "3/3")
    owned = stage_specs()
    assert set(owned) == set(STAGES)
    for item in owned.values():
        (owner,) = item["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("PhoenixPipeline", "documents", True)

    # Records through its three stages.
    router_input = owned["router"]["status"]["streams"]["input"]
    ids = enqueue_documents(redis, router_input, pipeline.documents, copies=2, server=DOCUMENTS)
    keys = [grouped_key(PIPELINE_NAMESPACE, record_id) for record_id in ids]
    wait_for(f"{len(ids)} records grouped", lambda: redis.exists(*keys) == len(ids), timeout=300)

    # Paused as one: every stage paused, the pipeline says so; resumed as one.
    kubectl("patch", *columns[:2], "-n", PIPELINE_NAMESPACE, "--type=merge", "-p", '{"spec": {"paused": true}}')
    wait_for("every stage paused", lambda: all(s["spec"].get("paused") for s in stage_specs().values()))

    def paused_condition() -> bool:
        conditions = kubectl_json("get", *columns).get("status", {}).get("conditions", [])
        return any(c["type"] == "Paused" and c["status"] == "True" for c in conditions)

    wait_for("Paused=True", paused_condition)
    kubectl("patch", *columns[:2], "-n", PIPELINE_NAMESPACE, "--type=merge", "-p", '{"spec": {"paused": false}}')
    wait_for("every stage resumed", lambda: not any(s["spec"].get("paused") for s in stage_specs().values()))
    wait_for("READY 3/3 again", lambda: printed_columns(*columns).get("READY") == "3/3")

    # Deleted with everything it made.
    kubectl("delete", *columns, "--wait=true", timeout=180)
    wait_for("its stages gone", lambda: not stage_specs())
    wait_for("its Deployments gone", lambda: {d["metadata"]["name"] for d in in_namespace("deployments")} == {"redis"})
