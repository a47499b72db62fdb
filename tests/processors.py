"""Processors the worker tests run inside real `phoenix worker` subprocesses.

Behaviour is steered through the message data and Redis keys, so a test can change it while workers run.
Every call leaves a side effect in Redis (`effects:{stage}` hash, `pids:{stage}:{record}` set) so tests
can count how often a record was really processed, and by which process.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from typing import Any

from phoenix.worker_runtime import BaseProcessor, BatchResult, PermanentError, Record, RecordNotFoundError


class InvalidInputError(PermanentError):
    """A processor's own permanent failure: the DLQ entry must name it, not a runtime class."""


class ScriptedProcessor(BaseProcessor):
    """data["action"]: missing | invalid | fail | sleep:<s> | crash-before | crash-after | none; default: forward.

    crash-* kill the whole worker with SIGKILL the first time a record is seen (`crashed:{stage}:{record}`),
    before or after the side effect. The Redis key `dependency-down:{stage}` makes every call fail.
    """

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        stage = self.settings.service_name
        action = str(data.get("action", ""))
        await self.redis.incr(f"calls:{stage}")
        if await self.redis.exists(f"dependency-down:{stage}"):
            raise ConnectionError("dependency is down")
        if action == "crash-before" and await self.redis.set(f"crashed:{stage}:{record_id}", 1, nx=True):
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "missing":
            raise RecordNotFoundError(f"record {record_id} does not exist")
        if action == "invalid":
            raise InvalidInputError(f"record {record_id} has no usable input")
        if action == "fail":
            raise RuntimeError("transient failure")
        if action.startswith("sleep:"):
            await asyncio.sleep(float(action.partition(":")[2]))
        # One transaction, so a kill cannot separate the side effect from the record of who caused it.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(f"effects:{stage}", record_id, 1).sadd(f"pids:{stage}:{record_id}", os.getpid())
            await pipe.execute()
        if action == "crash-after" and await self.redis.set(f"crashed:{stage}:{record_id}", 1, nx=True):
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "none":
            return None
        return {**data, "seen_by": stage}


class AlwaysCrashProcessor(BaseProcessor):
    """Kills its worker on every call: a poison message."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        await self.redis.incr(f"calls:{self.settings.service_name}")
        os.kill(os.getpid(), signal.SIGKILL)
        return None


class KeyReportingProcessor(BaseProcessor):
    """Writes down which API key an LLM call made now would use, both ways a library may look it up."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        from phoenix.worker_runtime.billing import current_api_key

        await self.redis.hset(
            f"seen-key:{record_id}",
            mapping={
                "context": current_api_key() or "",
                "environ": os.environ.get("OPENAI_API_KEY", ""),
            },
        )
        return {"ok": True}


class ScriptedBatchProcessor(BaseProcessor):
    """A batch processor: data["action"] per record is missing | fail-once | (default) forward.

    Each call appends its size to the list `batches:{stage}` and writes the effects of the whole batch in one
    transaction, as a bulk database write would. The Redis key `batch-down:{stage}` makes the whole call raise.
    """

    async def process_batch(self, records: Sequence[Record]) -> list[BatchResult]:
        stage = self.settings.service_name
        await self.redis.rpush(f"batches:{stage}", len(records))
        if await self.redis.exists(f"batch-down:{stage}"):
            raise ConnectionError("batch service is down")
        results: list[BatchResult] = []
        async with self.redis.pipeline(transaction=True) as pipe:
            for r in records:
                action = r.data.get("action")
                if action == "missing":
                    results.append(RecordNotFoundError(f"record {r.record_id} does not exist"))
                elif action == "fail-once" and await self.redis.set(f"failed:{stage}:{r.record_id}", 1, nx=True):
                    results.append(RuntimeError(f"transient failure of {r.record_id}"))
                else:
                    pipe.hincrby(f"effects:{stage}", r.record_id, 1)
                    results.append({**r.data, "seen_by": stage})
            await pipe.execute()
        return results


class SecretQuotingProcessor(BaseProcessor):
    """Fails quoting every secret within its reach: the user's API key, the Redis URL and its password (as written
    and decoded), BILLING_MASTER_KEY; and logs the failure with its traceback first. data["permanent"]: a
    PermanentError (DLQ), else a transient error (retried)."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        from urllib.parse import unquote, urlsplit

        from phoenix.worker_runtime.billing import current_api_key

        url = self.settings.redis_url.get_secret_value()
        quoted = (
            f"key={current_api_key()} url={url} password={unquote(urlsplit(url).password or '')} "
            f"master={os.environ.get('BILLING_MASTER_KEY')}"
        )
        error = InvalidInputError(quoted) if data.get("permanent") else ConnectionError(quoted)
        try:
            raise error
        except Exception:
            self.logger.exception("llm_call_failed", detail=quoted)
            raise


class KeyRefusingProcessor(BaseProcessor):
    """Refuses the first API key it is given for a record, as an LLM service refuses a revoked key (HTTP 401), and
    writes down every key it was given in the list `keys-given:{record_id}`."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        from phoenix.worker_runtime.billing import ApiKeyRejectedError, current_api_key

        if await self.redis.rpush(f"keys-given:{record_id}", current_api_key() or "") == 1:
            raise ApiKeyRejectedError("the LLM service refused the API key (HTTP 401)")
        return {"ok": True}
