"""Where a stage's Redis is and how to reach it, as the operator reads it from spec.redis and the Secrets it names.

Read once per reconcile (`read_redis_target`): the operator's own client is built from it (redis/pool.py), the
worker pods' template carries its digest (a rotated URL, password, CA or client certificate rolls the workers,
which read them only at start), and the resourceVersions of the Secrets read are remembered so that the Secret
check (stage/secret_check.py) notices a rotation with `get` alone: the operator may not list or watch Secrets.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import SecretBytes

from phoenix.crds import SecretKeyRef, StageRedisSpec
from phoenix.operator.builders import in_namespace
from phoenix.operator.builders.deployment import CERT_FILE, KEY_FILE
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import KubeApi, secret_key
from phoenix.redis_spec import RedisSpec, RedisSpecError

logger = logging.getLogger(__name__)
TLS_SECRET_TYPE = "kubernetes.io/tls"


@dataclass(frozen=True)
class RedisTarget:
    """What reading spec.redis's Secrets found: the connection spec the operator connects with, the digest of the
    values read, and the resourceVersion of each Secret read (by name), for the Secret check."""

    spec: RedisSpec
    digest: str
    versions: tuple[tuple[str, str], ...]


def secrets_digest(salt: str, values: tuple[str | bytes | None, ...]) -> str:
    """A salted SHA-256 of the values read from the Secrets (the pod template's phoenix.io/redis-secrets): values
    are told apart by position and length; `salt` (the stage's uid) keeps two stages with the same Secrets from
    showing the same digest. 128 bits of it are plenty to notice a change."""
    hashed = hashlib.sha256(salt.encode())
    for value in values:
        raw = b"" if value is None else value.encode() if isinstance(value, str) else value
        hashed.update(len(raw).to_bytes(8, "big") + raw)
    return hashed.hexdigest()[:32]


async def read_redis_target(kube: KubeApi, namespace: str, redis: StageRedisSpec, salt: str) -> RedisTarget:
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
    sentinel, tls = redis.sentinel, redis.tls
    if tls is not None and not url.strip().lower().startswith("rediss://"):
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
    try:
        spec = RedisSpec.from_url(
            url,
            mode=redis.mode.value,
            sentinel_master=None if sentinel is None else sentinel.master_name,
            sentinel_username=None if sentinel is None else sentinel.username,
            sentinel_password=sentinel_password,
            tls_ca=ca,
            tls_cert=cert,
            tls_key=None if key is None else SecretBytes(key),
        )
    except RedisSpecError as exc:
        raise StageError("InvalidRedisUrl", f"Secret {url_ref.name!r} key {url_ref.key!r}: {exc}") from None
    return RedisTarget(
        spec=in_namespace(spec, namespace),
        digest=secrets_digest(salt, (url, sentinel_password, ca, cert, key)),
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
