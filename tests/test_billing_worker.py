"""Per-user billing inside a real worker: the user's key reaches the processor, never the logs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tests.fixtures.eventually import wait_until
from tests.fixtures.key_service import KeyService, running_key_service
from tests.fixtures.records import committed
from tests.fixtures.stage_s import DLQ, IN, OUT
from tests.fixtures.workers import WorkerPool

PROCESS_KEY = "sk-process-own-key"


@pytest.fixture
async def key_service() -> AsyncIterator[KeyService]:
    async with running_key_service() as service:
        yield service


def billing_env(service: KeyService, **extra: str) -> dict[str, str]:
    return {
        "BILLING_URL": service.url,
        "BILLING_MASTER_KEY": service.master_key,
        "OPENAI_API_KEY": PROCESS_KEY,
        "OUTPUT_QUEUE": OUT,
        "PROCESSOR": "tests.processors:KeyReportingProcessor",
        **extra,
    }


async def test_processor_sees_the_users_key_and_logs_never_do(
    redis: aioredis.Redis, workers: WorkerPool, key_service: KeyService
) -> None:
    for record, user in (("a1", "alice"), ("a2", "alice"), ("b1", "bob"), ("s1", "")):
        await redis.xadd(IN, {"record_id": record, "user_id": user, "data": "{}"})
    w = workers.start("s", **billing_env(key_service))
    await wait_until(lambda: committed(redis, "s", "s1"), "all four processed")
    alice, bob = await redis.get("api_key:user:alice"), await redis.get("api_key:user:bob")
    assert key_service.calls == 2 and sorted(key_service.issued) == sorted([alice, bob])  # alice fetched once
    assert 86000 < await redis.ttl("api_key:user:alice") <= 86400
    for record, key in (("a1", alice), ("a2", alice), ("b1", bob)):
        # The context variable and, with CONCURRENCY=1, the environment both carry the user's key.
        assert await redis.hgetall(f"seen-key:{record}") == {"context": key, "environ": key}
    assert await redis.hgetall("seen-key:s1") == {"context": PROCESS_KEY, "environ": PROCESS_KEY}
    log = w.process.log_path.read_text()
    for secret in (alice, bob, key_service.master_key, PROCESS_KEY):
        assert secret not in log


async def test_billing_outage_is_retried_not_dead_lettered(
    redis: aioredis.Redis, workers: WorkerPool, key_service: KeyService
) -> None:
    key_service.fail_status = 503
    await redis.xadd(IN, {"record_id": "r1", "user_id": "carol", "data": "{}"})
    w = workers.start("s", **billing_env(key_service, CIRCUIT_FAILURE_THRESHOLD="100"))
    await wait_until(lambda: _retried(w), "a retry after the billing outage")
    assert await redis.xlen(DLQ) == 0
    key_service.fail_status = None
    await wait_until(lambda: committed(redis, "s", "r1"), "processed once billing is back", timeout=30)
    [(_, out)] = await redis.xrange(OUT)
    assert json.loads(out["data"]) == {"ok": True}
    assert (await redis.hgetall("seen-key:r1"))["context"] == key_service.issued[-1]


async def test_environment_swap_needs_concurrency_one(workers: WorkerPool, key_service: KeyService) -> None:
    w = workers.start("s", **billing_env(key_service, CONCURRENCY="4"))
    assert w.process.popen.wait(timeout=30) == 2
    text = w.process.log_path.read_text()
    assert text.startswith("phoenix worker: invalid configuration:") and "CONCURRENCY" in text
    assert key_service.master_key not in text


async def _retried(w: object) -> bool:
    events = w.events()  # type: ignore[attr-defined]
    return any(
        e["event"] == "processing_failed_will_retry" and e["error_type"] == "BillingUnavailableError" for e in events
    )
