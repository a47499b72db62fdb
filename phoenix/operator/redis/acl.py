"""One Redis ACL user per Kubernetes namespace, run by the operator when --redis-acl-admin-secret names the Redis it
may administer: the tenancy boundary a processor's own Redis calls cannot cross, whatever its code sends
(docs/operator.md, "Redis ACL users").

- Which stages: those whose spec.redis reaches the administered Redis (its hosts, standalone, TLS alike). The
  operator reaches them with the admin's credentials (their own database), their workers and KEDA as the user of
  their namespace; a stage of another Redis runs with its own URL as before.
- The user `phoenix.<namespace>[.<cluster>]` (per namespace, not per stage: the stages of a namespace form its
  pipelines, forward into each other's inputs in one script, share its data keys and billing cache, and read the
  same Secrets): its password, the namespace's key patterns (keys.namespace_patterns), each stream its stages
  claimed by name with its name marker (listed in keys.claimed_names, which only the operator writes), and
  USER_COMMANDS; written whole by one `ACL SETUSER <user> reset ...` at every sync, so it is what this module says.
- Its password is in the Secret phoenix-redis-user of the namespace (key `password`), replaced every
  rotation_seconds: the replaced one stays valid for grace_seconds (as its SHA-256, kept in an annotation) while
  the workers roll, which the Secret's new version makes them do (it is among the stage's Redis Secrets).
- Gone with the namespace's last stage: ACL DELUSER (which closes its connections), the Secret and the index.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from base64 import b64decode, b64encode
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from redis.exceptions import RedisError

from phoenix.keys import claimed_names, glob_escaped, name_marker, namespace_patterns
from phoenix.kube_names import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PASSWORD_ROTATED_ANNOTATION,
    PREVIOUS_PASSWORD_ANNOTATION,
    REDIS_USER_SECRET,
)
from phoenix.operator.builders import RedisUser
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import KubeApi, secret_key
from phoenix.operator.options import AclOptions
from phoenix.operator.record import StageRegistry
from phoenix.operator.redis.pool import RedisPool
from phoenix.redis_replies import text
from phoenix.redis_spec import RedisSpec, RedisSpecError

logger = logging.getLogger(__name__)
# A namespace (a DNS label) holds no '.', so the first one after it starts the cluster; none needs escaping in a URL.
USER_PREFIX = "phoenix."
# How often every namespace's user is written again (a password due, a grace period over, a Redis that lost its
# users) and users of namespaces without stages are removed.
SYNC_SECONDS = 10.0
PASSWORD_BYTES = 32
# A password in the Secret shorter than this was not written by the operator (token_urlsafe(32) gives 43).
MIN_PASSWORD_CHARS = 32

# What the worker runtime, the producer and the tools send, found with MONITOR and checked against ACL LOG by
# tests/test_redis_acl.py (which fails on a command missing here, and on one here that none of them sends). A
# script's own calls are checked against the user too, so the commands the Lua scripts run are here as well.
USER_COMMANDS: tuple[str, ...] = (
    # The connection: redis-py's handshake and health checks, SELECT for a URL's database, INFO for the server's
    # cluster mode and replication (the worker's start), WAIT for MIN_REPLICAS_ACK, MULTI/EXEC for transactions.
    "ping",
    "select",
    "client|setinfo",
    "info",
    "wait",
    "multi",
    "exec",
    # Scripts (the runtime's, loaded by SCRIPT LOAD and run by EVALSHA) and TIME, which they ask for.
    "evalsha",
    "script|load",
    "script|exists",
    "time",
    # Streams: inputs, outputs, DLQs, outboxes, audit streams.
    "xadd",
    "xreadgroup",
    "xack",
    "xautoclaim",
    "xclaim",
    "xpending",
    "xrange",
    "xrevrange",
    "xlen",
    "xdel",
    "xtrim",
    "xinfo|groups",
    "xinfo|consumers",
    "xgroup|create",
    "xgroup|delconsumer",
    # Record keys, markers, the retry set, ledgers, billing and the stages' shared data.
    "get",
    "set",
    "del",
    "exists",
    "expire",
    "pttl",
    "type",
    "incrby",
    "hget",
    "hset",
    "hmget",
    "hgetall",
    "hincrby",
    "zadd",
    "zrangebyscore",
    "zrem",
    "zscan",
    # The records a rate limit holds back now (rate_limit.lua's held set, counted by the queue figures).
    "zrange",
    "zremrangebyscore",
    "zcount",
    "pexpireat",
)


def username(namespace: str, cluster: str) -> str:
    """The ACL user of `namespace` (of Kubernetes cluster `cluster`: two clusters sharing a Redis keep theirs apart)."""
    return f"{USER_PREFIX}{namespace}" + (f".{cluster}" if cluster else "")


def user_rules(namespace: str, names: Iterable[str], password: str, previous_sha256: str | None) -> list[str]:
    """The arguments of `ACL SETUSER <user>` that make the user exactly this (reset first): on, its password (and
    the replaced one, by its hash, during its grace), the namespace's keys, each claimed stream and its name marker,
    no channel, USER_COMMANDS only."""
    patterns = [*namespace_patterns(namespace)]
    for stream in sorted(set(names)):
        patterns += [glob_escaped(stream), glob_escaped(name_marker(stream))]
    return [
        "reset",
        "on",
        f">{password}",
        *([f"#{previous_sha256}"] if previous_sha256 else []),
        *(f"~{pattern}" for pattern in patterns),
        "-@all",
        *(f"+{command}" for command in USER_COMMANDS),
    ]


def password_sha256(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def same_server(target: RedisSpec, admin: RedisSpec) -> bool:
    """Whether a stage's Redis is the administered one: the same standalone server (as the operator reaches it),
    with TLS alike."""
    return target.mode == admin.mode == "standalone" and target.hosts == admin.hosts and target.tls == admin.tls


@dataclass(frozen=True)
class NamespaceUser:
    """What the sync wrote: the user (for the builders), its password now and its Secret's resourceVersion (for the
    pod template's digest and the Secret check)."""

    user: RedisUser
    password: str
    version: str


