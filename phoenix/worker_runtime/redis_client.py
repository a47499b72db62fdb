"""Redis clients for the runtime."""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE

if HIREDIS_AVAILABLE:
    import hiredis


class HiredisPackingConnection(Connection):
    """Packs commands with hiredis, as redis-py's sync client already does.

    The asyncio client packs in pure Python, which costs more than the rest of the loop for the long
    argument lists of the batch scripts.
    """

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        # The runtime's own arguments are str, bytes and int, which hiredis packs as they are: skipping the
        # serializer's per-argument Python check matters for scripts with thousands of arguments. Commands
        # spelled with a space ("XGROUP CREATE") and other argument types take the serializer's path.
        name = args[0]
        if not (b" " in name if isinstance(name, bytes) else " " in str(name)):
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        return self._serializer.pack(*args)


def connect(url: str, *, decode_responses: bool) -> aioredis.Redis:
    kwargs: dict[str, Any] = {"decode_responses": decode_responses, "health_check_interval": 30}
    if HIREDIS_AVAILABLE and url.startswith(("redis://", "valkey://")):
        kwargs["connection_class"] = HiredisPackingConnection
    return aioredis.Redis.from_url(url, **kwargs)


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


def text(value: object) -> str:
    """A reply item (or error) as str, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)
