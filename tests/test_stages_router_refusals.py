"""A real `phoenix worker` running the router on the embedded Valkey, fed messages that name what no message may
have it read: devices, the pod's own environment, files outside DOCUMENT_ROOT, internal addresses, an endless
body. Each is dead-lettered at its first attempt with the reason, and the worker goes on with the next record."""

from __future__ import annotations

import json
import time
from pathlib import Path

import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.stages.samples import ensure_samples
from tests.fixtures.document_server import document_server
from tests.fixtures.eventually import wait_until
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.workers import WorkerPool

ROUTER = StageKeys.for_stage("router")
OUTPUT = "phoenix:{default}:router:routed"


async def test_hostile_document_urls_are_dead_lettered_at_once_with_the_reason(
    redis: aioredis.Redis, workers: WorkerPool, tmp_path: Path
) -> None:
    root = tmp_path / "docs"
    (sample, *_) = ensure_samples(root)
    (tmp_path / "secret.pdf").write_bytes(b"%PDF-secret")
    (root / "innocent.pdf").symlink_to(tmp_path / "secret.pdf")
    async with document_server() as server:
        hostile = {
            "zero": ("file:///dev/zero", "/dev/zero is not a file under DOCUMENT_ROOT"),
            "environ": ("file:///proc/self/environ", "/proc/self/environ is not a file under DOCUMENT_ROOT"),
            "dot-dot": (f"file://{root}/../secret.pdf", "secret.pdf is not a file under DOCUMENT_ROOT"),
            "symlink": ((root / "innocent.pdf").as_uri(), "innocent.pdf is not a file under DOCUMENT_ROOT"),
            "metadata": (
                server.url("/to?location=http://169.254.169.254/latest/meta-data/"),
                "169.254.169.254 is a link-local address",
            ),
            "endless": (server.url("/endless"), "larger than MAX_DOCUMENT_BYTES (1048576 bytes)"),
            "scheme": ("gopher://127.0.0.1:6379/_FLUSHALL", "unsupported document URL scheme 'gopher'"),
        }
        workers.start(
            "router",
            processor="router",
            OUTPUT_QUEUE=OUTPUT,
            DOCUMENT_ROOT=str(root),
            MAX_DOCUMENT_BYTES=str(1 << 20),
            DOCUMENT_ALLOWED_NETWORKS="127.0.0.1/32",  # the test's own server; not the addresses it redirects to
            BILLING_MASTER_KEY="master-key-of-the-fleet",  # in the worker's environment, as in a pod
        )
        began = time.monotonic()
        for record_id, (url, _) in hostile.items():
            await add_entry(redis, ROUTER.input, {"record_id": record_id, "document_url": url})
        await add_entry(redis, ROUTER.input, {"record_id": "fine", "document_url": sample.as_uri()})

        async def settled() -> bool:
            return await redis.xlen(ROUTER.dlq) == len(hostile) and await redis.xlen(OUTPUT) == 1

        await wait_until(settled, "every hostile record dead-lettered and the sample routed", timeout=25)
        elapsed = time.monotonic() - began

    dead = {fields["record_id"]: fields for _, fields in await stream_entries(redis, ROUTER.dlq)}
    assert set(dead) == set(hostile)
    for record_id, (_, reason) in hostile.items():
        entry = dead[record_id]
        assert (entry["error_type"], entry["attempts"]) == ("RefusedDocumentError", "1"), entry
        assert reason in entry["error"], entry["error"]
    assert elapsed < 15  # refused, not read: /dev/zero alone would take until the pod is killed
    # Nothing of the pod's environment left it: not in the DLQ, not in the pages.
    stored = json.dumps([await stream_entries(redis, ROUTER.dlq), await redis.keys("*")])
    assert "master-key-of-the-fleet" not in stored and "REDIS_URL" not in stored
    [(_, routed)] = await stream_entries(redis, OUTPUT)
    assert json.loads(routed["data"])["document_name"] == sample.name
