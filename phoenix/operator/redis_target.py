"""Where a stage's Redis is and how to reach it, as the operator reads it from spec.redis and the Secrets it names.

Read once per reconcile (`read_redis_target`): the operator's own client is built from it (redis_pool.py), the
worker pods' template carries its digest (a rotated URL, password, CA or client certificate rolls the workers,
which read them only at start), and the resourceVersions of the Secrets read are remembered so that the Secret
check (`check_secrets_forever`) notices a rotation with `get` alone: the operator may not list or watch Secrets.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from phoenix.crds import RedisMode, RedisSpec, SecretKeyRef
from phoenix.operator.builders import RedisUrlError, in_namespace, redis_connection
from phoenix.operator.builders.deployment import CERT_FILE, KEY_FILE
from phoenix.operator.errors import StageError, scrub
from phoenix.operator.kube import KubeApi, secret_key
from phoenix.worker_runtime.settings import redact_url

if TYPE_CHECKING:
    from phoenix.operator.context import OperatorContext

logger = logging.getLogger(__name__)
TLS_SECRET_TYPE = "kubernetes.io/tls"
# How often the referenced Secrets are read again for a rotation (one `get` per distinct Secret).
SECRET_CHECK_SECONDS = 10.0


@dataclass(frozen=True)
class RedisTarget:
    """Everything the operator connects with; equal targets share one client. Secret values never print."""

    url: str = field(repr=False)  # as seen from outside the stage's namespace (builders.in_namespace)
    mode: RedisMode = RedisMode.STANDALONE
    sentinel_master: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = field(default=None, repr=False)
    ca: bytes | None = field(default=None, repr=False)
    client_cert: bytes | None = field(default=None, repr=False)
    client_key: bytes | None = field(default=None, repr=False)
    # Secret name -> resourceVersion of each Secret read; not part of the identity (same values, same client).
    versions: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def digest(self, salt: str) -> str:
        """A salted SHA-256 of every value read from the Secrets (the pod template's phoenix.io/redis-secrets).

        The values are told apart by their position and length; `salt` (the stage's uid) keeps two stages with the
        same Secrets from showing the same digest."""
        hashed = hashlib.sha256(salt.encode())
        for value in (self.url, self.sentinel_password, self.ca, self.client_cert, self.client_key):
            raw = b"" if value is None else value.encode() if isinstance(value, str) else value
            hashed.update(len(raw).to_bytes(8, "big") + raw)
        return hashed.hexdigest()[:32]

    @property
    def redacted(self) -> str:
        """The address as logs and status may show it."""
        return redact_url(self.url)

    def scrub(self, text: str) -> str:
        """`text` with the URL and the Sentinel password masked: driver errors may echo them."""
        for secret in (self.url, self.sentinel_password):
            text = scrub(text, secret)
        return text


async def read_redis_target(kube: KubeApi, namespace: str, redis: RedisSpec) -> RedisTarget:
    """Read the Secrets spec.redis names (each once) and check that they fit together; a StageError otherwise."""
    read: dict[str, dict[str, Any]] = {}

    async def secret(name: str) -> dict[str, Any]:
        if name not in read:
            read[name] = await kube.read_secret(namespace, name)
        return read[name]

    async def value(ref: SecretKeyRef) -> bytes:
        return secret_key(await secret(ref.name), ref.key)

    url_ref = redis.url_secret_ref
    url = (await value(url_ref)).decode()
    try:
        connection = redis_connection(url)
    except RedisUrlError as exc:
        raise StageError("InvalidRedisUrl", f"Secret {url_ref.name!r} key {url_ref.key!r}: {exc}") from None
    sentinel, tls = redis.sentinel, redis.tls
    if tls is not None and not connection.tls:
        raise StageError(
            "InvalidRedisUrl",
            f"spec.redis.tls is set but the URL in Secret {url_ref.name!r} key {url_ref.key!r} is not rediss://: "
            "TLS is used only with a rediss:// URL; change its scheme, or remove spec.redis.tls",
        )
    ca = cert = key = None
    if tls is not None and tls.ca_secret_ref is not None:
        ca = await value(tls.ca_secret_ref)
    if tls is not None and tls.client_cert_secret_ref is not None:
        name = tls.client_cert_secret_ref.name
        found = await secret(name)
        if found.get("type") != TLS_SECRET_TYPE:
            raise StageError(
                "InvalidSecret",
                f"Secret {name!r} (spec.redis.tls.clientCertSecretRef) is of type {found.get('type')!r}, not "
                f"{TLS_SECRET_TYPE!r}: create it with `kubectl create secret tls {name} --cert=... --key=...`",
            )
        cert, key = secret_key(found, CERT_FILE), secret_key(found, KEY_FILE)
    sentinel_password = None
    if sentinel is not None and sentinel.password_secret_ref is not None:
        sentinel_password = (await value(sentinel.password_secret_ref)).decode()
    return RedisTarget(
        url=in_namespace(url, namespace),
        mode=redis.mode,
        sentinel_master=None if sentinel is None else sentinel.master_name,
        sentinel_username=None if sentinel is None else sentinel.username,
        sentinel_password=sentinel_password,
        ca=ca,
        client_cert=cert,
        client_key=key,
        versions=tuple(sorted((name, found["metadata"]["resourceVersion"]) for name, found in read.items())),
    )


async def rotated_secrets(kube: KubeApi, namespace: str, versions: tuple[tuple[str, str], ...]) -> list[str]:
    """The Secrets among `versions` that changed (or went) since they were read: one `get` each."""
    changed = []
    for name, version in versions:
        try:
            current = (await kube.read_secret(namespace, name))["metadata"]["resourceVersion"]
        except StageError:
            current = None  # deleted: the reconcile says so in the stage's status
        if current != version:
            changed.append(name)
    return changed


async def check_secrets_once(ctx: OperatorContext) -> int:
    """Mark every stage whose Redis Secrets changed for a reconcile (converge.py's repair); returns how many."""
    marked = 0
    for record in ctx.registry.records():
        target = record.redis
        if target is None:
            continue
        try:
            changed = await rotated_secrets(ctx.kube, record.namespace, target.versions)
        except ApiException as exc:
            logger.warning("Secret check of %s/%s failed: %s %s", record.namespace, record.name, exc.status, exc.reason)
            continue
        for name in changed:
            record.drift[f"Secret {name} changed"] = "Secret"
        if changed:
            marked += 1
            ctx.wake.set()
    return marked


async def check_secrets_forever(ctx: OperatorContext) -> None:
    """Until cancelled: a check every SECRET_CHECK_SECONDS."""
    while True:
        try:
            await check_secrets_once(ctx)
        except Exception:
            logger.exception("Secret check failed")  # the next one retries
        await asyncio.sleep(SECRET_CHECK_SECONDS)
