"""Group commit: outcomes of many concurrent messages settle in one atomic script call."""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from phoenix.worker_runtime import lua
from phoenix.worker_runtime.settings import WorkerSettings

log = structlog.get_logger("phoenix.settle")

FieldValue = str | bytes | int


class Action(enum.StrEnum):
    COMMIT = "C"
    DEAD_LETTER = "D"
    RETRY = "R"
    LEAVE = "L"


@dataclass(slots=True)
class Outcome:
    action: Action
    entry_id: str
    record_id: str
    holds_lock: bool
    fields: Sequence[FieldValue] = ()


class Settler:
    """Queues outcomes and writes them in batches; `settle` returns once the outcome is durable in Redis."""

    _MAX_BATCH = 512

    def __init__(self, client: Redis, settings: WorkerSettings, token: str) -> None:
        self._script = lua.register(client, "settle.lua")
        s = settings
        self._keys = [s.input_queue, s.output_queue or s.input_queue, s.dlq_name, s.retry_queue]
        self._head: list[FieldValue] = [
            s.consumer_group, token, math.ceil(s.idempotency_ttl), s.lock_prefix, s.marker_prefix,
            s.stream_maxlen, s.dlq_maxlen, "1" if s.output_queue else "0",
        ]
        self._queue: asyncio.Queue[tuple[Outcome, asyncio.Future[bool]]] = asyncio.Queue()

    async def settle(self, outcome: Outcome) -> bool:
        """Returns True when a commit found the record already committed by another worker."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((outcome, future))
        return await future

    async def run(self) -> None:
        """The committer task: takes everything queued since the last call and writes it in one script call."""
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            duplicates = await self._write([outcome for outcome, _ in batch])
            for (_, future), duplicate in zip(batch, duplicates, strict=True):
                if not future.done():
                    future.set_result(bool(duplicate))

    async def _write(self, outcomes: list[Outcome]) -> list[int]:
        args = list(self._head)
        for o in outcomes:
            args += (o.action.value, o.entry_id, o.record_id, "1" if o.holds_lock else "0", len(o.fields))
            args.extend(o.fields)
        delay = 0.1
        while True:
            try:
                return await self._script(keys=self._keys, args=args)
            except RedisError as exc:
                # Nothing was acknowledged: the entries stay pending, so waiting for Redis loses nothing.
                log.warning("settle_failed", error=str(exc), batch=len(outcomes), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
