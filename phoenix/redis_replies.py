"""Typed helpers over redis-py's replies, for every layer (the worker's stream reads: worker_runtime/redis_client)."""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis

# redis-py types stream replies for every client and protocol at once (ids `bytes | str | None`, RESP3 maps); this
# gives the shape a RESP2 client that decodes responses really returns, checked once here.
TextEntry = tuple[str, dict[str, str]]


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


def text(value: object) -> str:
    """A reply item (or error) as str, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)