class RedisUsers:
    """The namespaces' users on the administered Redis; the admin Secret is read at each use (so its rotation is
    followed), the users written at each reconcile of one of their stages and every SYNC_SECONDS."""

    def __init__(self, kube: KubeApi, options: AclOptions, operator_namespace: str, cluster: str) -> None:
        self._kube, self._options = kube, options
        # Its own client of the administered Redis, apart from the stages' pool (which closes what no stage uses).
        self._pool = RedisPool()
        self._operator_namespace, self._cluster = operator_namespace, cluster
        # One sync of a namespace at a time: its stages reconcile side by side, and its Secret is created once.
        self._locks: dict[str, asyncio.Lock] = {}

    async def admin(self) -> RedisSpec:
        """The administered Redis with the admin's credentials, from the admin Secret (key `url`)."""
        name = self._options.admin_secret
        url = secret_key(await self._kube.read_secret(self._operator_namespace, name), "url").decode()
        try:
            spec = RedisSpec.from_url(url)
        except RedisSpecError as exc:
            raise StageError("InvalidRedisUrl", f"the Redis ACL admin Secret {name!r} key 'url': {exc}") from None
        await self._pool.retain({spec})  # the client of an admin URL rotated away is closed
        return spec

    async def aclose(self) -> None:
        await self._pool.close()

    async def operator_spec(self, target: RedisSpec) -> RedisSpec | None:
        """How the operator reaches a stage of `target`: the admin's credentials on its server and database, or
        None when its Redis is not the administered one (it keeps its own URL and no user)."""
        admin = await self.admin()
        if not same_server(target, admin):
            return None
        return target.model_copy(update={"username": admin.username, "password": admin.password})

    async def ensure(self, namespace: str, names: Iterable[str] = ()) -> NamespaceUser:
        """Write the namespace's user (adding `names`, streams its stage just claimed, to its index): its Secret
        created or its password rotated when due, then ACL SETUSER. A StageError when Kubernetes or Redis refuse."""
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            return await self._ensure(namespace, list(names))

    async def _ensure(self, namespace: str, names: list[str]) -> NamespaceUser:
        admin = await self.admin()
        client = self._pool.client(admin)
        try:
            if names:
                await client.sadd(claimed_names(namespace), *names)
            password, previous, version = await self._password(namespace)
            streams = [text(s) for s in await client.smembers(claimed_names(namespace))]
            rules = user_rules(namespace, streams, password, previous)
            await client.execute_command("ACL", "SETUSER", username(namespace, self._cluster), *rules)
        except (RedisError, OSError) as exc:
            self._pool.failed(admin, exc)
            # The rules hold the password: only the error's class and the server's first words go out.
            message = f"cannot write the Redis ACL user of {namespace}: {_said(exc)}"
            raise StageError("RedisUnavailable", message) from None
        return NamespaceUser(RedisUser(username(namespace, self._cluster), REDIS_USER_SECRET), password, version)

    async def forget_names(self, namespace: str, streams: Iterable[str]) -> None:
        """Names no stage of the namespace uses any more (released, their markers gone) leave its user's grants."""
        if streams := list(streams):
            await self._pool.client(await self.admin()).srem(claimed_names(namespace), *streams)

    async def _password(self, namespace: str) -> tuple[str, str | None, str]:
        """The namespace's password now, the replaced one's hash while its grace lasts, and the Secret's version:
        the Secret created when missing, its password replaced when due."""
        options, now = self._options, time.time()
        secret = await self._kube.get_secret(namespace, REDIS_USER_SECRET)
        if secret is None:
            created = await self._written(
                self._kube.create_secret(_user_secret(namespace, self._username(namespace), _new(), now))
            )
            return _decoded(created), None, created["metadata"]["resourceVersion"]
        annotations = secret["metadata"].get("annotations") or {}
        password, previous = _decoded(secret), annotations.get(PREVIOUS_PASSWORD_ANNOTATION)
        if len(password) < MIN_PASSWORD_CHARS:  # emptied or shortened by hand: replaced at once, not kept
            replaced = _user_secret(namespace, self._username(namespace), _new(), now)
            written = await self._replace(secret, replaced)
            return _decoded(written), None, written["metadata"]["resourceVersion"]
        # No time (the annotation removed by hand): due now.
        rotated = _timestamp(annotations.get(PASSWORD_ROTATED_ANNOTATION)) or 0.0
        if options.rotation_seconds and now - rotated >= options.rotation_seconds:
            replaced = _user_secret(namespace, self._username(namespace), _new(), now, password_sha256(password))
            written = await self._replace(secret, replaced)
            return _decoded(written), password_sha256(password), written["metadata"]["resourceVersion"]
        if previous and now - rotated >= options.grace_seconds:
            kept = _user_secret(namespace, self._username(namespace), password, rotated)
            written = await self._replace(secret, kept)
            return password, None, written["metadata"]["resourceVersion"]
        return password, previous, secret["metadata"]["resourceVersion"]

    async def _replace(self, current: dict[str, Any], wanted: dict[str, Any]) -> dict[str, Any]:
        meta = wanted["metadata"]
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        meta["labels"] = {**(current["metadata"].get("labels") or {}), **meta["labels"]}
        return await self._written(self._kube.replace_secret(wanted))

    @staticmethod
    async def _written(write: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """A write of the user's Secret; a refusal is a StageError with its status alone (the API server's answer
        might quote what was sent). 409: changed or created since it was read; the next sync reads it again."""
        try:
            return await write
        except ApiException as exc:
            raise StageError("KubernetesApiError", f"Secret {REDIS_USER_SECRET}: {exc.status} {exc.reason}") from None

    def _username(self, namespace: str) -> str:
        return username(namespace, self._cluster)

    async def sync(self, registry: StageRegistry) -> None:
        """Write the user of every namespace with a stage on the administered Redis, then remove the users of
        namespaces that have no stage left (asked of the API server: the operator's memory may be young)."""
        namespaces = {record.namespace for record in registry.records() if record.redis_user is not None}
        for namespace in sorted(namespaces):
            try:
                await self.ensure(namespace)
            except StageError as error:
                logger.warning("Redis ACL user of %s not written: %s", namespace, error)
        try:
            admin = await self.admin()
            users = [text(u) for u in await self._pool.client(admin).execute_command("ACL", "USERS")]
        except (StageError, RedisError, OSError) as exc:
            logger.warning("Redis ACL users not listed: %s", _said(exc) if not isinstance(exc, StageError) else exc)
            return
        living = {record.namespace for record in registry.records()}
        for namespace in sorted({n for u in users if (n := self._namespace_of(u)) is not None} - living):
            try:
                if await self._kube.stage_names(namespace):
                    continue
            except ApiException as exc:  # a namespace this operator does not serve (403): not its to remove
                logger.warning("Redis ACL user of %s kept: its stages not listed: %s", namespace, exc.status)
                continue
            await self.remove(namespace)

    def _namespace_of(self, user: str) -> str | None:
        """The namespace whose user `user` is, when it is one of this operator's (of its cluster)."""
        if not user.startswith(USER_PREFIX):
            return None
        namespace, _, cluster = user.removeprefix(USER_PREFIX).partition(".")
        return namespace if cluster == self._cluster else None

    async def remove(self, namespace: str) -> None:
        """The namespace's last stage went: its user (ACL DELUSER closes the user's connections), its index and
        its Secret go."""
        client = self._pool.client(await self.admin())
        await client.execute_command("ACL", "DELUSER", username(namespace, self._cluster))
        await client.delete(claimed_names(namespace))
        await self._kube.delete_secret(namespace, REDIS_USER_SECRET)
        logger.info("Redis ACL user of %s removed with its last stage", namespace)

    async def sync_forever(self, registry: StageRegistry) -> None:
        """Until cancelled: a sync every SYNC_SECONDS."""
        while True:
            try:
                await self.sync(registry)
            except Exception:
                logger.exception("Redis ACL user sync failed")  # the next one retries
            await asyncio.sleep(SYNC_SECONDS)


def _said(exc: BaseException) -> str:
    """A Redis error without what might be a secret: its class and the server's first words (ACL SETUSER's
    arguments are never repeated by the server, but a driver's message might quote a command)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split()[:6])}"


def _new() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def _decoded(secret: dict[str, Any]) -> str:
    return b64decode((secret.get("data") or {}).get(RedisUser.PASSWORD_KEY, "")).decode()


def _timestamp(value: str | None) -> float | None:
    try:
        return datetime.fromisoformat(value).timestamp() if value else None
    except ValueError:
        return None


def _user_secret(
    namespace: str, user: str, password: str, rotated: float, previous_sha256: str | None = None
) -> dict[str, Any]:
    annotations = {PASSWORD_ROTATED_ANNOTATION: datetime.fromtimestamp(rotated, UTC).isoformat(timespec="seconds")}
    if previous_sha256:
        annotations[PREVIOUS_PASSWORD_ANNOTATION] = previous_sha256
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": REDIS_USER_SECRET,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": annotations,
        },
        "data": {
            "username": b64encode(user.encode()).decode(),
            RedisUser.PASSWORD_KEY: b64encode(password.encode()).decode(),
        },
    }
