"""The worker's stream reads, typed (the clients come from phoenix.redis_spec.connect)."""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis

# redis-py types stream replies for every client and protocol at once; this is the shape the runtime's RESP2 bytes
# client really returns. Fields are None for an entry deleted while it was pending.
Entry = tuple[bytes, dict[bytes, bytes] | None]


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
