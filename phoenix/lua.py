"""Lua scripts live as .lua files beside the module that calls them."""

from __future__ import annotations

from importlib.resources import files

from redis.asyncio import Redis
from redis.commands.core import AsyncScript


def register(client: Redis, filename: str, package: str) -> AsyncScript:
    """Register a script shipped in `package` (the caller's `__package__`); redis-py runs it with EVALSHA, falling
    back to EVAL."""
    return client.register_script(source(filename, package))


def source(filename: str, package: str) -> str:
    """The text of a script shipped in `package`."""
    return files(package).joinpath(filename).read_text()
