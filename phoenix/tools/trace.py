"""Where one record is in a pipeline and where it has been: `phoenix trace` and `kubectl phoenix trace`.

One inspection (inspection.py) per stage, in the pipeline's order, each read down to one state; the record's
position is the last stage that has seen it. Redis keeps no time of a commit: it is the time of the entry the commit
forwarded (when the stage's output is known), else what the marker's TTL tells (set to IDEMPOTENCY_TTL at the
commit), which is exact only when the stage's IDEMPOTENCY_TTL is the one given.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis

from phoenix.tools.inspection import (
    DEFAULT_SCAN_LIMIT,
    RecordReport,
    diagnose,
    duration,
    inspect_record,
    iso_time,
)
from phoenix.worker_runtime.settings import WorkerSettings

State = Literal["not seen", "waiting", "in flight", "pending", "retrying", "committed", "dead-lettered", "acknowledged"]


@dataclass(frozen=True)
class StageState:
    stage: str
    state: State
    text: str  # the state as one line: on which consumer, when, how many retries, why
    report: RecordReport

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "state": self.state, "text": self.text, "report": self.report.as_dict()}


@dataclass(frozen=True)
class Trace:
    record_id: str
    pipeline: str
    stages: list[StageState]

    @property
    def position(self) -> StageState | None:
        """The last stage, in the pipeline's order, that has seen the record (None: no stage has)."""
        return next((s for s in reversed(self.stages) if s.state != "not seen"), None)

    @property
    def now(self) -> str:
        at = self.position
        return f"{at.stage}: {at.text}" if at is not None else f"no stage of the pipeline has seen {self.record_id}"

    def as_dict(self) -> dict[str, Any]:
        at = self.position
        return {
            "record_id": self.record_id,
            "pipeline": self.pipeline,
            "stages": [s.as_dict() for s in self.stages],
            "position": at.stage if at is not None else None,
            "now": self.now,
        }


async def trace_record(
    client: Redis,
    pipeline: str,
    stages: Sequence[WorkerSettings],
    record_id: str,
    scan_limit: int = DEFAULT_SCAN_LIMIT,
) -> Trace:
    """`stages` in the pipeline's order; `client` decodes responses (as inspect_record needs)."""
    reports = [await inspect_record(client, s, record_id, scan_limit) for s in stages]
    now = time.time()
    return Trace(
        record_id,
        pipeline,
        [StageState(s.service_name, *_state(r, s, now), r) for s, r in zip(stages, reports, strict=True)],
    )


def _state(r: RecordReport, s: WorkerSettings, now: float) -> tuple[State, str]:
    """The record's state in one stage, most current first (as inspection.diagnose orders them)."""
    if r.lock is not None:
        holder = r.consumers.get(r.lock.holder)
        if holder is not None and holder.alive:
            return "in flight", f"in flight on consumer {r.lock.holder}"
        return "pending", diagnose(r)
    if r.retries:
        retry = r.retries[0]
        return (
            "retrying",
            f"retrying: failed {retry.attempt - 1} times, next at {retry.due_at} "
            f"(last error: {retry.last_error or '-'})",
        )
    if any(e.state == "pending" for e in r.entries):
        return "pending", diagnose(r)
    if r.marker is not None:
        return "committed", f"committed at {iso_time(_committed_at(r, s, now))}"
    if waiting := [e for e in r.entries if e.state == "waiting"]:
        return "waiting", f"waiting since {iso_time(now - waiting[0].age_seconds)} ({duration(waiting[0].age_seconds)})"
    if r.dead_letters:
        dead = r.dead_letters[0]
        return "dead-lettered", f"dead-lettered at {dead.failed_at}: {dead.error_type}: {dead.error}"
    if r.entries:
        return "acknowledged", diagnose(r)
    return "not seen", "not seen"


def _committed_at(r: RecordReport, s: WorkerSettings, now: float) -> float:
    """The forwarded entry's time (written by the commit itself), else the marker's age by its TTL."""
    if r.forwarded:
        return now - r.forwarded[-1].age_seconds
    assert r.marker is not None
    return now - max(0.0, s.idempotency_ttl - r.marker.ttl_seconds)
