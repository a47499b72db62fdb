"""What the CLI's servers (`phoenix ui`, `phoenix ingest`) share: the bearer token read from a file (a mounted
Secret's key: one word, never printed), and serving an aiohttp app until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from aiohttp import web

from phoenix.errors import ConfigError


def token_from_file(path: Path, error: type[ConfigError]) -> str:
    """The token `path` holds; `error` (the command's own ConfigError) when it cannot be read or holds none."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise error(f"cannot read --token-file {str(path)!r}: {exc.strerror}") from None
    if not token or any(c.isspace() for c in token):
        raise error(f"--token-file {str(path)!r} holds no token (one word, no whitespace)")
    return token


async def serve(runner: web.AppRunner, host: str, port: int, error: type[ConfigError], started: str) -> None:
    """Serve `runner`'s app on host:port, print `started` once listening, return at SIGTERM or SIGINT, cleaned up;
    `error` when the port cannot be listened on."""
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as exc:
            raise error(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        print(started, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
