"""Per-user LLM billing: a message's LLM calls run on its user's own API key, fetched once, cached in Redis.

Keys, scoped by the stage's KEY_NAMESPACE (phoenix/keys.py) so that no tenant reads or fills another's cache:
`billing_cache_key` (`phoenix:{<namespace>}:_billing-key:<user id>`) caches the key sealed (CacheSeal: AES-256-GCM
under a key derived for the namespace, the namespace and the user id authenticated with it, its fetch time inside),
for at most BILLING_CACHE_MAX_AGE seconds after it was fetched: reading it never extends its life. An entry that
does not open (sealed for another user or namespace, under another cache key, in an earlier format, too old) is a
miss: dropped, logged by the worker that dropped it, and the key fetched anew; it is never used. Whoever may write
the namespace's Redis (its processors do) can therefore delete entries, never make one user's records run on another
user's key. `billing_guard_key` is a short guard so that only one worker of the namespace asks the billing service
(LiteLLM-compatible `POST /key/generate`) while the others wait for the cache.
A processor whose LLM service refuses the user's key (HTTP 401/403) raises ApiKeyRejectedError: the cached key is
dropped at once, for the whole namespace, and the retried message runs on a newly fetched one.

Keys are kept in `SecretStr` until the moment a library needs the plain string, so they never show up in
logs, exception messages, reprs or the locals of a rendered traceback; and every key handed to a processor is
masked out of the error strings the runtime stores or logs (scrub.py).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import aiohttp
import structlog
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio import Redis
from redis.exceptions import RedisError
from yarl import URL

from phoenix import lua
from phoenix.errors import ConfigError, PhoenixError
from phoenix.keys import billing_cache_key, billing_guard_key
from phoenix.redis_replies import text
from phoenix.worker_runtime import scrub
from phoenix.worker_runtime.metrics import BILLING_KEY_LOOKUPS
from phoenix.worker_runtime.settings import describe_validation_error

API_KEY_ENV = "OPENAI_API_KEY"
KEY_MAX_AGE_SECONDS = 86400
GUARD_TTL_SECONDS = 10
# Below the guard TTL, so a slow but answering service never lets a second worker take over the guard.
REQUEST_TIMEOUT_SECONDS = 8.0
POLL_SECONDS = 0.05

log = structlog.get_logger(__name__)

_current_key: ContextVar[SecretStr | None] = ContextVar("phoenix_billing_api_key", default=None)
# Held while OPENAI_API_KEY is swapped: a second concurrent swap would bill one user's calls to another.
_env_swap = threading.Lock()


class BillingUnavailableError(PhoenixError):
    """The billing service could not provide a key (outage, timeout, 5xx, rejected master key, bad reply).

    Transient: the message is retried with backoff, never dead-lettered; it is not the message's fault.
    """


class ApiKeyRejectedError(PhoenixError):
    """Raised by a processor when its LLM service refuses the API key in scope (HTTP 401/403).

    Transient: the runtime drops the user's cached key (for every worker), so the retried message runs on a key
    fetched anew. Raise it from the processor call (process, or process_batch as a whole), not as a batch result.
    """


class BillingConfigError(ConfigError):
    """Billing settings that cannot work; raised at worker start."""


# The version of the entries CacheSeal writes, before their url-safe base64: an entry without it is of an earlier
# format (Fernet, bound to no user nor namespace) and is a miss.
ENTRY_PREFIX = "v2:"
_NONCE_BYTES = 12
_STAMP_BYTES = 8
# How far in the future an entry's fetch time may be (another worker's clock), as Fernet allowed.
_MAX_CLOCK_SKEW_SECONDS = 60


def _cache_keys(keys: str) -> list[bytes]:
    """BILLING_CACHE_KEY's keys (separated by commas; the first seals, any opens), each 32 url-safe base64-encoded
    bytes (a Fernet key's format, so keys made for earlier versions still serve)."""
    try:
        decoded = [base64.urlsafe_b64decode(key.strip().encode()) for key in keys.split(",") if key.strip()]
    except (ValueError, binascii.Error):
        decoded = []
    if not decoded or any(len(key) != 32 for key in decoded):  # the message never quotes the value
        raise ValueError(
            "must be one or more Fernet keys separated by commas (32 url-safe base64-encoded bytes each, e.g. "
            "from `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`)"
        )
    return decoded


class CacheSeal:
    """Seals and opens one namespace's cache entries: AES-256-GCM (`cryptography`) under keys derived for the
    namespace (HKDF-SHA256 with the namespace as info) from BILLING_CACHE_KEY's keys, or from BILLING_MASTER_KEY
    without it, with the namespace and the user id as associated data.

    So an entry opens only for the user and namespace it was sealed for: a copy under another user's key, or in
    another namespace whose workers share the master or cache key, does not. The fetch time, sealed with the key,
    bounds its age whatever its Redis expiry says. Without BILLING_CACHE_KEY every worker of the namespace has the
    master key anyway, and whoever has it could ask the billing service for any user's key.
    """

    def __init__(self, keys: list[bytes], namespace: str) -> None:
        info = b"phoenix billing cache v2\0" + namespace.encode()
        self._ciphers = [AESGCM(HKDF(SHA256(), length=32, salt=None, info=info).derive(key)) for key in keys]
        self._namespace = namespace

    @classmethod
    def of(cls, namespace: str, cache_key: SecretStr | None, master_key: SecretStr | None) -> CacheSeal | None:
        """The namespace's seal under BILLING_CACHE_KEY, else BILLING_MASTER_KEY; None without either."""
        if cache_key is not None:
            return cls(_cache_keys(cache_key.get_secret_value()), namespace)
        if master_key is not None and master_key.get_secret_value():
            return cls([master_key.get_secret_value().encode()], namespace)
        return None

    def _bound(self, user_id: str) -> bytes:
        return json.dumps([self._namespace, user_id]).encode()

    def seal(self, user_id: str, api_key: str, fetched_at: float) -> str:
        nonce = os.urandom(_NONCE_BYTES)
        plain = int(fetched_at).to_bytes(_STAMP_BYTES, "big") + api_key.encode()
        sealed = nonce + self._ciphers[0].encrypt(nonce, plain, self._bound(user_id))
        return ENTRY_PREFIX + base64.urlsafe_b64encode(sealed).decode()

    def open(self, user_id: str, entry: str, max_age: float, now: float) -> tuple[str | None, str]:
        """The key in `entry` and "", or None and why it cannot be used."""
        if not entry.startswith(ENTRY_PREFIX):
            return None, "an earlier format"
        try:
            raw = base64.urlsafe_b64decode(entry.removeprefix(ENTRY_PREFIX).encode())
        except (ValueError, binascii.Error):
            return None, "not an entry"
        nonce, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
        for cipher in self._ciphers:
            try:
                plain = cipher.decrypt(nonce, sealed, self._bound(user_id))
            except (InvalidTag, ValueError):
                continue
            age = now - int.from_bytes(plain[:_STAMP_BYTES], "big")
            if not -_MAX_CLOCK_SKEW_SECONDS <= age <= max_age:
                return None, "too old"
            return plain[_STAMP_BYTES:].decode(), ""
        return None, "sealed for another user or namespace, or under another cache key"


class BillingSettings(BaseSettings):
    """BILLING_URL (unset = billing off), BILLING_MASTER_KEY, BILLING_SWAP_ENV (true/false; unset = auto),
    BILLING_CACHE_KEY (unset = derived from the master key), BILLING_CACHE_MAX_AGE (seconds)."""

    # Empty variables count as unset: manifests often render an absent optional value as "".
    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore", frozen=True, env_ignore_empty=True)

    billing_url: str | None = None
    billing_master_key: SecretStr | None = None
    billing_swap_env: bool | None = None
    billing_cache_key: SecretStr | None = None
    billing_cache_max_age: int = Field(KEY_MAX_AGE_SECONDS, ge=1)

    @field_validator("billing_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and (URL(value).scheme not in ("http", "https") or not URL(value).host):
            raise ValueError("must be an http(s) URL such as http://litellm:4000")
        return value

    @field_validator("billing_cache_key")
    @classmethod
    def _fernet_keys(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            _cache_keys(value.get_secret_value())
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
    """BillingSettings from the environment; a bad value raises ConfigError naming the variable."""
    try:
        return BillingSettings()
    except ValidationError as exc:
        raise BillingConfigError(describe_validation_error(exc, BillingSettings)) from None


class ApiKeyProvider:
    """Finds the API key of a message's user: from its namespace's Redis cache, else fetched once for them all.

    `redis` must be a decoded client (decode_responses=True). One aiohttp session per provider; `aclose()` it.
    `namespace`: the stage's KEY_NAMESPACE, whose cache it reads and fills (one per tenant).
    `cache_key`: BILLING_CACHE_KEY (None: derived from the master key); `cache_max_age`: BILLING_CACHE_MAX_AGE.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        stage: str,
        namespace: str,
        billing_url: str | None,
        master_key: SecretStr | None,
        cache_key: SecretStr | None = None,
        cache_max_age: int = KEY_MAX_AGE_SECONDS,
        guard_ttl: int = GUARD_TTL_SECONDS,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        max_wait: float | None = None,
    ) -> None:
        if billing_url is not None and (master_key is None or not master_key.get_secret_value()):
            raise BillingConfigError("BILLING_URL is set but BILLING_MASTER_KEY is not")
        for secret in (master_key, cache_key):
            scrub.register(secret.get_secret_value() if secret is not None else None)
        if billing_url is not None:  # a URL's user info is a credential too (a proxy's basic auth)
            url = URL(billing_url)
            scrub.register(url.user, url.raw_user, url.password, url.raw_password)
        self._seal = CacheSeal.of(namespace, cache_key, master_key)
        self._max_age = cache_max_age
        self._redis = redis
        self._stage = stage
        self._namespace = namespace
        self._endpoint = URL(billing_url) / "key/generate" if billing_url is not None else None
        self._master_key = master_key
        self._guard_ttl = guard_ttl
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        # Long enough to outlast one crashed guard owner and one full fetch by the next owner.
        self._max_wait = max_wait if max_wait is not None else guard_ttl + request_timeout
        self._delete_if = lua.register(redis, "billing_delete_if.lua", __package__)
        self._session: aiohttp.ClientSession | None = None
        # Drops of refused keys under way: a later lookup in this process waits for them.
        self._drops: set[asyncio.Task[None]] = set()

    @property
    def client(self) -> Redis:
        """The Redis client the cache and its guard are read and written through."""
        return self._redis

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
        if self._drops:
            await asyncio.gather(*self._drops)
        cache_key, guard_key = billing_cache_key(self._namespace, user_id), billing_guard_key(self._namespace, user_id)
        deadline = asyncio.get_running_loop().time() + self._max_wait
        while True:
            if (cached := await self._cached(user_id, cache_key)) is not None:
                return cached
            token = secrets.token_hex(16)
            if await self._redis.set(guard_key, token, nx=True, ex=self._guard_ttl):
                try:
                    # The previous owner may have cached the key between our miss and our SET NX.
                    if (cached := await self._cached(user_id, cache_key)) is not None:
                        return cached
                    BILLING_KEY_LOOKUPS.labels(stage=self._stage, result="miss").inc()
                    return await self._fetch_and_cache(user_id, cache_key)
                finally:
                    await self._delete_if(keys=[guard_key], args=[token])
            if asyncio.get_running_loop().time() >= deadline:
                raise BillingUnavailableError(
                    f"gave up after {self._max_wait:g}s waiting for another worker to fetch the API key of "
                    f"user {user_id!r}"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def aclose(self) -> None:
        if self._drops:
            await asyncio.gather(*self._drops)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open(self, user_id: str, entry: str) -> tuple[str | None, str]:
        assert self._seal is not None
        return self._seal.open(user_id, entry, self._max_age, time.time())

    def _user_key(self, key: str, cache_key: str, entry: str) -> UserApiKey:
        return UserApiKey(key, lambda: self._drop_later(cache_key, entry))

    async def _cached(self, user_id: str, cache_key: str) -> UserApiKey | None:
        entry = await self._redis.get(cache_key)
        if entry is None:
            return None
        key, refused = self._open(user_id, text(entry))
        if key is None:
            # Only the worker whose delete took it logs it: once per entry, however many workers read it.
            if await self._delete_if(keys=[cache_key], args=[entry]):
                log.warning("billing_cache_entry_dropped", cache_key=cache_key, reason=refused)
            return None
        BILLING_KEY_LOOKUPS.labels(stage=self._stage, result="hit").inc()
        return self._user_key(key, cache_key, text(entry))

    async def _fetch_and_cache(self, user_id: str, cache_key: str) -> UserApiKey:
        fetched = (await self._fetch(user_id)).get_secret_value()
        assert self._seal is not None
        entry = self._seal.seal(user_id, fetched, time.time())
        # NX GET: if a worker whose guard expired mid-fetch cached its key first, everyone adopts that one.
        earlier = await self._redis.set(cache_key, entry, nx=True, get=True, ex=self._max_age)
        adopted = self._open(user_id, text(earlier))[0] if earlier is not None else None
        log.info("billing key fetched", user_id=user_id, stage=self._stage, adopted_earlier=adopted is not None)
        if adopted is not None:
            return self._user_key(adopted, cache_key, text(earlier))
        # Not cached when another worker's entry is there but does not open here (a cache key rotation under way).
        return self._user_key(fetched, cache_key, entry)

    def _drop_later(self, cache_key: str, entry: str) -> None:
        """Drop a refused key's cache entry; called when a processor leaves api_key_scope, which cannot wait."""
        task = asyncio.get_running_loop().create_task(self._drop(cache_key, entry))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _drop(self, cache_key: str, entry: str) -> None:
        try:
            dropped = await self._delete_if(keys=[cache_key], args=[entry])
        except RedisError as exc:  # the next refusal tries again; meanwhile the key ages out
            log.warning("billing_key_drop_failed", cache_key=cache_key, error=str(exc))
            return
        log.info("billing_key_dropped", cache_key=cache_key, reason="refused by the LLM service", dropped=dropped)

    async def _fetch(self, user_id: str) -> SecretStr:
        assert self._endpoint is not None and self._master_key is not None
        shown = self._endpoint.with_user(None)  # credentials in BILLING_URL stay out of messages
        metadata = {"source": "phoenix", "phoenix_stage": self._stage, "phoenix_namespace": self._namespace}
        body = {"user_id": user_id, "metadata": metadata}
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


class UserApiKey(SecretStr):
    """A user's key as it came from the cache: `rejected()` drops that very cache entry, not a newer one."""

    def __init__(self, key: str, on_rejected: Callable[[], None]) -> None:
        super().__init__(key)
        self._on_rejected = on_rejected

    def rejected(self) -> None:
        self._on_rejected()


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
    The key is masked out of this task's error strings from now on (scrub.expose); an ApiKeyRejectedError
    leaving the block drops the user's cached key.
    """
    if key is not None:
        scrub.expose(key.get_secret_value())
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
    except ApiKeyRejectedError:
        if isinstance(key, UserApiKey):
            key.rejected()
        raise
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
