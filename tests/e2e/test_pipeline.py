"""The sample pipeline on a real cluster: the image runs as the manifests say, and the sample PDFs flow
router -> parser -> grouper through real pods, each record exactly once."""

from __future__ import annotations

import json

import pytest
import redis as redis_client

from phoenix.stages.data_keys import grouped_key
from tests.e2e.kubectl import is_ready, kubectl, stage_pods
from tests.e2e.pipeline import (
    NAMESPACE,
    Pipeline,
    assert_exactly_once,
    enqueue_documents,
    streams,
    wait_all_grouped,
)

pytestmark = pytest.mark.e2e

PROCESS_FACTS = (
    "import json, os; "
    "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]; "
    "writable = os.access('/', os.W_OK) or os.access('/usr', os.W_OK); "
    "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'caps': caps, 'root_writable': writable}))"
)


def test_worker_runs_non_root_read_only_without_capabilities(pipeline: Pipeline) -> None:
    (router, *_) = [pod for pod in stage_pods(NAMESPACE, "router") if is_ready(pod)]
    facts = json.loads(
        kubectl("exec", "-n", NAMESPACE, router["metadata"]["name"], "--", "python3", "-c", PROCESS_FACTS)
    )
    assert facts == {"uid": 65532, "gid": 65532, "caps": "0000000000000000", "root_writable": False}
    touch = kubectl(
        "exec", "-n", NAMESPACE, router["metadata"]["name"], "--", "sh", "-c", "touch /x 2>&1; echo $?", check=False
    )
    assert "Read-only file system" in touch


def test_sample_pdfs_flow_through_every_stage_exactly_once(pipeline: Pipeline, redis: redis_client.Redis) -> None:
    ids = enqueue_documents(redis, streams("router")["input"], pipeline.documents, copies=4)
    # The parser and grouper start at zero pods: KEDA wakes them up when their input has entries.
    wait_all_grouped(redis, ids, timeout=300)
    assert_exactly_once(redis, ids)
    grouped = json.loads(redis.get(grouped_key(NAMESPACE, ids[1])) or "{}")
    assert grouped, f"{grouped_key(NAMESPACE, ids[1])} is empty"
