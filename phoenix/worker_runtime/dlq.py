"""A dead letter: what failed for good, with the reason (tools/dlq.py has the way back)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime

from phoenix.record_format import FAILURE_FIELDS, PACKED_FIELDS, SCRIPT_SAFE_FIELDS, pack_pairs
from phoenix.redis_replies import text
from phoenix.worker_runtime.messages import RawFields
from phoenix.worker_runtime.scrub import scrub

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
