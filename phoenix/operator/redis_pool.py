"""One Redis client per distinct connection spec, shared by every stage that uses it."""

from __future__ import annotations

import redis.asyncio as aioredis

from phoenix.redis_spec import RedisSpec, connect


class RedisPool:
    def __init__(self) -> None:
        self._clients: dict[RedisSpec, aioredis.Redis] = {}

    def client(self, spec: RedisSpec) -> aioredis.Redis:
        """The client of `spec`, built on first use. Its timeouts are the spec's: the operator sends no blocking
        command, so the defaults (phoenix.redis_spec) let an unreachable Redis fail a reconcile within seconds.
        Raises RedisSpecError when its TLS material cannot be loaded."""
        found = self._clients.get(spec)
        if found is None:
            found = self._clients[spec] = connect(spec, decode_responses=True)
        return found

    async def retain(self, specs: set[RedisSpec]) -> None:
        """Close the clients no stage uses any more (a rotated Secret, deleted stages)."""
        for spec in set(self._clients) - specs:
            await self._clients.pop(spec).aclose()

    async def close(self) -> None:
        await self.retain(set())
