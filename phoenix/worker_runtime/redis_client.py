"""Redis clients for the runtime."""

from __future__ import annotations

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

    def pack_command(self, *args: object) -> list[bytes]:
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
    kwargs: dict[str, object] = {"decode_responses": decode_responses, "health_check_interval": 30}
    if HIREDIS_AVAILABLE and url.startswith(("redis://", "valkey://")):
        kwargs["connection_class"] = HiredisPackingConnection
    return aioredis.Redis.from_url(url, **kwargs)
