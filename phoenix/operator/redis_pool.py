"""One Redis client per distinct target (URL, mode, credentials, TLS material), shared by every stage that uses it.

A rotated Secret makes a new target, so the next use builds a new client and `retain` closes the old one; a
client that Redis refuses with an authentication error is dropped (`failed`), so the next use builds it again.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError

from phoenix.operator.redis_target import RedisTarget

logger = logging.getLogger(__name__)
# An unreachable Redis must fail a reconcile or a refresh within seconds, not hang it.
CONNECT_TIMEOUT_SECONDS = 5.0
COMMAND_TIMEOUT_SECONDS = 10.0


class RedisPool:
    def __init__(self) -> None:
        self._clients: dict[RedisTarget, aioredis.Redis] = {}
        self._closing: set[aioredis.Redis] = set()  # dropped after an authentication error; closed by retain

    def client(self, target: RedisTarget) -> aioredis.Redis:
        found = self._clients.get(target)
        if found is None:
            found = aioredis.Redis.from_url(
                target.url,
                decode_responses=True,
                socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
                socket_timeout=COMMAND_TIMEOUT_SECONDS,
                health_check_interval=30,
            )
            self._clients[target] = found
        return found

    def failed(self, target: RedisTarget, error: BaseException) -> bool:
        """After a command failed with `error`: True (and the client dropped, to be built again at its next use)
        when Redis refused the credentials, which a rotation on the server's side does before the Secret moves."""
        if not isinstance(error, AuthenticationError):
            return False
        dropped = self._clients.pop(target, None)
        if dropped is not None:
            logger.warning("Redis at %s refused the operator's credentials: its client is built again", target.redacted)
            # Closing waits for nothing in flight: the connections that failed are already released.
            self._closing.add(dropped)
        return True

    async def retain(self, targets: set[RedisTarget]) -> None:
        """Close the clients of targets no stage uses any more (a rotated Secret, deleted stages)."""
        for target in set(self._clients) - targets:
            await self._clients.pop(target).aclose()
        while self._closing:
            await self._closing.pop().aclose()

    async def close(self) -> None:
        await self.retain(set())
