"""Per-user billing keys against a real Valkey and a LiteLLM-compatible key service over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
import structlog
import structlog.testing
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from prometheus_client import REGISTRY
from pydantic import SecretStr

from phoenix.keys import billing_cache_key, billing_guard_key
from phoenix.worker_runtime.billing import (
    API_KEY_ENV,
    ApiKeyProvider,
    ApiKeyRejectedError,
    BillingConfigError,
    BillingUnavailableError,
    api_key_scope,
    current_api_key,
    load_billing_settings,
)
from tests.fixtures.key_service import KeyService, running_key_service
from tests.fixtures.replies import get_existing

MakeProvider = Callable[..., ApiKeyProvider]
NS = "tenant-a"  # the KEY_NAMESPACE of the providers below


def cache_entry(user_id: str) -> str:
    return billing_cache_key(NS, user_id)


def guard(user_id: str) -> str:
    return billing_guard_key(NS, user_id)


@pytest.fixture
async def key_service() -> AsyncIterator[KeyService]:
    async with running_key_service() as service:
        yield service


@pytest.fixture
def stage() -> str:
    """A stage label of its own per test, so metric counts start at zero."""
    return f"billing-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def providers(redis: aioredis.Redis, key_service: KeyService, stage: str) -> AsyncIterator[MakeProvider]:
    """Builds providers ("workers") configured for the key service; keyword arguments override."""
    created: list[ApiKeyProvider] = []

    def make(client: aioredis.Redis | None = None, **overrides: Any) -> ApiKeyProvider:
        kwargs: dict[str, Any] = {
            "stage": stage,
            "namespace": NS,
            "billing_url": key_service.url,
            "master_key": SecretStr(key_service.master_key),
        }
        provider = ApiKeyProvider(client or redis, **(kwargs | overrides))
        created.append(provider)
        return provider

    yield make
    for provider in created:
        await provider.aclose()


@pytest.fixture
def billing_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No billing variables or OPENAI_API_KEY from the surrounding environment leak into a test."""
    for name in (
        "BILLING_URL",
        "BILLING_MASTER_KEY",
        "BILLING_SWAP_ENV",
        "BILLING_CACHE_KEY",
        "BILLING_CACHE_MAX_AGE",
        API_KEY_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def lookups(stage: str, result: str) -> float:
    labels = {"stage": stage, "result": result}
    return REGISTRY.get_sample_value("phoenix_billing_key_lookups_total", labels) or 0.0


def secret(key: SecretStr | None) -> str:
    assert key is not None
    return key.get_secret_value()


async def outlive_ttl(client: aioredis.Redis, name: str) -> None:
    """Sleep past the key's expiry; Redis then never returns it (expired keys are dropped on access)."""
    await asyncio.sleep(await client.pttl(name) / 1000 + 0.05)
    assert not await client.exists(name)


@pytest.mark.subprocess
async def test_cached_key_is_used_without_billing_call_and_its_age_never_extended(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider, stage: str
) -> None:
    key = secret(await providers().key_for("alice"))
    left = await redis.pttl(cache_entry("alice"))
    await asyncio.sleep(0.05)

    assert secret(await providers().key_for("alice")) == key  # another worker, from the cache

    assert key_service.calls == 1
    assert await redis.pttl(cache_entry("alice")) < left  # reading it did not renew it
    assert (lookups(stage, "hit"), lookups(stage, "miss")) == (1, 1)


async def test_miss_fetches_once_with_master_key_and_caches_for_a_day(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider, stage: str
) -> None:
    provider = providers()

    first = secret(await provider.key_for("bob"))
    second = secret(await provider.key_for("bob"))

    assert key_service.calls == 1
    assert first == second == key_service.issued[0]
    assert key_service.requests[0]["user_id"] == "bob"
    assert key_service.requests[0]["metadata"] == {"source": "phoenix", "phoenix_stage": stage, "phoenix_namespace": NS}
    assert await redis.exists(cache_entry("bob"))
    assert 86000 < await redis.ttl(cache_entry("bob")) <= 86400
    assert not await redis.exists(guard("bob"))
    assert (lookups(stage, "hit"), lookups(stage, "miss")) == (1, 1)


async def test_each_namespace_has_its_own_cache_of_a_users_key(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    """Two tenants on one Redis, the same user id: neither reads or fills the other's cache."""
    ours, theirs = providers(), providers(namespace="tenant-b")

    mine = secret(await ours.key_for("ann"))
    other = secret(await theirs.key_for("ann"))

    assert key_service.calls == 2 and mine != other
    assert [r["metadata"]["phoenix_namespace"] for r in key_service.requests] == [NS, "tenant-b"]
    assert secret(await ours.key_for("ann")) == mine and secret(await theirs.key_for("ann")) == other
    assert key_service.calls == 2  # both from their own cache
    assert sorted(await redis.keys("*ann*")) == sorted([cache_entry("ann"), billing_cache_key("tenant-b", "ann")])


async def _every_value(client: aioredis.Redis) -> str:
    """Everything Redis holds, as one text: each key's name and its DUMP (any type)."""
    return "\n".join([f"{name}={await client.dump(name)!r}" async for name in client.scan_iter()])


async def test_keys_are_encrypted_at_rest_with_the_cache_key(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    cache_key = SecretStr(Fernet.generate_key().decode())

    key = secret(await providers(cache_key=cache_key).key_for("bea"))

    assert key not in await _every_value(redis)
    assert (await get_existing(redis, cache_entry("bea"))).startswith("v2:")
    assert secret(await providers(cache_key=cache_key).key_for("bea")) == key and key_service.calls == 1
    # Sealed under the cache key, not the master key every worker also has.
    assert secret(await providers().key_for("bea")) != key and key_service.calls == 2


async def test_without_a_cache_key_the_fleet_shares_a_key_derived_from_the_master_key(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    key = secret(await providers().key_for("cleo"))

    assert key not in await _every_value(redis)
    assert secret(await providers().key_for("cleo")) == key  # another worker reads it
    assert key_service.calls == 1


def _v1_entry(master_key: str, api_key: str) -> str:
    """An entry as the version before CacheSeal wrote it: Fernet under a key derived from the master key alone,
    bound to no user nor namespace."""
    hkdf = HKDF(algorithm=SHA256(), length=32, salt=None, info=b"phoenix billing cache v1")
    derived = hkdf.derive(master_key.encode())
    return Fernet(base64.urlsafe_b64encode(derived)).encrypt(api_key.encode()).decode()


@pytest.mark.parametrize("entry", ["plaintext", "earlier format", "other cache key"])
async def test_an_unreadable_entry_is_dropped_and_the_key_fetched_anew(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider, entry: str
) -> None:
    # A plaintext entry cached before encryption, one a running stage cached before this version (a miss, not an
    # error), or one sealed with a cache key this worker does not have.
    if entry == "other cache key":
        await providers(cache_key=SecretStr(Fernet.generate_key().decode())).key_for("dina")
        value, fetched = await get_existing(redis, cache_entry("dina")), 1
    else:
        value, fetched = "sk-plain-old" if entry == "plaintext" else _v1_entry(key_service.master_key, "sk-x"), 0
        await redis.set(cache_entry("dina"), value, ex=100)

    key = secret(await providers().key_for("dina"))

    assert key == key_service.issued[fetched] and key_service.calls == fetched + 1
    assert await redis.get(cache_entry("dina")) not in (value, None)
    assert secret(await providers().key_for("dina")) == key


async def test_an_entry_copied_to_another_users_key_is_a_miss_logged_once(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    """Anyone who may write the namespace's Redis (its processors) copies user A's entry to user B's key: B's
    records must not run on A's key. Two workers read the copy at once; the one whose delete took it logs it."""
    alice = secret(await providers().key_for("alice"))
    await providers().key_for("bob")
    await redis.set(cache_entry("bob"), await get_existing(redis, cache_entry("alice")), ex=100)

    with structlog.testing.capture_logs() as logged:
        seen = await asyncio.gather(providers().key_for("bob"), providers().key_for("bob"))

    assert {secret(key) for key in seen} == {key_service.issued[2]} and key_service.calls == 3
    assert key_service.issued_for[key_service.issued[2]]["user_id"] == "bob" and alice not in map(secret, seen)
    (dropped,) = [line for line in logged if line["event"] == "billing_cache_entry_dropped"]
    assert dropped["reason"] == "sealed for another user or namespace, or under another cache key"
    assert dropped["cache_key"] == cache_entry("bob") and dropped["log_level"] == "warning"


@pytest.mark.parametrize("cache_key", [None, Fernet.generate_key().decode()], ids=["master key", "cache key"])
async def test_namespaces_sharing_a_key_cannot_use_each_others_entries(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider, cache_key: str | None
) -> None:
    """Two tenants whose workers share BILLING_MASTER_KEY (or BILLING_CACHE_KEY): an entry of one copied into the
    other's cache opens for no one there (the namespace is the derivation's info and the entry's associated data)."""
    shared = {"cache_key": SecretStr(cache_key)} if cache_key else {}
    ours, theirs = providers(**shared), providers(namespace="tenant-b", **shared)
    mine = secret(await ours.key_for("ann"))
    await redis.set(billing_cache_key("tenant-b", "ann"), await get_existing(redis, cache_entry("ann")), ex=100)

    other = secret(await theirs.key_for("ann"))

    assert other != mine and other == key_service.issued[1] and key_service.calls == 2


async def test_the_cache_has_a_hard_maximum_age(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    provider = providers(cache_max_age=1)
    first = secret(await provider.key_for("edna"))
    assert 0 < await redis.pttl(cache_entry("edna")) <= 1000
    # Kept past its expiry (PERSIST, a restored dump): its own creation time still ends it.
    await redis.persist(cache_entry("edna"))
    await asyncio.sleep(2.1)  # Fernet's timestamps have a resolution of one second

    second = secret(await provider.key_for("edna"))

    assert (first, second) == tuple(key_service.issued) and key_service.calls == 2


async def test_a_refused_key_is_dropped_and_the_next_attempt_fetches_a_new_one(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    worker, other = providers(), providers()
    refused = await worker.key_for("fay")

    with pytest.raises(ApiKeyRejectedError), api_key_scope(refused, swap_env=False):
        raise ApiKeyRejectedError("HTTP 401")
    # The drop is one Redis call started as the processor's call ends; the worker's own next lookup waits for it,
    # another worker's comes after the retry's backoff.
    fresh = secret(await worker.key_for("fay"))

    assert fresh != secret(refused) and (secret(refused), fresh) == tuple(key_service.issued)
    assert secret(await other.key_for("fay")) == fresh and key_service.calls == 2


async def test_a_late_refusal_does_not_drop_the_newer_key(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    worker, other = providers(), providers()
    old = await worker.key_for("gail")
    await redis.delete(cache_entry("gail"))  # expired, say, and fetched again by another worker
    newer = secret(await other.key_for("gail"))

    with pytest.raises(ApiKeyRejectedError), api_key_scope(old, swap_env=False):
        raise ApiKeyRejectedError("HTTP 403")
    await worker.aclose()  # waits for the drop

    assert secret(await other.key_for("gail")) == newer and key_service.calls == 2


async def test_concurrent_workers_fetch_a_users_key_once(
    redis_url: str, key_service: KeyService, providers: MakeProvider, stage: str
) -> None:
    clients = [aioredis.Redis.from_url(redis_url, decode_responses=True) for _ in range(4)]
    workers = [providers(client) for client in clients]
    key_service.hold()
    try:
        tasks = [asyncio.create_task(workers[i % 4].key_for("carol")) for i in range(20)]
        await key_service.wait_for_calls(1)
        await asyncio.sleep(0.2)  # lets the other lookups reach the guard and wait; not asserted on
        key_service.release()
        keys = await asyncio.gather(*tasks)
    finally:
        for client in clients:
            await client.aclose()

    assert key_service.calls == 1
    assert {secret(key) for key in keys} == {key_service.issued[0]}
    assert (lookups(stage, "hit"), lookups(stage, "miss")) == (19, 1)


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


OUTAGES: dict[str, Callable[[KeyService], dict[str, Any]]] = {
    "http 503": lambda s: {"_fail_status": 503},
    "http 500": lambda s: {"_fail_status": 500},
    "not json": lambda s: {"_raw_reply": "<html>bad gateway</html>"},
    "no key field": lambda s: {"_raw_reply": '{"token": "x"}'},
    "empty key": lambda s: {"_raw_reply": '{"key": ""}'},
    "not an object": lambda s: {"_raw_reply": '["sk-x"]'},
    "timeout": lambda s: {"_delay": 2.0, "request_timeout": 0.3},
    "connection refused": lambda s: {"billing_url": f"http://127.0.0.1:{_unused_port()}"},
    "wrong master key": lambda s: {"master_key": SecretStr("sk-not-the-master")},
}


@pytest.mark.parametrize("outage", list(OUTAGES))
async def test_billing_outage_is_transient_caches_nothing_and_frees_the_guard(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider, outage: str
) -> None:
    setup = OUTAGES[outage](key_service)
    key_service.fail_status = setup.pop("_fail_status", None)
    key_service.raw_reply = setup.pop("_raw_reply", None)
    key_service.delay = setup.pop("_delay", 0.0)

    with pytest.raises(BillingUnavailableError, match="billing service"):
        await providers(**setup).key_for("dave")

    assert not await redis.exists(cache_entry("dave"))
    assert not await redis.exists(guard("dave"))
    # Once the service is healthy again, the retried message gets its key.
    key_service.fail_status, key_service.raw_reply, key_service.delay = None, None, 0.0
    assert secret(await providers().key_for("dave")) == key_service.issued[-1]


async def test_rejected_master_key_is_named_in_the_error(providers: MakeProvider) -> None:
    with pytest.raises(BillingUnavailableError, match=r"rejected BILLING_MASTER_KEY \(HTTP 401\)"):
        await providers(master_key=SecretStr("sk-not-the-master")).key_for("erin")


async def test_waiter_takes_over_a_guard_left_by_a_crashed_worker(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    await redis.set(guard("frank"), "crashed-worker-token", ex=1)

    key = secret(await providers().key_for("frank"))

    assert key_service.calls == 1
    assert secret(await providers().key_for("frank")) == key


async def test_waiter_gives_up_as_transient_when_the_guard_never_frees(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    await redis.set(guard("gina"), "stuck-worker-token", ex=60)

    with pytest.raises(BillingUnavailableError, match="waiting for another worker"):
        await providers(max_wait=0.3).key_for("gina")

    assert key_service.calls == 0
    assert await redis.get(guard("gina")) == "stuck-worker-token"


@pytest.mark.timeout(90)
async def test_slow_fetch_past_guard_expiry_keeps_the_new_owners_guard_and_converges_on_one_key(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider
) -> None:
    slow = providers(guard_ttl=1, request_timeout=60)
    patient = providers(guard_ttl=60)
    key_service.hold()

    first = asyncio.create_task(slow.key_for("hank"))
    await key_service.wait_for_calls(1)
    await outlive_ttl(redis, guard("hank"))  # the slow worker's guard expires mid-fetch
    second = asyncio.create_task(patient.key_for("hank"))
    await key_service.wait_for_calls(2)
    second_guard = await redis.get(guard("hank"))

    key_service.release(1)  # the slow worker's reply arrives first
    first_key = secret(await first)
    assert await redis.get(guard("hank")) == second_guard  # released by its owner only
    key_service.release()
    second_key = secret(await second)

    assert first_key == second_key == key_service.issued[0]
    assert secret(await providers().key_for("hank")) == first_key and key_service.calls == 2
    assert not await redis.exists(guard("hank"))


async def test_no_user_or_billing_off_means_the_process_key(
    redis: aioredis.Redis, key_service: KeyService, providers: MakeProvider, billing_env: pytest.MonkeyPatch
) -> None:
    billing_env.setenv(API_KEY_ENV, "sk-process")

    assert await providers().key_for("") is None
    assert await providers(billing_url=None, master_key=None).key_for("ivan") is None
    with api_key_scope(None, swap_env=True):
        assert current_api_key() == "sk-process"
        assert os.environ[API_KEY_ENV] == "sk-process"

    assert key_service.calls == 0
    assert await redis.dbsize() == 0
    billing_env.delenv(API_KEY_ENV)
    assert current_api_key() is None


@pytest.mark.parametrize("previous", ["sk-process", None])
@pytest.mark.parametrize("processor_raises", [False, True])
def test_env_swap_is_restored_after_the_processor(
    billing_env: pytest.MonkeyPatch, previous: str | None, processor_raises: bool
) -> None:
    if previous is not None:
        billing_env.setenv(API_KEY_ENV, previous)

    def processor() -> None:
        assert os.environ[API_KEY_ENV] == current_api_key() == "sk-user"
        if processor_raises:
            raise RuntimeError("LLM call failed")

    try:
        with api_key_scope(SecretStr("sk-user"), swap_env=True):
            processor()
    except RuntimeError:
        assert processor_raises

    assert os.environ.get(API_KEY_ENV) == previous
    assert current_api_key() == previous
    with api_key_scope(SecretStr("sk-next-user"), swap_env=True):  # the swap was released too
        assert os.environ[API_KEY_ENV] == "sk-next-user"


def test_scope_without_swap_leaves_the_environment_alone(billing_env: pytest.MonkeyPatch) -> None:
    billing_env.setenv(API_KEY_ENV, "sk-process")

    with api_key_scope(SecretStr("sk-user"), swap_env=False):
        assert current_api_key() == "sk-user"
        assert os.environ[API_KEY_ENV] == "sk-process"


def test_overlapping_env_swaps_are_refused(billing_env: pytest.MonkeyPatch) -> None:
    with api_key_scope(SecretStr("sk-a"), swap_env=True):
        with pytest.raises(BillingConfigError, match="CONCURRENCY=1"), api_key_scope(SecretStr("sk-b"), swap_env=True):
            pass
        assert os.environ[API_KEY_ENV] == current_api_key() == "sk-a"
    assert API_KEY_ENV not in os.environ


async def test_concurrent_messages_each_see_their_own_key(billing_env: pytest.MonkeyPatch) -> None:
    billing_env.setenv(API_KEY_ENV, "sk-process")
    both_inside = asyncio.Barrier(2)

    async def message(key: str) -> tuple[str | None, str | None]:
        with api_key_scope(SecretStr(key), swap_env=False):
            await both_inside.wait()
            return current_api_key(), await asyncio.to_thread(current_api_key)

    assert await asyncio.gather(message("sk-a"), message("sk-b")) == [("sk-a", "sk-a"), ("sk-b", "sk-b")]
    assert current_api_key() == "sk-process"


@pytest.mark.parametrize(
    ("env", "concurrency", "swaps"),
    [
        ({}, 8, False),
        ({"BILLING_URL": "http://litellm:4000"}, 1, True),
        ({"BILLING_URL": "http://litellm:4000", "BILLING_SWAP_ENV": "false"}, 8, False),
        ({"BILLING_URL": "", "BILLING_SWAP_ENV": "true"}, 8, False),
    ],
    ids=["off", "on, swap by default", "on, no swap, concurrent", "empty url is off"],
)
def test_settings_that_can_work_are_accepted(
    billing_env: pytest.MonkeyPatch, env: dict[str, str], concurrency: int, swaps: bool
) -> None:
    for name, value in env.items():
        billing_env.setenv(name, value)

    settings = load_billing_settings()
    settings.check(concurrency)

    assert settings.swap_env is swaps


@pytest.mark.parametrize("swap", [None, "true"])
def test_env_swap_with_concurrency_is_refused_at_start(billing_env: pytest.MonkeyPatch, swap: str | None) -> None:
    billing_env.setenv("BILLING_URL", "http://litellm:4000")
    if swap is not None:
        billing_env.setenv("BILLING_SWAP_ENV", swap)

    refusal = r"CONCURRENCY=1 \(got CONCURRENCY=3\).*BILLING_SWAP_ENV=false"
    with pytest.raises(BillingConfigError, match=refusal):
        load_billing_settings().check(3)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"BILLING_URL": "litellm:4000"}, "BILLING_URL"),
        ({"BILLING_URL": "http://litellm:4000", "BILLING_SWAP_ENV": "sometimes"}, "BILLING_SWAP_ENV"),
        ({"BILLING_URL": "http://litellm:4000", "BILLING_CACHE_KEY": "sk-master-do-not-echo"}, "BILLING_CACHE_KEY"),
        ({"BILLING_URL": "http://litellm:4000", "BILLING_CACHE_MAX_AGE": "0"}, "BILLING_CACHE_MAX_AGE"),
    ],
)
def test_bad_settings_name_the_variable_and_not_the_master_key(
    billing_env: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    billing_env.setenv("BILLING_MASTER_KEY", "sk-master-do-not-echo")
    for name, value in env.items():
        billing_env.setenv(name, value)

    with pytest.raises(BillingConfigError, match=named) as raised:
        load_billing_settings()

    assert "sk-master-do-not-echo" not in str(raised.value)


def test_billing_url_without_master_key_is_refused(redis: aioredis.Redis) -> None:
    for master_key in (None, SecretStr("")):
        with pytest.raises(BillingConfigError, match="BILLING_MASTER_KEY"):
            ApiKeyProvider(redis, stage="s", namespace=NS, billing_url="http://litellm:4000", master_key=master_key)


@pytest.fixture
def rendered_logs() -> Iterator[io.StringIO]:
    """structlog rendered as JSON with tracebacks and their frames' locals, as a worker would log."""
    saved = structlog.get_config()
    out = io.StringIO()
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.dict_tracebacks,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    yield out
    structlog.configure(**saved)


async def test_keys_never_reach_logs_errors_or_reprs(
    key_service: KeyService,
    providers: MakeProvider,
    billing_env: pytest.MonkeyPatch,
    rendered_logs: io.StringIO,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    billing_env.setenv(API_KEY_ENV, "sk-process-own-key")
    billing_env.setenv("BILLING_URL", key_service.url)
    billing_env.setenv("BILLING_MASTER_KEY", key_service.master_key)
    settings = load_billing_settings()
    provider = providers(master_key=settings.billing_master_key)
    logger = structlog.get_logger("worker")
    errors: list[BaseException] = []

    key = await provider.key_for("judy")
    logger.info("lookup", key=key, again=await provider.key_for("judy"))
    try:
        with api_key_scope(key, swap_env=True):
            raise RuntimeError("LLM call failed")
    except RuntimeError as exc:
        errors.append(exc)
        logger.exception("processor failed")
    key_service.delay = 1.0
    wrong_master_key = providers(master_key=SecretStr(key_service.master_key + "x"))
    for broken in (wrong_master_key, providers(request_timeout=0.2)):
        try:
            await broken.key_for("kate")
        except BillingUnavailableError as exc:
            errors.append(exc)
            logger.exception("billing unavailable")

    # Frames' locals were rendered, so the check below means something.
    assert '"locals"' in rendered_logs.getvalue()
    assert len(errors) == 3
    shown = "\n".join(
        [rendered_logs.getvalue(), caplog.text, repr(settings), repr(provider), repr(key)]
        + [f"{exc!s} {exc!r}" for exc in errors]
    )
    for value in [*key_service.issued, key_service.master_key, "sk-process-own-key"]:
        assert value not in shown
