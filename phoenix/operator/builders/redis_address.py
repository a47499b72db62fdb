"""Non-secret connection facts of a Redis URL, for KEDA (which wants host:port, not a URL).

The password is never kept: only whether there is one, so callers cannot leak it into objects or logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

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
