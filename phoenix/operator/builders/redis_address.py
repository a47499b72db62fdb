"""Non-secret connection facts of a stage's Redis, for KEDA (which wants host:port, not a URL), derived from the
one parsed connection spec (phoenix.redis_spec).

The password is never kept: only whether there is one, so callers cannot leak it into objects or logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import ip_address
from typing import ClassVar

from phoenix.redis_spec import RedisSpec


@dataclass(frozen=True)
class RedisConnection:
    # host:port of each server: one in standalone mode, the Sentinels in sentinel mode.
    addresses: tuple[str, ...]
    database_index: int
    tls: bool
    username: str | None
    has_password: bool

    @property
    def address(self) -> str:
        return self.addresses[0]


@dataclass(frozen=True)
class RedisUser:
    """The Redis ACL user the operator runs for a stage's namespace (operator/redis/acl.py): its name, and the
    Secret of the namespace holding its password under the key `password`. The workers and KEDA log in as it."""

    username: str
    secret: str

    PASSWORD_KEY: ClassVar[str] = "password"


def redis_connection(spec: RedisSpec) -> RedisConnection:
    return RedisConnection(
        addresses=tuple(f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in spec.hosts),
        database_index=spec.db,
        tls=spec.tls,
        username=spec.username,
        has_password=spec.password is not None,
    )


def in_namespace(spec: RedisSpec, namespace: str) -> RedisSpec:
    """The spec as seen from outside the stage's namespace. A one-label host (`redis://:pw@redis:6379/0`, as in the
    samples) is a Service in the stage's own namespace for the workers; the operator and KEDA run in other
    namespaces, where it would not resolve, so it becomes `redis.<namespace>.svc`. Other hosts are kept as they are.
    """
    hosts = tuple((_qualified(host, namespace), port) for host, port in spec.hosts)
    return spec if hosts == spec.hosts else spec.model_copy(update={"hosts": hosts})


def _qualified(host: str, namespace: str) -> str:
    return host if "." in host or host == "localhost" or _is_ip(host) else f"{host}.{namespace}.svc"


def _is_ip(host: str) -> bool:
    try:
        ip_address(host)
    except ValueError:
        return False
    return True
