"""The dead-letter stream: what failed for good, with the reason, and the way back."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from redis.asyncio import Redis

from phoenix.worker_runtime import lua
from phoenix.worker_runtime.messages import RawFields

_REPLAY_BATCH = 1000
# Fields the runtime adds to a DLQ entry; the original fields are kept beside them.
FAILURE_FIELDS = ("error", "error_type", "stage", "attempts", "original_id", "failed_at")
_FAILURE_KEYS = frozenset(f.encode() for f in FAILURE_FIELDS)


def dead_letter_fields(
    raw: RawFields, entry_id: str, *, error: str, error_type: str, stage: str, attempts: int
) -> list[str | bytes]:
    """The original fields (bytes kept as they came, even undecodable ones) plus why and where it failed."""
    fields: dict[bytes, str | bytes] = {k: v for k, v in raw.items() if k not in _FAILURE_KEYS}
    original_id = raw.get(b"original_id", entry_id.encode())
    fields.update({
        b"error": error[:2000],
        b"error_type": error_type,
        b"stage": stage,
        b"attempts": str(attempts),
        b"original_id": original_id,
        b"failed_at": datetime.fromtimestamp(time.time(), UTC).isoformat(timespec="milliseconds"),
    })
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
