"""A stage on an in-cluster Sentinel set with TLS (tests/e2e/sentinel.py): the operator reaches it through the
Sentinels with the CA from a Secret, KEDA scales the stage 0 -> N -> 0 through `redis-sentinel-streams`, and the
primary's pod deleted mid-run loses no record and forwards none twice."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phoenix.keys import StageKeys
from tests.e2e.kubectl import apply_documents, kubectl, kubectl_json
from tests.e2e.pipeline import (
    Pipeline,
    enqueue_documents,
    record_counts,
)
from tests.e2e.redis_set import DOCUMENTS, StageReplicas, fresh_namespace, router_stage
from tests.e2e.sentinel import (
    DATA_NODES,
    MASTER,
    NAMESPACE,
    certificates,
    primary_client,
    sentinel_set,
    wait_primary,
    wait_set_ready,
)

pytestmark = pytest.mark.e2e

STAGE, OUTPUT = "sentinel-router", "sentinel:routed"
MAX_REPLICAS = 3


def sentinel_stage(image: str) -> dict[str, Any]:
    """The router's processor as a final stage on the Sentinel set, its CA from the set's Secret."""
    sentinel = {"sentinel": {"masterName": MASTER}, "tls": {"caSecretRef": {"name": "redis-tls", "key": "ca.crt"}}}
    return router_stage(STAGE, image, OUTPUT, MAX_REPLICAS, {"mode": "sentinel", **sentinel})


@pytest.fixture(scope="module")
def ca(pipeline: Pipeline, phoenix_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Sentinel set up and the stage on it reconciled; yields the set's CA certificate."""
    image = os.environ.get("PHOENIX_E2E_REDIS_TLS_IMAGE")
    if not image:
        pytest.fail("PHOENIX_E2E_REDIS_TLS_IMAGE names no image with a TLS redis-server (make e2e builds one)")
    with fresh_namespace(NAMESPACE):
        ca_cert, cert, key = certificates(tmp_path_factory.mktemp("sentinel-tls"))
        apply_documents(sentinel_set(image, ca_cert, cert, key), NAMESPACE)
        wait_set_ready()
        wait_primary(ca_cert, 120)
        apply_documents([sentinel_stage(phoenix_image)], NAMESPACE)
        kubectl(
            "wait", "-n", NAMESPACE, "--for=condition=Ready", "--timeout=180s", f"phoenixstage/{STAGE}", timeout=210
        )
        yield ca_cert


def test_keda_scales_a_sentinel_tls_stage_and_a_deleted_primary_loses_nothing(
    ca: Path, pipeline: Pipeline, report_dir: Path
) -> None:
    scaled_object = kubectl_json("get", "scaledobject", "-n", NAMESPACE, STAGE)
    assert {t["type"] for t in scaled_object["spec"]["triggers"]} == {"redis-sentinel-streams", "redis-sentinel"}
    assert all(t["metadata"]["sentinelMaster"] == MASTER for t in scaled_object["spec"]["triggers"])
    authentication = kubectl_json("get", "triggerauthentication", "-n", NAMESPACE, f"{STAGE}-redis")
    assert {ref["parameter"] for ref in authentication["spec"]["secretTargetRef"]} == {"password", "ca"}
    keys = StageKeys.for_stage(STAGE, NAMESPACE)
    replicas = StageReplicas(NAMESPACE, STAGE)
    replicas.until(lambda: replicas.now() == (0, 0), "the idle stage at zero pods", 120)

    started = time.monotonic()
    primary = wait_primary(ca, 60)
    with primary_client(ca, primary) as redis:
        first = enqueue_documents(redis, keys.input, pipeline.documents, copies=40, server=DOCUMENTS)
    replicas.until(lambda: replicas.now()[1] >= 1, "KEDA to wake the stage through the Sentinels", 180)
    scaled_up_after = time.monotonic() - started
    with primary_client(ca, primary) as redis:
        replicas.until(
            lambda: len(record_counts(redis, OUTPUT, first)) >= 10, "records routed before the failover", 180
        )

    # The primary's pod deleted mid-run; the Sentinels promote the replica; the workers and the operator follow.
    kubectl("delete", "pod", "-n", NAMESPACE, primary.split(".", 1)[0], "--wait=false")
    deleted = time.monotonic()
    promoted = wait_primary(ca, 180, other_than=primary)
    failover_seconds = time.monotonic() - deleted
    assert promoted in DATA_NODES and promoted != primary
    with primary_client(ca, promoted) as redis:
        second = enqueue_documents(redis, keys.input, pipeline.documents, copies=20, server=DOCUMENTS)
        ids = first + second

        def done() -> bool:
            return len(record_counts(redis, OUTPUT, ids)) == len(ids)

        replicas.until(done, f"all {len(ids)} records routed after the failover", 600)
        counts = record_counts(redis, OUTPUT, ids)
        assert {record_id: n for record_id, n in counts.items() if n != 1} == {}, "records forwarded twice"
        assert record_counts(redis, keys.dlq, ids) == {}, "records dead-lettered"
        replicas.until(lambda: redis.xpending(keys.input, keys.consumer_group)["pending"] == 0, "nothing pending", 120)
    replicas.until(lambda: replicas.now() == (0, 0), "KEDA to scale back to zero after the cooldown", 240)
    peak = replicas.peak
    assert 1 <= peak <= MAX_REPLICAS
    (report_dir / "sentinel.txt").write_text(
        f"{len(ids)} records, exactly once; a pod ready {scaled_up_after:.0f} s after the first enqueue (from 0), at "
        f"most {peak} pods, back to 0; the Sentinels named {promoted} {failover_seconds:.0f} s after {primary}'s "
        "pod was deleted\n"
    )
