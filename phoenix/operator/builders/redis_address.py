"""Non-secret connection facts of a Redis URL, for KEDA (which wants host:port, not a URL).

The password is never kept: only whether there is one, so callers cannot leak it into objects or logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import ip_address
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

DEFAULT_PORT = 6379


class RedisUrlError(ValueError):
    """The Redis URL is unusable. Messages never quote the URL, which may hold a password."""


@dataclass(frozen=True)
class RedisConnection:
    address: str
    database_index: int
    tls: bool
    username: str | None
    has_password: bool


def _database_index(path: str, query: str) -> int:
    raw = path.lstrip("/") or parse_qs(query).get("db", ["0"])[0]
    if not raw.isdigit():
        raise RedisUrlError("the Redis URL's database must be a number (redis://host:port/0)")
    return int(raw)


def redis_connection(url: str) -> RedisConnection:
    """Parse `redis://[user[:password]@]host[:port][/db]` or `rediss://...` (TLS)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("redis", "rediss"):
        raise RedisUrlError("the Redis URL must start with redis:// or rediss://")
    try:
        host, port = parts.hostname, parts.port or DEFAULT_PORT
    except ValueError:
        raise RedisUrlError("the Redis URL's port is not a number") from None
    if not host:
        raise RedisUrlError("the Redis URL has no host")
    return RedisConnection(
        address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
        database_index=_database_index(parts.path, parts.query),
        tls=parts.scheme == "rediss",
        username=unquote(parts.username) if parts.username else None,
        has_password=bool(parts.password),
    )


def in_namespace(url: str, namespace: str) -> str:
    """The URL as seen from outside the stage's namespace. A one-label host (`redis://:pw@redis:6379/0`, as in the
    samples) is a Service in the stage's own namespace for the workers; the operator and KEDA run in other
    namespaces, where it would not resolve, so it becomes `redis.<namespace>.svc`. Other hosts are kept as they are.
    """
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    if not host or "." in host or host == "localhost" or _is_ip(host):
        return url
    userinfo, at, host_port = parts.netloc.rpartition("@")
    _, colon, port = host_port.partition(":")
    netloc = f"{userinfo}{at}{host}.{namespace}.svc{colon}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _is_ip(host: str) -> bool:
    try:
        ip_address(host)
    except ValueError:
        return False
    return True
