"""The audit log of a stage's repairs: who replayed, reclaimed, unlocked, reprocessed or purged what, how many,
and when, whether a person (`phoenix ...`) or the operator (a `phoenix.io/replay-dlq` request) did it.

One stream per stage (keys.StageKeys.audit), capped with XADD MAXLEN ~: it is a record for people, not work, so
the oldest entries may go. `phoenix audit` prints it; `phoenix inspect` shows the repairs that named its record.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from phoenix.redis_replies import text, text_range

# About a year of a busy on-call's repairs; trimmed approximately (whole radix-tree nodes), so a few more stay.
AUDIT_MAXLEN = 10_000
DEFAULT_SHOWN = 20


def person() -> str:
    """user@host of whoever runs a command; the user from the environment when the uid has no passwd entry."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = os.environ.get("USER") or f"uid {os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def operator_actor() -> str:
    """The operator replica (its pod's name is the hostname)."""
    return f"phoenix-operator@{socket.gethostname()}"


@dataclass(frozen=True)
class Repair:
    """One audit entry. `action`: dlq-replay, dlq-purge, reclaim, unlock, reprocess, migrate."""

    actor: str
    action: str
    count: int
    detail: str  # what was done, in a sentence
    record_id: str = ""  # the one record it was about, if any
    at: str = ""  # ISO 8601 UTC; set by record()
    entry_id: str = ""  # the audit entry's id; set when read back

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def record(client: Redis, stream: str, repair: Repair) -> str:
    """Append `repair` (stamped now) to the stage's audit stream; returns the entry id."""
    at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    fields: dict[FieldT, EncodableT] = {
        "at": at,
        "actor": repair.actor,
        "action": repair.action,
        "count": str(repair.count),
        "detail": repair.detail,
        "record_id": repair.record_id,
    }
    return text(await client.xadd(stream, fields, maxlen=AUDIT_MAXLEN, approximate=True))


async def recent(client: Redis, stream: str, count: int = DEFAULT_SHOWN) -> list[Repair]:
    """The newest `count` repairs, oldest first (on a client that decodes responses)."""
    newest = await text_range(client, stream, count=count, newest_first=True)
    return [_repair(entry_id, fields) for entry_id, fields in reversed(newest)]


async def of_record(client: Redis, stream: str, record_id: str, scan: int) -> list[Repair]:
    """The repairs about `record_id` among the newest `scan` entries, oldest first."""
    return [r for r in await recent(client, stream, scan) if r.record_id == record_id]


def _repair(entry_id: str, fields: dict[str, str]) -> Repair:
    return Repair(
        actor=fields.get("actor", ""),
        action=fields.get("action", ""),
        count=int(fields.get("count") or 0),
        detail=fields.get("detail", ""),
        record_id=fields.get("record_id", ""),
        at=fields.get("at", ""),
        entry_id=entry_id,
    )


def format_repair(r: Repair) -> str:
    return f"{r.at}  {r.actor}  {r.action} ({r.count}): {r.detail}"
