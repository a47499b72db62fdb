"""The contract between the runtime and a team's processing library."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from phoenix.errors import ConfigError, PhoenixError
from phoenix.worker_runtime.blocking import BLOCKING_THREADS

if TYPE_CHECKING:
    import structlog
    from redis.asyncio import Redis

    from phoenix.worker_runtime.settings import WorkerSettings

T = TypeVar("T")

ENTRY_POINT_GROUP = "phoenix.processors"


class PermanentError(PhoenixError):
    """Retrying cannot help (the input is bad, the record does not exist): the message goes to the DLQ at once, its
    entry naming this exception's type and message. Any other exception is transient and retried with backoff.

    A transient failure that should not be retried forever (every attempt of an LLM call is billed) declares its
    limit as the class attribute `max_attempts` of its exception: a record that fails with it on its n-th attempt
    or later (counted over all its attempts, whatever they failed with) goes to the DLQ as `RetriesExhausted`.
    MAX_ATTEMPTS and MAX_RETRY_AGE do the same for every failure of a stage.
    """


class RecordNotFoundError(PermanentError):
    """The record does not exist (an HTTP 404 from the record's service, say): retrying cannot bring it."""


class Record(Protocol):
    """One record of a batch handed to `process_batch`: the same three values `process` receives."""

    @property
    def record_id(self) -> str: ...
    @property
    def user_id(self) -> str: ...
    @property
    def data(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Routed:
    """A result for a stage of named outputs (`spec.outputs`, OUTPUTS): the dict each named output gets, e.g.
    `Routed({"parser": page})`, or `Routed({"parser": a, "imaging": b})` for both. All of a record's forwards are
    committed together, once (settle.lua), or none is; `Routed({})` commits the record and forwards nothing. A name
    the stage has no output of sends the record to the DLQ with the reason (nothing is forwarded then)."""

    outputs: Mapping[str, dict[str, Any]] = field(default_factory=dict)


#: What `process` returns: the dict to forward (a stage of one output), a Routed (a stage of named outputs), or
#: None to forward nothing.
ProcessResult = dict[str, Any] | Routed | None
#: Per record of a batch: a ProcessResult, or the exception it failed with.
BatchResult = ProcessResult | BaseException


class BaseProcessor:
    """Subclass this, implement `process`, and the runtime does everything else.

    `self.redis` (a decoded redis.asyncio client), `self.logger` (a bound structlog logger) and
    `self.settings` are set before `initialize()` is awaited.
    """

    #: Human-readable name used in logs; defaults to the class name.
    name: ClassVar[str] = ""

    redis: Redis
    logger: structlog.typing.FilteringBoundLogger
    settings: WorkerSettings

    async def initialize(self) -> None:
        """Open clients, load models. Called once before the first message."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> ProcessResult:
        """Process one record. Return a dict to forward it to the next stage, a Routed to choose among the stage's
        named outputs, or None to forward nothing."""
        raise NotImplementedError

    async def process_batch(self, records: Sequence[Record]) -> list[BatchResult]:
        """Process several records in one call, for work that is cheaper in bulk (embeddings, batch LLM calls,
        bulk writes). Return one entry per record, in order: a dict, a Routed, None, or the exception that record failed
        with (RecordNotFoundError: dead-lettered; anything else: retried). Each record keeps its own outcome,
        lock and idempotency marker; an exception raised by the call itself fails every record of the batch.

        Override it, and the runtime hands over the records of each read (up to CONCURRENCY) in one call.
        Without an override the runtime calls `process` concurrently per record, and this default, which
        calls `process` for each record in turn, is only there for overrides that delegate some records.
        """
        results: list[BatchResult] = []
        for record in records:
            try:
                results.append(await self.process(record.record_id, record.user_id, record.data))
            except Exception as exc:
                results.append(exc)
        return results

    async def cleanup(self) -> None:
        """Release what `initialize` opened. Called once at shutdown."""

    async def run_blocking(self, func: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run CPU-heavy or blocking library code in a thread so the loop keeps serving other messages.

        Context variables (the per-user API key among them) are visible inside the thread. A call that outlives
        PROCESSING_TIMEOUT is cancelled, but its thread cannot be: it is counted as leaked until it ends, and too
        many (MAX_LEAKED_THREADS) make /healthz fail, so that the pod is restarted.
        """
        return await BLOCKING_THREADS.run(func, *args, **kwargs)


class ProcessorLoadError(ConfigError):
    """PROCESSOR names nothing importable, or something that is not a BaseProcessor."""


def load_processor_class(spec: str) -> type[BaseProcessor]:
    """Resolve `package.module:Class` or the name of an entry point in group `phoenix.processors`."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            obj: Any = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ProcessorLoadError(f"cannot import {spec!r}: {exc}") from exc
    else:
        matches = entry_points(group=ENTRY_POINT_GROUP, name=spec)
        if not matches:
            known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
            raise ProcessorLoadError(
                f"no processor named {spec!r} (entry points in {ENTRY_POINT_GROUP}: {', '.join(known) or 'none'}; "
                "or use package.module:Class)"
            )
        try:
            obj = next(iter(matches)).load()
        except (ImportError, AttributeError) as exc:
            raise ProcessorLoadError(f"cannot load entry point {spec!r}: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, BaseProcessor)):
        raise ProcessorLoadError(f"{spec!r} is not a subclass of phoenix.worker_runtime.BaseProcessor")
    return obj
