"""One Redis client per distinct connection spec, shared by every stage that uses it.

A rotated Secret makes a new spec, so the next use builds a new client and `retain` closes the old one; a client
that Redis refuses with an authentication error is dropped (`failed`), so that the next use builds it again.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError

from phoenix.redis_spec import RedisSpec, connect

logger = logging.getLogger(__name__)


class RedisPool:
    """One shared client per Redis the stages name, built on first use, rebuilt when Redis refuses its credentials."""

    def __init__(self) -> None:
        self._clients: dict[RedisSpec, aioredis.Redis] = {}
        self._dropped: list[aioredis.Redis] = []  # refused for their credentials; closed by retain

    def client(self, spec: RedisSpec) -> aioredis.Redis:
        """The client of `spec`, built on first use. Its timeouts are the spec's: the operator sends no blocking
        command, so the defaults (phoenix.redis_spec) let an unreachable Redis fail a reconcile within seconds.
        Raises RedisSpecError when its TLS material cannot be loaded."""
        found = self._clients.get(spec)
        if found is None:
            found = self._clients[spec] = connect(spec, decode_responses=True)
        return found

    def failed(self, spec: RedisSpec, error: BaseException) -> bool:
        """After a command of `spec`'s client failed with `error`: True, and the client dropped to be built again
        at its next use, when Redis refused the credentials (a rotation on the server's side: the Secret check
        brings the new ones); other failures keep the client, which reconnects by itself."""
        if not isinstance(error, AuthenticationError):
            return False
        if (dropped := self._clients.pop(spec, None)) is not None:
            logger.warning("Redis at %s refused the operator's credentials: its client is built again", spec.redacted)
            self._dropped.append(dropped)
        return True

    async def retain(self, specs: set[RedisSpec]) -> None:
        """Close the clients no stage uses any more (a rotated Secret, deleted stages)."""
        for spec in set(self._clients) - specs:
            await self._clients.pop(spec).aclose()
        while self._dropped:
            await self._dropped.pop().aclose()

    async def close(self) -> None:
        await self.retain(set())
