"""Typed helpers over the runtime's Redis clients (which phoenix.redis_spec.connect builds)."""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis

# redis-py types stream replies for every client and protocol at once (ids `bytes | str | None`, fields possibly None,
# RESP3 maps); these give the shapes the runtime's RESP2 clients really return, checked once here.
TextEntry = tuple[str, dict[str, str]]
# Fields are None for an entry deleted while it was pending.
Entry = tuple[bytes, dict[bytes, bytes] | None]


async def text_range(
    client: aioredis.Redis,
    stream: str,
    *,
    first: str = "-",
    last: str = "+",
    count: int | None = None,
    newest_first: bool = False,
) -> list[TextEntry]:
    """XRANGE (XREVRANGE when `newest_first`) on a client that decodes responses."""
    if newest_first:
        reply = await client.xrevrange(stream, max=last, min=first, count=count)
    else:
        reply = await client.xrange(stream, min=first, max=last, count=count)
    return cast(list[TextEntry], reply or [])


async def read_group(
    client: aioredis.Redis, group: str, consumer: str, stream: str, cursor: str, count: int, block: int | None = None
) -> list[Entry]:
    """XREADGROUP of one stream on a client that returns bytes: its entries ([] when none came)."""
    reply = await client.xreadgroup(group, consumer, {stream: cursor}, count=count, block=block)
    return cast(list[tuple[bytes, list[Entry]]], reply)[0][1] if reply else []


async def read_groups(
    client: aioredis.Redis, group: str, consumer: str, streams: list[str], count: int, block: int
) -> list[tuple[bytes, list[Entry]]]:
    """XREADGROUP of new entries of several streams (one slot on a cluster) at once: (stream, entries) of those that
    had any."""
    reply = await client.xreadgroup(group, consumer, dict.fromkeys(streams, ">"), count=count, block=block)
    return cast(list[tuple[bytes, list[Entry]]], reply or [])


def text(value: object) -> str:
    """A reply item (or error) as str, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)
