"""Lua scripts live as .lua files beside the module that calls them."""

from __future__ import annotations

from importlib.resources import files

from redis.asyncio import Redis
from redis.commands.core import AsyncScript


def register(client: Redis, filename: str) -> AsyncScript:
    """Register a script shipped in this package; redis-py runs it with EVALSHA, falling back to EVAL."""
    return client.register_script(files(__package__).joinpath(filename).read_text())
