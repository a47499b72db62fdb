"""Stream entries to typed messages, and messages back to stream fields.

An entry carries `record_id`, `user_id` and `data` (a JSON object). Other plain fields, such as a
`document_url` added by hand with redis-cli, are merged into `data` so a stage can be fed without tooling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phoenix.record_format import ENVELOPE_FIELDS, PACKED_FIELDS, RETRY_STATE_FIELDS
from phoenix.worker_runtime import jsoncodec
from phoenix.worker_runtime.scrub import scrub

# A retry adds its history, original_id and, when traces are recorded, a traceparent (tracing.py) to an entry:
# MAX_ENTRY_FIELDS does not count them.
_RETRY_ADDED_FIELDS = len(RETRY_STATE_FIELDS) + 2
# Enough of the error to diagnose a waiting retry (`phoenix inspect`) without bloating the entry.
_LAST_ERROR_CHARS = 500
RawFields = dict[bytes, bytes]


@dataclass(slots=True)
class Message:
    """One parsed entry of the input stream, from intake to settle (parse_entry builds it; the processor gets
    record_id, user_id and data).

    `raw` keeps the entry's fields as read, for the DLQ and a retry; `retry_count`, `first_failed_at` and
    `original_id` are its failure history (0 and None on a first attempt); `traceparent` the W3C trace context
    it came with, if any.
    """

    entry_id: str
    record_id: str
    user_id: str
    data: dict[str, Any]
    raw: RawFields
    retry_count: int = 0
    first_failed_at: float | None = None
    original_id: str | None = None
    traceparent: str | None = None

    @property
    def enqueued_at_ms(self) -> int:
        """Stream ids start with the server's clock at XADD, which gives queue wait for free."""
        return int(self.entry_id.partition("-")[0])


@dataclass(slots=True)
class MalformedEntry:
    entry_id: str
    raw: RawFields
    reason: str


def parse_entry(entry_id: str, raw: RawFields, max_bytes: int, max_fields: int) -> Message | MalformedEntry:
    """Validate one entry; anything wrong becomes a MalformedEntry with the reason (RecordPolicy.screen makes one
    of anything it raises all the same)."""
    if len(raw) > max_fields + _RETRY_ADDED_FIELDS:  # before decoding thousands of fields
        return MalformedEntry(entry_id, raw, f"entry has {len(raw)} fields, over MAX_ENTRY_FIELDS={max_fields}")
    # One pass: this runs for every message, so it avoids building intermediate dicts.
    size = 0
    fields: dict[str, str] = {}
    data: dict[str, Any] = {}
    try:
        for k, v in raw.items():
            size += len(k) + len(v)
            key, value = k.decode(), v.decode()
            fields[key] = value
            if key not in ENVELOPE_FIELDS:
                data[key] = value
    except UnicodeDecodeError as exc:
        return MalformedEntry(entry_id, raw, f"entry is not valid UTF-8: {exc.reason} at byte {exc.start}")
    if size > max_bytes:
        return MalformedEntry(entry_id, raw, f"entry is {size} bytes, over MAX_MESSAGE_BYTES={max_bytes}")
    record_id = fields.get("record_id")
    if not record_id:
        return MalformedEntry(entry_id, raw, "missing record_id")
    if PACKED_FIELDS in fields:
        return MalformedEntry(
            entry_id, raw, f"entry carries the {PACKED_FIELDS} of an entry too wide for the runtime's scripts"
        )
    if "data" in fields:
        try:
            payload = jsoncodec.loads(raw[b"data"])
        except jsoncodec.DataTooDeep as exc:
            return MalformedEntry(entry_id, raw, f"data {exc}")
        except ValueError as exc:
            return MalformedEntry(entry_id, raw, f"data is not valid JSON: {exc}")
        if not isinstance(payload, dict):
            return MalformedEntry(entry_id, raw, f"data must be a JSON object, got {type(payload).__name__}")
        data.update(payload)
    try:
        retry_count = int(fields["retry_count"]) if "retry_count" in fields else 0
        first_failed_at = float(fields["first_failed_at"]) if "first_failed_at" in fields else None
    except ValueError as exc:
        return MalformedEntry(entry_id, raw, f"bad runtime field: {exc}")
    return Message(
        entry_id,
        record_id,
        fields.get("user_id", ""),
        data,
        raw,
        retry_count,
        first_failed_at,
        fields.get("original_id"),
        fields.get("traceparent"),
    )


def output_values(message: Message, result: dict[str, Any], traceparent: str | None) -> list[str]:
    """The values of the next stage's entry, in record_format.OUTPUT_FIELDS order, but for record_id, which the commit
    (settle.lua) writes from the outcome; traceparent only when there is one."""
    values = [message.user_id, jsoncodec.dumps(result, str)]
    if traceparent:
        values.append(traceparent)
    return values


def routed_values(message: Message, forwards: list[tuple[int, dict[str, Any]]], traceparent: str | None) -> list[str]:
    """A routed commit's values (settle.lua's F item but for its code and ids): user_id, traceparent ('' for none),
    the count, then per forward its output's number (from 1, in OUTPUTS order) and its data as JSON."""
    values = [message.user_id, traceparent or "", str(len(forwards))]
    for number, result in forwards:
        values += (str(number), jsoncodec.dumps(result, str))
    return values


def failure_history(message: Message, first_failed_at: float, error: str) -> RawFields:
    """The entry's fields with its failure history brought up to this failed attempt: what a retry puts back into
    the input stream, and what a dead letter past its retry limits keeps. Known secrets are masked out of `error`."""
    retry_count, first, last_error = (name.encode() for name in RETRY_STATE_FIELDS)
    fields = dict(message.raw)
    fields[retry_count] = b"%d" % (message.retry_count + 1)
    fields[first] = repr(first_failed_at).encode()
    # An exception's text may hold lone surrogates, which UTF-8 cannot carry.
    fields[last_error] = scrub(error)[:_LAST_ERROR_CHARS].encode(errors="backslashreplace")
    fields.setdefault(b"original_id", message.entry_id.encode())
    return fields


def retry_fields(message: Message, first_failed_at: float, error: str) -> list[str]:
    """The entry as it goes back into the input stream for its next attempt (parse_entry checked it is UTF-8)."""
    return [item.decode() for pair in failure_history(message, first_failed_at, error).items() for item in pair]
