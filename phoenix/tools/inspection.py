"""Everything Redis knows about one record of a stage, and a one-line diagnosis of where it is.

The original runbook did this by hand: XRANGE the input, XPENDING, GET the lock and the marker, look at the retry
set and the DLQ. Here it is one read-only pass; `phoenix inspect` and `kubectl phoenix inspect` print it.
A stream has no index by record, so the input, DLQ and output streams are scanned from their newest entry back,
at most `scan_limit` entries each.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from phoenix.record_format import RETRY_STATE_FIELDS, committed_by, id_order, lock_holder, locked_by, packed_pairs
from phoenix.redis_replies import text, text_range
from phoenix.worker_runtime.lanes import Output
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.tracing import trace_id_of

DEFAULT_SCAN_LIMIT = 100_000
_PAGE = 1000
_RETRY_COUNT, _FIRST_FAILED_AT, _LAST_ERROR = RETRY_STATE_FIELDS


def consumer_alive(idle_ms: int, settings: WorkerSettings) -> bool:
    """A live worker touches the group at least every BLOCK_MS (reads) or lock-renewal interval (XCLAIM of its
    long jobs), both far below CLAIM_IDLE_MS; past it, the worker's own rule treats its entries as abandoned."""
    return idle_ms < settings.claim_idle_ms


@dataclass(frozen=True)
class Consumer:
    name: str
    idle_seconds: float
    pending: int
    alive: bool


@dataclass(frozen=True)
class InputEntry:
    entry_id: str
    age_seconds: float
    state: Literal["waiting", "pending", "acknowledged"]
    retry_count: int
    consumer: str | None = None  # pending: the consumer it was delivered to
    deliveries: int | None = None
    idle_seconds: float | None = None


@dataclass(frozen=True)
class Lock:
    key: str
    holder: str
    ttl_seconds: float


@dataclass(frozen=True)
class Marker:
    key: str
    committed_by: str  # the entry id whose commit set it
    ttl_seconds: float


@dataclass(frozen=True)
class WaitingRetry:
    attempt: int  # the attempt that will run next
    due_at: str
    due_in_seconds: float
    last_error: str
    first_failed_at: str | None


@dataclass(frozen=True)
class DeadLetter:
    entry_id: str
    failed_at: str
    error_type: str
    error: str
    attempts: str


@dataclass(frozen=True)
class Forwarded:
    stream: str
    entry_id: str
    age_seconds: float


@dataclass
class RecordReport:
    service: str
    record_id: str
    input_stream: str
    group: str
    claim_idle_seconds: float
    scan_limit: int
    group_exists: bool = False
    lag: int | None = None
    consumers: dict[str, Consumer] = field(default_factory=dict)
    entries: list[InputEntry] = field(default_factory=list)
    lock: Lock | None = None
    marker: Marker | None = None
    retries: list[WaitingRetry] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    forwarded: list[Forwarded] = field(default_factory=list)
    # The traces its entries carry (traceparent), in the order seen: one, unless someone re-added it by hand.
    trace_ids: list[str] = field(default_factory=list)

    def saw_trace(self, fields: dict[str, str]) -> None:
        trace_id = trace_id_of(fields.get("traceparent"))
        if trace_id and trace_id not in self.trace_ids:
            self.trace_ids.append(trace_id)

    @property
    def diagnosis(self) -> str:
        return diagnose(self)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "diagnosis": self.diagnosis}


