"""What the operator remembers about each stage between events (StageRecord), and the StageRegistry of them all;
the same of each pipeline (PipelineRecord, PipelineRegistry)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from phoenix.crds import Condition
from phoenix.keys import StageKeys
from phoenix.redis_spec import RedisSpec

StageKey = tuple[str, str]  # (namespace, name)
PipelineKey = tuple[str, str]  # (namespace, name)
# What the absence of a Secret is remembered as, in place of its resourceVersion.
ABSENT = ""


@dataclass(frozen=True)
class SecretsRead:
    """What a reconcile read of the Secrets a stage's pods use (kube/secrets.py): the resourceVersion of each, by
    name (ABSENT for one that does not exist), and the keys of those spec.pod.envFrom names. Never a value."""

    versions: tuple[tuple[str, str], ...] = ()
    keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class StageRecord:
    """The operator's memory of one PhoenixStage between events: what its handlers, the converger and the status
    refresh need to know without asking the API server or Redis again.

    It lives in this process only and is rebuilt from the objects after a restart (the watch and the resume
    handler see every stage again), so nothing in it is the truth: the PhoenixStage, its children and Redis are.
    Only ever touched from the event loop (the locks order the awaits of different tasks on one stage). Its fields
    in five groups: who the stage is and how it was last seen; what its last reconcile found and wants; its status
    as this operator wrote it; the locks; and the converger's pending work on it.
    """

    # Who: the stage's key, and its object as last seen on the watch (background work acts on that).
    namespace: str
    name: str
    generation: int | None = None
    body: Mapping[str, Any] | None = field(default=None, repr=False)

    # What the last reconcile found and wants.
    streams: StageKeys | None = None
    # Resolved from the stage's Secret at its last reconcile; never printed (repr=False). With Redis ACL users, the
    # administered Redis with the admin's credentials.
    redis: RedisSpec | None = field(default=None, repr=False)
    # The name of the Redis ACL user of its namespace its workers log in as (redis/acl.py); None: its Redis is not
    # administered.
    redis_user: str | None = None
    # (Secret name, resourceVersion) of each Secret the pods read (spec.redis, spec.env, spec.pod.envFrom) at the
    # last reconcile that read them: the Secret check (stage/secret_check.py) compares them with the current ones.
    secret_versions: tuple[tuple[str, str], ...] = ()
    # The wanted form of each child by kind, as of the last reconcile; watch events of children are compared
    # with it (drift.differences).
    children: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    # The partitions each next stage (output.stage, and every stage spec.outputs names) asked for in its spec at the
    # last reconcile, by stage name (1: no such stage); empty: none, or not reconciled yet.
    next_partitions: dict[str, int] = field(default_factory=dict)
    # spec.paused as last reconciled by this process (None: not yet), for the Paused and Resumed Events.
    paused: bool | None = None

    # Its status as this operator wrote it.
    # The status as last written or read: the refresh patches only fields that differ from it.
    status: dict[str, Any] = field(default_factory=dict)
    # When the refresh last wrote its queue figures (monotonic; 0: never): the longest unwritten go first.
    figures_written: float = 0.0
    # The reconcile failure that keeps the stage not Ready, if any.
    error: Condition | None = None
    # The cause of the Warning last posted per source (reconcile, restart, replay, delete): reason, generation.
    warnings: dict[str, tuple[str, int | None]] = field(default_factory=dict)

    # The locks. Serializes read-modify-write of status, and of the Deployment (reconcile against restart).
    status_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    deployment_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # Serializes whole reconciles: a spec change (kopf handler) against a drift repair (converger).
    reconcile_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    # The converger's work (stage/converge.py).
    # Why the stage's world departs from its spec (cause -> kind of what is repaired), noticed since its last
    # repair; the converger repairs it and counts each kind in phoenix_operator_drift_repairs_total.
    drift: dict[str, str] = field(default_factory=dict)
    # The task running now, failed attempts in a row, when to try again, when KEDA's presence was last re-checked.
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    attempts: int = 0
    retry_at: float = 0.0
    keda_checked_at: float = 0.0

    @property
    def key(self) -> StageKey:
        return (self.namespace, self.name)


class StageRegistry:
    """Every stage this operator has seen and not seen deleted, by (namespace, name): the kopf handlers add and
    refresh them (observe), a DELETED watch event or a finished deletion forgets one, and the converger, the
    status refresh and the Secret check walk them all (records)."""

    def __init__(self) -> None:
        self._records: dict[StageKey, StageRecord] = {}

    def observe(self, body: Mapping[str, Any]) -> StageRecord:
        """The stage's record, created on first sight with the status the object carries."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        record = self._records.get(key)
        if record is None:
            record = StageRecord(meta["namespace"], meta["name"], status=dict(body.get("status") or {}))
            self._records[key] = record
        record.generation = meta.get("generation")
        record.body = body
        return record

    def get(self, key: StageKey) -> StageRecord | None:
        """The record of a stage seen, else None (a child's watch event may name a stage not seen yet)."""
        return self._records.get(key)

    def forget(self, key: StageKey) -> None:
        self._records.pop(key, None)

    def records(self) -> list[StageRecord]:
        """A copy: the callers await while walking it, and a handler may add or forget a stage meanwhile."""
        return list(self._records.values())


class EventSubject(Protocol):
    """What Events are posted about (kube/events.py): a StageRecord or a PipelineRecord, its object as last seen and
    the Warnings last posted per source."""

    namespace: str
    name: str
    generation: int | None
    body: Mapping[str, Any] | None
    warnings: dict[str, tuple[str, int | None]]


@dataclass
class PipelineRecord:
    """The operator's memory of one PhoenixPipeline (operator/pipeline/): its object as last seen on the watch, the
    status this operator last wrote, the stage specs it last wrote (to tell a hand edit from a change of the
    pipeline), and the Warnings posted. Rebuilt from the objects after a restart, like a StageRecord."""

    namespace: str
    name: str
    generation: int | None = None
    body: Mapping[str, Any] | None = field(default=None, repr=False)
    status: dict[str, Any] = field(default_factory=dict)
    # By stage name: the spec last written to (or found on) the stage, as the pipeline wanted it then.
    applied: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    warnings: dict[str, tuple[str, int | None]] = field(default_factory=dict)

    @property
    def key(self) -> PipelineKey:
        return (self.namespace, self.name)


class PipelineRegistry:
    """Every pipeline seen and not seen deleted, fed by the watch (handlers.pipeline_seen), walked by the pipeline
    loop (pipeline/loop.py); `wake` is set when a pipeline or one of its stages changed, and `changed` says which
    (the loop takes those at once, the others at its interval)."""

    def __init__(self) -> None:
        self._records: dict[PipelineKey, PipelineRecord] = {}
        self.wake = asyncio.Event()
        self.changed: set[PipelineKey] = set()

    def touch(self, key: PipelineKey) -> None:
        """The pipeline `key` (or one of its stages) changed: the loop looks at it now."""
        self.changed.add(key)
        self.wake.set()

    def observe(self, body: Mapping[str, Any]) -> PipelineRecord:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        record = self._records.get(key)
        if record is None:
            record = PipelineRecord(meta["namespace"], meta["name"], status=dict(body.get("status") or {}))
            self._records[key] = record
        record.generation = meta.get("generation")
        record.body = body
        self.touch(key)
        return record

    def forget(self, key: PipelineKey) -> None:
        self._records.pop(key, None)

    def records(self) -> list[PipelineRecord]:
        """A copy: the loop awaits while walking it."""
        return list(self._records.values())
