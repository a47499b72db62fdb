"""Per-user LLM billing: a message's LLM calls run on its user's own API key, fetched once, cached in Redis.

Keys: `api_key:user:{user_id}` caches the key for 24 h (the TTL is refreshed on every use);
`fetching_key:{user_id}` is a short guard so that only one worker of the whole fleet asks the billing service
(LiteLLM-compatible `POST /key/generate`) while the others wait for the cache.

Keys are kept in `SecretStr` until the moment a library needs the plain string, so they never show up in
logs, exception messages, reprs or the locals of a rendered traceback.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import aiohttp
import structlog
from pydantic import SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio import Redis
from yarl import URL

from phoenix.worker_runtime import lua
from phoenix.worker_runtime.metrics import BILLING_KEY_LOOKUPS
from phoenix.worker_runtime.redis_client import text
from phoenix.worker_runtime.settings import ConfigurationError, describe_validation_error

API_KEY_ENV = "OPENAI_API_KEY"
KEY_TTL_SECONDS = 86400
GUARD_TTL_SECONDS = 10
# Below the guard TTL, so a slow but answering service never lets a second worker take over the guard.
REQUEST_TIMEOUT_SECONDS = 8.0
POLL_SECONDS = 0.05

log = structlog.get_logger(__name__)

_current_key: ContextVar[SecretStr | None] = ContextVar("phoenix_billing_api_key", default=None)
# Held while OPENAI_API_KEY is swapped: a second concurrent swap would bill one user's calls to another.
_env_swap = threading.Lock()


class BillingUnavailableError(Exception):
    """The billing service could not provide a key (outage, timeout, 5xx, rejected master key, bad reply).

    Transient: the message is retried with backoff, never dead-lettered; it is not the message's fault.
    """


class BillingConfigError(ConfigurationError):
    """Billing settings that cannot work; raised at worker start."""


class BillingSettings(BaseSettings):
    """BILLING_URL (unset = billing off), BILLING_MASTER_KEY, BILLING_SWAP_ENV (true/false; unset = auto)."""

    # Empty variables count as unset: manifests often render an absent optional value as "".
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True, env_ignore_empty=True)

    billing_url: str | None = None
    billing_master_key: SecretStr | None = None
    billing_swap_env: bool | None = None

    @field_validator("billing_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and (URL(value).scheme not in ("http", "https") or not URL(value).host):
            raise ValueError("must be an http(s) URL such as http://litellm:4000")
        return value

    @property
    def enabled(self) -> bool:
        return self.billing_url is not None

    @property
    def swap_env(self) -> bool:
        """Whether OPENAI_API_KEY is swapped per message.

        Unset means on whenever billing is on: libraries that only read the environment would otherwise
        silently bill every call to the process's own account.
        """
        return self.enabled and self.billing_swap_env is not False

    def check(self, concurrency: int) -> None:
        """Refuse combinations that would bill users wrongly; call once at worker start."""
        if self.swap_env and concurrency > 1:
            raise BillingConfigError(
                "billing swaps OPENAI_API_KEY in the process environment, which is only safe with "
                f"CONCURRENCY=1 (got CONCURRENCY={concurrency}): set CONCURRENCY=1, or set "
                "BILLING_SWAP_ENV=false and have the processor pass "
                "phoenix.worker_runtime.billing.current_api_key() to its LLM client"
            )


def load_billing_settings() -> BillingSettings:
    """BillingSettings from the environment; a bad value raises ConfigurationError naming the variable."""
    try:
        return BillingSettings()
    except ValidationError as exc:
        raise BillingConfigError(describe_validation_error(exc)) from None


class ApiKeyProvider:
    """Finds the API key of a message's user: from the Redis cache, else fetched once for the whole fleet.

    `redis` must be a decoded client (decode_responses=True). One aiohttp session per provider; `aclose()` it.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        stage: str,
        billing_url: str | None,
        master_key: SecretStr | None,
        guard_ttl: int = GUARD_TTL_SECONDS,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        max_wait: float | None = None,
    ) -> None:
        if billing_url is not None and (master_key is None or not master_key.get_secret_value()):
            raise BillingConfigError("BILLING_URL is set but BILLING_MASTER_KEY is not")
        self._redis = redis
        self._stage = stage
        self._endpoint = URL(billing_url) / "key/generate" if billing_url is not None else None
        self._master_key = master_key
        self._guard_ttl = guard_ttl
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        # Long enough to outlast one crashed guard owner and one full fetch by the next owner.
        self._max_wait = max_wait if max_wait is not None else guard_ttl + request_timeout
        self._release_guard = lua.register(redis, "billing_release_guard.lua")
        self._session: aiohttp.ClientSession | None = None

    @property
    def enabled(self) -> bool:
        return self._endpoint is not None

    async def key_for(self, user_id: str) -> SecretStr | None:
        """The user's own API key, or None when there is none (billing off, or empty user_id).

        None means: use the process's own key (`api_key_scope(None, ...)` does exactly that).

        An empty user_id is not an error: system messages without a user run on the process's key.
        Raises BillingUnavailableError (transient) when the billing service cannot provide a key.
        """
        if self._endpoint is None or not user_id:
            return None
        cache_key, guard_key = f"api_key:user:{user_id}", f"fetching_key:{user_id}"
        deadline = asyncio.get_running_loop().time() + self._max_wait
        while True:
            if (cached := await self._cached(cache_key)) is not None:
                return cached
            token = secrets.token_hex(16)
            if await self._redis.set(guard_key, token, nx=True, ex=self._guard_ttl):
                try:
                    # The previous owner may have cached the key between our miss and our SET NX.
                    if (cached := await self._cached(cache_key)) is not None:
                        return cached
                    BILLING_KEY_LOOKUPS.labels(stage=self._stage, result="miss").inc()
                    return await self._fetch_and_cache(user_id, cache_key)
                finally:
                    await self._release_guard(keys=[guard_key], args=[token])
            if asyncio.get_running_loop().time() >= deadline:
                raise BillingUnavailableError(
                    f"gave up after {self._max_wait:g}s waiting for another worker to fetch the API key of "
                    f"user {user_id!r}"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _cached(self, cache_key: str) -> SecretStr | None:
        value = await self._redis.getex(cache_key, ex=KEY_TTL_SECONDS)
        if value is None:
            return None
        BILLING_KEY_LOOKUPS.labels(stage=self._stage, result="hit").inc()
        return SecretStr(text(value))

    async def _fetch_and_cache(self, user_id: str, cache_key: str) -> SecretStr:
        fetched = await self._fetch(user_id)
        # NX GET: if a worker whose guard expired mid-fetch cached its key first, everyone adopts that one.
        earlier = await self._redis.set(cache_key, fetched.get_secret_value(), nx=True, get=True, ex=KEY_TTL_SECONDS)
        log.info("billing key fetched", user_id=user_id, stage=self._stage, adopted_earlier=earlier is not None)
        return SecretStr(text(earlier)) if earlier is not None else fetched

    async def _fetch(self, user_id: str) -> SecretStr:
        assert self._endpoint is not None and self._master_key is not None
        shown = self._endpoint.with_user(None)  # credentials in BILLING_URL stay out of messages
        body = {"user_id": user_id, "metadata": {"source": "phoenix", "phoenix_stage": self._stage}}
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(
                self._endpoint,
                json=body,
                headers={"Authorization": f"Bearer {self._master_key.get_secret_value()}"},
            ) as response:
                if response.status in (401, 403):
                    raise BillingUnavailableError(
                        f"billing service at {shown} rejected BILLING_MASTER_KEY (HTTP {response.status})"
                    )
                if response.status // 100 != 2:
                    raise BillingUnavailableError(f"billing service at {shown} answered HTTP {response.status}")
                reply: Any = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            # `from None`: aiohttp errors carry the request headers (the master key) in request_info.
            detail = f": {exc}" if str(exc) else ""
            raise BillingUnavailableError(
                f"billing service at {shown} unreachable or unreadable ({type(exc).__name__}{detail})"
            ) from None
        key = reply.get("key") if isinstance(reply, dict) else None
        if not isinstance(key, str) or not key:
            raise BillingUnavailableError(f"billing service at {shown} replied without a 'key' string")
        return SecretStr(key)


def current_api_key() -> str | None:
    """The API key LLM calls must use now: the user's key inside `api_key_scope`, else the process's own.

    Visible in threads started with `BaseProcessor.run_blocking` (they copy the context).
    """
    key = _current_key.get()
    return key.get_secret_value() if key is not None else os.environ.get(API_KEY_ENV)


@contextmanager
def api_key_scope(key: SecretStr | None, *, swap_env: bool) -> Iterator[None]:
    """Make `key` the current API key for the enclosed processor call; None keeps the process's key.

    With `swap_env`, OPENAI_API_KEY is also set in os.environ and restored (or unset again) on exit, even when
    the processor raises. Only one swap may be active at a time (CONCURRENCY=1, see BillingSettings.check).
    """
    context_token = _current_key.set(key)
    swapping = swap_env and key is not None
    if swapping and not _env_swap.acquire(blocking=False):
        _current_key.reset(context_token)
        raise BillingConfigError(
            "two messages swapped OPENAI_API_KEY at once; environment swapping needs CONCURRENCY=1"
        )
    saved = _read_env_key() if swapping else None
    try:
        if swapping:
            assert key is not None
            os.environ[API_KEY_ENV] = key.get_secret_value()
        yield
    finally:
        if swapping:
            _restore_env_key(saved)
            _env_swap.release()
        _current_key.reset(context_token)


def _read_env_key() -> SecretStr | None:
    value = os.environ.get(API_KEY_ENV)
    return SecretStr(value) if value is not None else None


def _restore_env_key(saved: SecretStr | None) -> None:
    if saved is None:
        os.environ.pop(API_KEY_ENV, None)
    else:
        os.environ[API_KEY_ENV] = saved.get_secret_value()