async def inspect_record(
    client: Redis, settings: WorkerSettings, record_id: str, scan_limit: int = DEFAULT_SCAN_LIMIT
) -> RecordReport:
    """`client` must decode responses (the CLI's does, replacing undecodable bytes)."""
    s = settings
    lane = s.keys.lane_of(record_id)  # the record's partition: the stage itself when it has one
    now_ms = time.time() * 1000
    report = RecordReport(s.service_name, record_id, lane.input, s.consumer_group, s.claim_idle_ms / 1000, scan_limit)
    last_delivered = await _read_group(client, s, lane.input, report)
    seen: list[dict[str, str]] = []
    async for entry_id, fields in entries_of(client, lane.input, record_id, scan_limit):
        report.entries.append(await _input_entry(client, s, lane.input, entry_id, fields, last_delivered, now_ms))
        seen.append(fields)
    report.entries.reverse()  # oldest first, as in the stream
    for fields in reversed(seen):
        report.saw_trace(fields)

    key = lane.record(record_id)
    pipe = client.pipeline(transaction=False)
    # One by one, not chained: redis-py types a pipeline's commands as returning awaitables, not the pipeline.
    pipe.get(key)
    pipe.pttl(key)
    state, ttl_ms = await pipe.execute()
    ttl = max(ttl_ms, 0) / 1000
    if (token := locked_by(state)) is not None:
        report.lock = Lock(key, lock_holder(token), ttl)
    if (committer := committed_by(state)) is not None:
        report.marker = Marker(key, committer, ttl)

    async for member, due_ms in client.zscan_iter(lane.retry):
        fields = packed_pairs(member)
        if fields.get("record_id") == record_id:
            report.retries.append(_waiting_retry(fields, due_ms, now_ms))
            report.saw_trace(fields)
    report.retries.sort(key=lambda r: r.due_at)

    async for entry_id, fields in entries_of(client, lane.dlq, record_id, scan_limit):
        report.saw_trace(fields)
        report.dead_letters.append(
            DeadLetter(
                entry_id,
                fields.get("failed_at", ""),
                fields.get("error_type", ""),
                fields.get("error", ""),
                fields.get("attempts", ""),
            )
        )
    if s.output_queue:
        output = Output.of(s).target(record_id)
        async for entry_id, fields in entries_of(client, output, record_id, scan_limit):
            report.saw_trace(fields)
            report.forwarded.append(Forwarded(output, entry_id, _age(entry_id, now_ms)))
    return report


async def _read_group(client: Redis, s: WorkerSettings, stream: str, report: RecordReport) -> str | None:
    """Fill in the group's lag and consumers on `stream` (the record's input); returns its last-delivered id (None:
    no such group)."""
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:
        return None  # no stream yet
    group = next((g for g in groups if g["name"] == s.consumer_group), None)
    if group is None:
        return None
    report.group_exists = True
    report.lag = group.get("lag")
    for c in await client.xinfo_consumers(stream, s.consumer_group):
        idle = int(c["idle"])
        report.consumers[c["name"]] = Consumer(c["name"], idle / 1000, int(c["pending"]), consumer_alive(idle, s))
    return group["last-delivered-id"]


async def entries_of(
    client: Redis, stream: str, record_id: str, scan_limit: int
) -> AsyncIterator[tuple[str, dict[str, str]]]:
    """Entries of `stream` for `record_id`, newest first, among its newest `scan_limit` entries."""
    scanned, upper = 0, "+"
    while scanned < scan_limit:
        page = await text_range(client, stream, last=upper, count=min(_PAGE, scan_limit - scanned), newest_first=True)
        for entry_id, fields in page:
            if fields.get("record_id") == record_id:
                yield entry_id, fields
        scanned += len(page)
        if len(page) < _PAGE:
            return
        upper = "(" + page[-1][0]


async def _input_entry(
    client: Redis,
    s: WorkerSettings,
    stream: str,
    entry_id: str,
    fields: dict[str, str],
    last_delivered: str | None,
    now_ms: float,
) -> InputEntry:
    age, retry_count = _age(entry_id, now_ms), int(fields.get(_RETRY_COUNT) or 0)
    if last_delivered is None or id_order(entry_id) > id_order(last_delivered):
        return InputEntry(entry_id, age, "waiting", retry_count)
    rows = await client.xpending_range(stream, s.consumer_group, min=entry_id, max=entry_id, count=1)
    if not rows:
        return InputEntry(entry_id, age, "acknowledged", retry_count)
    row = rows[0]
    return InputEntry(
        entry_id,
        age,
        "pending",
        retry_count,
        text(row["consumer"]),
        int(row["times_delivered"]),
        int(row["time_since_delivered"]) / 1000,
    )


def _waiting_retry(fields: dict[str, str], due_ms: float, now_ms: float) -> WaitingRetry:
    first = fields.get(_FIRST_FAILED_AT)
    return WaitingRetry(
        attempt=int(fields.get(_RETRY_COUNT) or 0) + 1,
        due_at=iso_time(due_ms / 1000),
        due_in_seconds=max(0.0, (due_ms - now_ms) / 1000),
        last_error=fields.get(_LAST_ERROR, ""),
        first_failed_at=iso_time(float(first)) if first else None,
    )


def iso_time(epoch_seconds: float) -> str:
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="seconds")


def _age(entry_id: str, now_ms: float) -> float:
    """Stream ids start with the server's clock at XADD."""
    return max(0.0, (now_ms - int(entry_id.partition("-")[0])) / 1000)


