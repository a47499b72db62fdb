"""The dead-letter stream: what failed for good, with the reason, and the way back."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

from redis.asyncio import Redis

from phoenix.worker_runtime import lua
from phoenix.worker_runtime.messages import LUA_UNPACK_LIMIT, PACKED_FIELDS, SCRIPT_SAFE_FIELDS, RawFields, pack_pairs
from phoenix.worker_runtime.redis_client import text, text_range
from phoenix.worker_runtime.scrub import scrub

_REPLAY_BATCH = 1000
# Fields the runtime adds to a DLQ entry; the original fields are kept beside them.
FAILURE_FIELDS = ("error", "error_type", "stage", "attempts", "original_id", "failed_at")
_FAILURE_KEYS = frozenset(f.encode() for f in FAILURE_FIELDS)


def dead_letter_fields(
    raw: RawFields, entry_id: str, *, error: str, error_type: str, stage: str, attempts: int
) -> list[str | bytes]:
    """The original fields (bytes kept as they came, even undecodable ones) plus why and where it failed.

    Known secrets are masked out of `error` (before it is cut, so no secret's beginning is left at the cut). An
    entry wider than the scripts can write field by field keeps its fields packed, beside its record_id."""
    fields: dict[bytes, str | bytes] = {k: v for k, v in raw.items() if k not in _FAILURE_KEYS}
    if len(fields) > SCRIPT_SAFE_FIELDS:
        fields = _packed(fields)
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


def _packed(fields: dict[bytes, str | bytes]) -> dict[bytes, str | bytes]:
    packed: dict[bytes, str | bytes] = {b"record_id": fields[b"record_id"]} if b"record_id" in fields else {}
    packed[PACKED_FIELDS.encode()] = pack_pairs([item for pair in fields.items() for item in pair])
    return packed


def minimal_dead_letter(fields: Sequence[str | bytes | int], write_error: str) -> list[str | bytes]:
    """A dead letter Redis refused (settle.py), in the form every script can write: its failure fields, the
    reason it could not be written added to its error, and everything else packed."""
    pairs = [v if isinstance(v, str | bytes) else str(v) for v in fields]
    original = {text(k).encode(): v for k, v in zip(pairs[::2], pairs[1::2], strict=True)}
    failure = {k: original.pop(k) for k in list(original) if k in _FAILURE_KEYS}
    error = text(failure.get(b"error", b""))[:1500]
    failure[b"error"] = f"{error}; the dead letter could not be written field by field: {scrub(write_error)[:480]}"
    minimal = {**_packed(original), **failure}
    return [item for pair in minimal.items() for item in pair]


def replay_args(count: int, start: str) -> list[str | int]:
    """dlq_replay.lua's ARGV: look at up to `count` entries from `start` ('-', or '(' and the last id looked at)."""
    return [count, start, LUA_UNPACK_LIMIT, PACKED_FIELDS]


async def replay(client: Redis, dlq: str, input_stream: str, limit: int | None) -> int:
    """Move up to `limit` (None: all) DLQ entries, oldest first, back into the input stream; entries too wide
    for the scripts stay (they could only fail again)."""
    script = lua.register(client, "dlq_replay.lua")
    moved, start = 0, "-"
    while limit is None or moved < limit:
        batch = _REPLAY_BATCH if limit is None else min(_REPLAY_BATCH, limit - moved)
        n, seen, last = await script(keys=[dlq, input_stream], args=replay_args(batch, start))
        moved += n
        if seen < batch:
            break
        start = "(" + text(last)  # entries kept in the DLQ (dlq_replay.lua) are not looked at again
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
