"""A record's wire format in Redis: what the worker runtime writes and the tools, the operator and the CLI read.

- A stream entry's fields: the envelope the runtime owns (record_id, user_id, data, the failure history of a
  retry, original_id, traceparent), everything else the processor's data; an entry too wide for one Lua unpack is
  written packed (PACKED_FIELDS).
- A record key's value (`phoenix:{<ns>}:<stage>:record:<id>`, keys.py): `lock <token>` while a worker holds it,
  `done <entry id>` once committed (worker_runtime/locks.py says why it is one key).
- A retry-set member: the entry's fields packed, as the retry will write them back.
- A dead letter: the original fields plus FAILURE_FIELDS.

The names are spelled here once; the key names are keys.py's.
"""

from __future__ import annotations

import json

# The most values one Lua unpack may give (Lua 5.1 fails near 8,000), and every script that writes an entry
# unpacks its fields, two values each: SCRIPT_SAFE_FIELDS is the widest entry the scripts are given, with room for
# the runtime's own fields. Wider entries are written packed (PACKED_FIELDS); MAX_ENTRY_FIELDS cannot exceed it.
LUA_UNPACK_LIMIT = 7900
SCRIPT_SAFE_FIELDS = 3000
# The deepest an entry's data and a result may nest lists and objects: what orjson, which reads nearly every entry,
# reads itself (worker_runtime/jsoncodec.py holds the json module, which reads and writes the rest, to it as well).
DATA_DEPTH_LIMIT = 1024
# A packed entry: its fields as one JSON array [name, value, name, value, ...] beside its record_id.
PACKED_FIELDS = "packed_fields"
# The failure history a retried entry carries; a replay or a manual reprocess starts it afresh.
RETRY_STATE_FIELDS = ("retry_count", "first_failed_at", "last_error")
# Fields the runtime owns; everything else in an entry is the processor's data.
ENVELOPE_FIELDS = frozenset(
    {"record_id", "user_id", "data", *RETRY_STATE_FIELDS, "original_id", "traceparent", PACKED_FIELDS}
)
# The next stage's entry: its field names, sent once per settle call (settle.lua).
OUTPUT_FIELDS = ("record_id", "user_id", "data", "traceparent")
# The name of one of a stage's named outputs (spec.outputs, OUTPUTS): a DNS label, as a stage's name.
OUTPUT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# The field of an outbox entry naming the output it is relayed to (a stage of named outputs); the relay writes
# the entry to that output without it.
ROUTE_FIELD = "route"
# Fields the runtime adds to a DLQ entry; the original fields are kept beside them.
FAILURE_FIELDS = ("error", "error_type", "stage", "attempts", "original_id", "failed_at")

# A record key's two states.
LOCKED = "lock "
DONE = "done "


def lock_holder(token: str) -> str:
    """The consumer name inside an owner token (`<consumer>:<suffix>`, locks.lock_token)."""
    return token.rpartition(":")[0]


def locked_by(value: str | None) -> str | None:
    """The owner token in a record key's value, or None when the record is not locked."""
    return value.removeprefix(LOCKED) if value is not None and value.startswith(LOCKED) else None


def committed_by(value: str | None) -> str | None:
    """The entry id whose commit set the marker, or None when the record is not committed."""
    return value.removeprefix(DONE) if value is not None and value.startswith(DONE) else None


def pack_pairs(pairs: list[bytes | str]) -> str:
    """PACKED_FIELDS's value: field names and values alternating; bytes that are not UTF-8 kept as \\udcXX escapes."""
    return json.dumps([v.decode(errors="surrogateescape") if isinstance(v, bytes) else v for v in pairs])


def packed_pairs(value: str | bytes) -> dict[str, str]:
    """The fields a PACKED_FIELDS value (or a retry-set member) holds."""
    pairs = json.loads(value)
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def id_order(entry_id: str) -> tuple[int, int]:
    """Stream ids compare as (milliseconds, sequence), not as strings."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