def duration(seconds: float) -> str:
    """12 s, 12 min, 3.5 h: how long, as a person says it."""
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- diagnosis: the first rule that applies, most urgent first ---------------------------------------------------


def diagnose(r: RecordReport) -> str:
    pending = [e for e in r.entries if e.state == "pending"]
    waiting = [e for e in r.entries if e.state == "waiting"]
    if r.lock is not None:
        return _locked(r, pending)
    if r.retries:
        retry = r.retries[0]
        return (
            f"retrying: attempt {retry.attempt - 1} failed ({retry.last_error or 'no error recorded'}); "
            f"attempt {retry.attempt} is due at {retry.due_at} (in {duration(retry.due_in_seconds)})"
        )
    if pending:
        return _pending_unlocked(r, pending[-1])
    if waiting:
        entry = waiting[0]
        if r.marker is not None:
            return (
                f"committed by entry {r.marker.committed_by}; the waiting entry {entry.entry_id} will be "
                "skipped as a duplicate"
            )
        if not any(c.alive for c in r.consumers.values()):
            return (
                f"waiting for {duration(entry.age_seconds)} in {r.input_stream}, but group {r.group} has no live "
                "consumer: is the stage running (not paused, not crash-looping)?"
            )
        return (
            f"waiting: entry {entry.entry_id} was added {duration(entry.age_seconds)} ago; "
            f"{r.lag if r.lag is not None else 'an unknown number of'} entries of the stage are not yet delivered"
        )
    if r.marker is not None:
        return (
            f"committed by entry {r.marker.committed_by}; duplicates will be skipped for the next "
            f"{duration(r.marker.ttl_seconds)} (IDEMPOTENCY_TTL)"
        )
    if r.dead_letters:
        dead = r.dead_letters[0]
        return (
            f"dead-lettered at {dead.failed_at}: {dead.error_type}: {dead.error} "
            "(fix the cause, then `phoenix reprocess` or `phoenix dlq replay`)"
        )
    if r.entries:
        return (
            "acknowledged, but no marker, retry or dead letter: its marker expired (IDEMPOTENCY_TTL), or the "
            "entry was acknowledged by hand"
        )
    return (
        f"no trace of {r.record_id} in the newest {r.scan_limit} entries of {r.input_stream}, its retry set or "
        "its DLQ: was it enqueued to this stage?"
    )


def _locked(r: RecordReport, pending: list[InputEntry]) -> str:
    lock = r.lock
    assert lock is not None
    holder = r.consumers.get(lock.holder)
    if holder is not None and holder.alive:
        return f"in flight: {lock.holder} is processing it (lock renewed, {duration(lock.ttl_seconds)} left)"
    whose = [e for e in pending if e.consumer == lock.holder]
    when = f"its entry {_reclaim_time(r, whose[-1])}" if whose else "no entry of it is pending on that consumer"
    return (
        f"locked by a consumer that {_dead_state(holder)} (dead): {when}, and the lock expires in "
        f"{duration(lock.ttl_seconds)}; `phoenix unlock` and `phoenix reclaim` act now"
    )


def _pending_unlocked(r: RecordReport, entry: InputEntry) -> str:
    owner = r.consumers.get(entry.consumer or "")
    if owner is not None and owner.alive:
        return (
            f"delivered to {entry.consumer} (alive) {duration(entry.idle_seconds or 0)} ago and left pending "
            f"without a lock (its circuit is open, or it is shutting down): if it stays idle, it "
            f"{_reclaim_time(r, entry)}"
        )
    return (
        f"delivered to {entry.consumer}, a consumer that {_dead_state(owner)} (dead): it "
        f"{_reclaim_time(r, entry)}; `phoenix reclaim` acts now"
    )


def _dead_state(consumer: Consumer | None) -> str:
    return f"has been idle {duration(consumer.idle_seconds)}" if consumer else "has left the consumer group"


def _reclaim_time(r: RecordReport, entry: InputEntry) -> str:
    """When a live worker's reclaim pass takes a pending entry over: once it is idle past CLAIM_IDLE_MS."""
    reclaim_in = r.claim_idle_seconds - (entry.idle_seconds or 0.0)
    if reclaim_in > 0:
        return f"will be reclaimed in {duration(reclaim_in)}"
    return "is due to be reclaimed by the next live worker's reclaim pass"
