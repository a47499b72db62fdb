"""One Redis client per distinct URL, shared by every stage that uses it."""

from __future__ import annotations

import redis.asyncio as aioredis

# An unreachable Redis must fail a reconcile or a refresh within seconds, not hang it.
CONNECT_TIMEOUT_SECONDS = 5.0
COMMAND_TIMEOUT_SECONDS = 10.0


class RedisPool:
    def __init__(self) -> None:
        self._clients: dict[str, aioredis.Redis] = {}

    def client(self, url: str) -> aioredis.Redis:
        found = self._clients.get(url)
        if found is None:
            found = aioredis.Redis.from_url(
                url,
                decode_responses=True,
                socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
                socket_timeout=COMMAND_TIMEOUT_SECONDS,
                health_check_interval=30,
            )
            self._clients[url] = found
        return found

    async def retain(self, urls: set[str]) -> None:
        """Close the clients of URLs no stage uses any more (a rotated Secret, deleted stages)."""
        for url in set(self._clients) - urls:
            await self._clients.pop(url).aclose()

    async def close(self) -> None:
        await self.retain(set())
