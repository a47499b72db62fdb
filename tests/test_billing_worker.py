"""Per-user billing inside a real worker: the user's key reaches the processor, never the logs, the DLQ or the
retry entries; a key the LLM service refuses is replaced on the next attempt."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from urllib.parse import quote, urlsplit

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr

from phoenix.keys import billing_cache_key
from phoenix.worker_runtime.billing import ApiKeyProvider
from tests.fixtures.eventually import wait_until
from tests.fixtures.key_service import KeyService, running_key_service
from tests.fixtures.records import committed
from tests.fixtures.replies import get_existing, hash_of, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, RETRY
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
    alice, bob = (await hash_of(redis, "seen-key:a1"))["context"], (await hash_of(redis, "seen-key:b1"))["context"]
    assert key_service.calls == 2 and sorted(key_service.issued) == sorted([alice, bob])  # alice fetched once
    cached = billing_cache_key(KEYS.namespace, "alice")
    assert 86000 < await redis.ttl(cached) <= 86400
    assert alice not in await get_existing(redis, cached)  # cached encrypted
    for record, key in (("a1", alice), ("a2", alice), ("b1", bob)):
        # The context variable and, with CONCURRENCY=1, the environment both carry the user's key.
        assert await hash_of(redis, f"seen-key:{record}") == {"context": key, "environ": key}
    assert await hash_of(redis, "seen-key:s1") == {"context": PROCESS_KEY, "environ": PROCESS_KEY}
    log = w.process.log_path.read_text()
    for secret in (alice, bob, key_service.master_key, PROCESS_KEY):
        assert secret not in log


@pytest.mark.timeout(60)
async def test_a_users_cache_entry_copied_to_another_user_never_bills_the_other_users_records_to_it(
    redis: aioredis.Redis, workers: WorkerPool, key_service: KeyService
) -> None:
    """A processor of the namespace may write its Redis: it copies alice's cached key entry over bob's. bob's next
    record runs on bob's own key, fetched anew, not on alice's; the copy is dropped and logged."""
    await redis.xadd(IN, {"record_id": "a1", "user_id": "alice", "data": "{}"})
    w = workers.start("s", **billing_env(key_service))
    await wait_until(lambda: committed(redis, "s", "a1"), "alice's record processed")
    alice = (await hash_of(redis, "seen-key:a1"))["context"]
    alices_entry = await get_existing(redis, billing_cache_key(KEYS.namespace, "alice"))
    await redis.set(billing_cache_key(KEYS.namespace, "bob"), alices_entry)

    await redis.xadd(IN, {"record_id": "b1", "user_id": "bob", "data": "{}"})
    await wait_until(lambda: committed(redis, "s", "b1"), "bob's record processed")

    bob = (await hash_of(redis, "seen-key:b1"))["context"]
    assert bob != alice and key_service.issued_for[bob]["user_id"] == "bob" and key_service.calls == 2
    (dropped,) = [e for e in w.events() if e["event"] == "billing_cache_entry_dropped"]
    assert dropped["level"] == "warning" and "another user" in dropped["reason"]


@pytest.mark.timeout(60)
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
    [(_, out)] = await stream_entries(redis, OUT)
    assert json.loads(out["data"]) == {"ok": True}
    assert (await hash_of(redis, "seen-key:r1"))["context"] == key_service.issued[-1]


@pytest.mark.timeout(60)
async def test_environment_swap_needs_concurrency_one(workers: WorkerPool, key_service: KeyService) -> None:
    w = workers.start("s", **billing_env(key_service, CONCURRENCY="4"))
    assert w.process.popen.wait(timeout=30) == 2
    text = w.process.log_path.read_text()
    assert text.startswith("phoenix worker: invalid configuration:") and "CONCURRENCY" in text
    assert key_service.master_key not in text


@pytest.mark.timeout(60)
async def test_a_bad_cache_key_stops_the_worker_with_one_line(workers: WorkerPool, key_service: KeyService) -> None:
    w = workers.start("s", **billing_env(key_service, BILLING_CACHE_KEY="sk-not-a-fernet-key"))
    assert w.process.popen.wait(timeout=30) == 2
    [line] = w.process.log_path.read_text().splitlines()
    assert line.startswith("phoenix worker: invalid configuration: BILLING_CACHE_KEY: must be one or more Fernet")
    assert "sk-not-a-fernet-key" not in line


@pytest.mark.timeout(60)
@pytest.mark.parametrize("url", ["ftp://{user}:{password}@billing:4000", "https://{user}:{password}@"])
async def test_a_bad_billing_url_is_refused_without_its_credentials(
    workers: WorkerPool, key_service: KeyService, url: str
) -> None:
    user, password = f"u{secrets.token_hex(4)}", f"pw{secrets.token_hex(8)}"
    w = workers.start("s", **billing_env(key_service, BILLING_URL=url.format(user=user, password=password)))
    assert w.process.popen.wait(timeout=30) == 2
    [line] = w.process.log_path.read_text().splitlines()
    assert line.startswith("phoenix worker: invalid configuration: BILLING_URL: "), line
    assert "://***@" in line and user not in line and password not in line


async def _retried(w: object) -> bool:
    events = w.events()  # type: ignore[attr-defined]
    return any(
        e["event"] == "processing_failed_will_retry" and e["error_type"] == "BillingUnavailableError" for e in events
    )


@pytest.fixture
async def password_url(redis: aioredis.Redis, redis_url: str) -> AsyncIterator[tuple[str, str]]:
    """(REDIS_URL with a user and password, the password) for an ACL user of the test's Valkey. The password holds
    characters the URL must percent-encode and JSON and repr escape, the forms it takes in errors and log lines."""
    user, password = "phx-scrub", f'pw"{secrets.token_hex(8)}\\/'
    await redis.acl_setuser(
        user, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"], commands=["+@all"]
    )
    parts = urlsplit(redis_url)
    netloc = f"{user}:{quote(password, safe='')}@{parts.hostname}:{parts.port}"
    try:
        yield parts._replace(netloc=netloc).geturl(), password
    finally:
        await redis.acl_deluser(user)


@pytest.mark.timeout(60)
async def test_secrets_in_processor_errors_never_reach_the_dlq_the_retries_or_the_logs(
    redis: aioredis.Redis, workers: WorkerPool, key_service: KeyService, password_url: tuple[str, str]
) -> None:
    url, password = password_url
    await redis.xadd(IN, {"record_id": "p1", "user_id": "alice", "data": json.dumps({"permanent": True})})
    await redis.xadd(IN, {"record_id": "t1", "user_id": "alice", "data": "{}"})
    env = billing_env(key_service, REDIS_URL=url, PROCESSOR="tests.processors:SecretQuotingProcessor")
    w = workers.start("s", **env)
    await wait_until(lambda: redis.xlen(DLQ), "the permanent failure dead-lettered")
    await wait_until(
        lambda: _count(w, "processing_failed_will_retry", 2), "the transient failure retried twice", timeout=30
    )
    w.stop()

    [(_, dead)] = await stream_entries(redis, DLQ)
    waiting = await redis.zrange(RETRY, 0, -1)
    promoted = [fields for _, fields in await stream_entries(redis, IN) if "last_error" in fields]
    log = w.process.log_path.read_text()
    assert dead["error"].startswith("key=*** url=redis://phx-scrub:***@") and "master=***" in dead["error"]
    assert waiting and all("key=***" in member for member in waiting)
    assert promoted and all(f["last_error"].startswith("ConnectionError: key=***") for f in promoted)
    assert "Traceback" in log and "password=***" in log
    stored = json.dumps([dead, waiting, promoted])
    [user_key] = key_service.issued
    secret_forms = [user_key, key_service.master_key, password, quote(password, safe="")]
    secret_forms += [json.dumps(value)[1:-1] for value in secret_forms]
    for value in secret_forms:
        assert value not in stored
        assert value not in log


@pytest.mark.timeout(60)
async def test_a_key_the_llm_service_refuses_is_replaced_on_the_next_attempt(
    redis: aioredis.Redis, workers: WorkerPool, key_service: KeyService
) -> None:
    await redis.xadd(IN, {"record_id": "r1", "user_id": "dora", "data": "{}"})
    workers.start("s", **billing_env(key_service, PROCESSOR="tests.processors:KeyRefusingProcessor"))
    await wait_until(lambda: committed(redis, "s", "r1"), "processed on the second attempt", timeout=30)

    assert key_service.calls == 2
    assert await redis.lrange("keys-given:r1", 0, -1) == key_service.issued  # the refused one, then a new one
    reader = ApiKeyProvider(
        redis,
        stage="s",
        namespace=KEYS.namespace,
        billing_url=key_service.url,
        master_key=SecretStr(key_service.master_key),
    )
    try:
        cached = await reader.key_for("dora")
    finally:
        await reader.aclose()
    assert cached is not None and cached.get_secret_value() == key_service.issued[1]
    assert key_service.calls == 2  # from the cache


async def _count(w: object, event: str, at_least: int) -> bool:
    return w.event_names().count(event) >= at_least  # type: ignore[attr-defined]
