"""Redis clients for the runtime."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection
from redis.connection import HiredisRespSerializer
from redis.utils import HIREDIS_AVAILABLE


class HiredisPackingConnection(Connection):
    """Packs commands with hiredis, as redis-py's sync client already does.

    The asyncio client packs in pure Python, which costs more than the rest of the loop for the long
    argument lists of the batch scripts.
    """

    _serializer = HiredisRespSerializer()

    def pack_command(self, *args: object) -> list[bytes]:
        return self._serializer.pack(*args)


def connect(url: str, *, decode_responses: bool) -> aioredis.Redis:
    kwargs: dict[str, object] = {"decode_responses": decode_responses, "health_check_interval": 30}
    if HIREDIS_AVAILABLE and url.startswith(("redis://", "valkey://")):
        kwargs["connection_class"] = HiredisPackingConnection
    return aioredis.Redis.from_url(url, **kwargs)
