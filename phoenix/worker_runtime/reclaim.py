"""Taking over the messages of workers that died: XAUTOCLAIM of entries idle past CLAIM_IDLE_MS."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from phoenix.record_format import id_order
from phoenix.redis_replies import text
from phoenix.worker_runtime.redis_client import Entry
from phoenix.worker_runtime.settings import WorkerSettings

# Consumers of dead pods pile up in XINFO CONSUMERS; a live worker polls every BLOCK_MS, so an hour of
# idleness with nothing pending means the consumer is gone for good.
_FORGET_CONSUMER_AFTER_MS = 3_600_000


class Reclaimer:
    """Takes over a lane's entries left pending by dead workers (XAUTOCLAIM past CLAIM_IDLE_MS)."""

    def __init__(self, client: Redis, settings: WorkerSettings, stream: str) -> None:
        """`stream`: the lane's input (or outbox) whose pending entries this reclaims."""
        self._client = client
        self._s = settings
        self._stream = stream
        self._cursor = "0-0"

    async def claim(self, count: int) -> tuple[list[Entry], int]:
        """Up to `count` idle entries for this consumer, and how many pending entries had been trimmed away.

        Trimmed entries are dropped from the PEL by XAUTOCLAIM itself (Redis 7+); they are only counted.
        The cursor carries over between calls so a long PEL is walked a slice at a time.
        """
        s = self._s
        cursor, claimed, deleted = await self._client.xautoclaim(
            self._stream, s.consumer_group, s.consumer_name, s.claim_idle_ms, self._cursor, count=count
        )
        self._cursor = cursor.decode() if isinstance(cursor, bytes) else cursor
        return list(claimed), len(deleted)

    @property
    def exhausted(self) -> bool:
        """True when the last call reached the end of the pending list."""
        return self._cursor == "0-0"

    async def delivery_counts(self, entry_ids: Sequence[str]) -> dict[str, int]:
        """Delivery counts of entries this consumer now owns, in one XPENDING over their id range."""
        if not entry_ids:
            return {}
        s = self._s
        rows = await self._client.xpending_range(
            self._stream,
            s.consumer_group,
            min=min(entry_ids, key=id_order),
            max=max(entry_ids, key=id_order),
            count=len(entry_ids) * 4 + 100,
            consumername=s.consumer_name,
        )
        return {text(r["message_id"]): int(r["times_delivered"]) for r in rows}

    async def forget_dead_consumers(self) -> list[str]:
        s = self._s
        gone = []
        for c in await self._client.xinfo_consumers(self._stream, s.consumer_group):
            name = text(c["name"])
            if name != s.consumer_name and int(c["pending"]) == 0 and int(c["idle"]) > _FORGET_CONSUMER_AFTER_MS:
                await self._client.xgroup_delconsumer(self._stream, s.consumer_group, name)
                gone.append(name)
        return gone
