"""The dead-letter stream: what failed for good, with the reason, and the way back."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

from redis.asyncio import Redis

from phoenix.worker_runtime import lua
from phoenix.worker_runtime.messages import RawFields
from phoenix.worker_runtime.redis_client import text_range
from phoenix.worker_runtime.scrub import scrub

_REPLAY_BATCH = 1000
# Fields the runtime adds to a DLQ entry; the original fields are kept beside them.
FAILURE_FIELDS = ("error", "error_type", "stage", "attempts", "original_id", "failed_at")
_FAILURE_KEYS = frozenset(f.encode() for f in FAILURE_FIELDS)


def dead_letter_fields(
    raw: RawFields, entry_id: str, *, error: str, error_type: str, stage: str, attempts: int
) -> list[str | bytes]:
    """The original fields (bytes kept as they came, even undecodable ones) plus why and where it failed.

    Known secrets are masked out of `error` (before it is cut, so no secret's beginning is left at the cut)."""
    fields: dict[bytes, str | bytes] = {k: v for k, v in raw.items() if k not in _FAILURE_KEYS}
    original_id = raw.get(b"original_id", entry_id.encode())
    fields.update(
        {
            b"error": scrub(error)[:2000],
            b"error_type": error_type,
            b"stage": stage,
            b"attempts": str(attempts),
            b"original_id": original_id,
            b"failed_at": datetime.fromtimestamp(time.time(), UTC).isoformat(timespec="milliseconds"),
        }
    )
    return [item for pair in fields.items() for item in pair]


async def replay(client: Redis, dlq: str, input_stream: str, limit: int | None) -> int:
    """Move up to `limit` (None: all) DLQ entries, oldest first, back into the input stream."""
    script = lua.register(client, "dlq_replay.lua")
    moved = 0
    while limit is None or moved < limit:
        batch = _REPLAY_BATCH if limit is None else min(_REPLAY_BATCH, limit - moved)
        n = await script(keys=[dlq, input_stream], args=[batch])
        moved += n
        if n < batch:
            break
    return moved


async def entries(client: Redis, dlq: str, page: int = _REPLAY_BATCH) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Every DLQ entry, oldest first, read a page at a time."""
    lower = "-"
    while True:
        batch = await text_range(client, dlq, first=lower, count=page)
        for entry in batch:
            yield entry
        if len(batch) < page:
            return
        lower = "(" + batch[-1][0]


async def purge_through(client: Redis, dlq: str, last_id: str) -> int:
    """Delete the DLQ entries up to and including `last_id` (e.g. the last one exported) in one command.

    Entries dead-lettered after it stay, so exporting and then purging never deletes an entry nobody has read.
    """
    ms, _, seq = last_id.partition("-")
    return await client.xtrim(dlq, minid=f"{int(ms)}-{int(seq or 0) + 1}", approximate=False)
