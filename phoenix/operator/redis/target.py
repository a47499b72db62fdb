"""Where a stage's Redis is and how to reach it, as the operator reads it from spec.redis and the Secrets it names.

Read once per reconcile (`read_redis_target`), through the reconcile's SecretReads (kube/secrets.py: each Secret got
once, its resourceVersion remembered, so a rotated URL, password, CA or client certificate rolls the workers, which
read them only at start): the operator's own client is built from it (redis/pool.py).
"""

from __future__ import annotations

import logging

from pydantic import SecretBytes

from phoenix.crds import SecretKeyRef, StageRedisSpec
from phoenix.operator.builders import in_namespace
from phoenix.operator.builders.deployment import CERT_FILE, KEY_FILE
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import secret_key
from phoenix.operator.kube.secrets import SecretReads
from phoenix.redis_spec import RedisSpec, RedisSpecError

logger = logging.getLogger(__name__)
TLS_SECRET_TYPE = "kubernetes.io/tls"


async def read_redis_target(reads: SecretReads, redis: StageRedisSpec) -> RedisSpec:
    """Read the Secrets spec.redis names and check that they fit together; a StageError otherwise."""

    async def value(ref: SecretKeyRef) -> bytes:
        return secret_key(await reads.get(ref.name), ref.key)

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
        found = await reads.get(name)
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
    return in_namespace(spec, reads.namespace)
