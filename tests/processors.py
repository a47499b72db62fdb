"""Processors the worker tests run inside real `phoenix worker` subprocesses.

Behaviour is steered through the message data and Redis keys, so a test can change it while workers run.
Every call leaves a side effect in Redis (`effects:{stage}` hash, `pids:{stage}:{record}` set) so tests
can count how often a record was really processed, and by which process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any, NoReturn

import redis.asyncio

from phoenix.keys import shared_data_key
from phoenix.redis_spec import is_cluster
from phoenix.worker_runtime import (
    BaseProcessor,
    BatchResult,
    PermanentError,
    ProcessResult,
    RateLimited,
    Record,
    RecordNotFoundError,
    Routed,
    report_cost,
)


class InvalidInputError(PermanentError):
    """A processor's own permanent failure: the DLQ entry must name it, not a runtime class."""


async def count_effect(client: redis.asyncio.Redis, stage: str, record_id: str) -> None:
    """The call's side effect: `effects:{stage}` counts it, `pids:{stage}:{record}` says which process made it.
    One transaction, so a kill cannot separate the two; on a cluster they are in two slots, which no transaction
    spans, so there they are written one after the other."""
    async with client.pipeline(transaction=not is_cluster(client)) as pipe:
        pipe.hincrby(f"effects:{stage}", record_id, 1)
        pipe.sadd(f"pids:{stage}:{record_id}", os.getpid())
        await pipe.execute()


class ScriptedProcessor(BaseProcessor):
    """data["action"]: missing | missing-at:<stage> | invalid | fail | fail-once | sleep:<s> | crash-before |
    crash-after | none; default: forward. fail-once fails a record's first attempt at each stage
    (`failed:{stage}:{record}`); missing-at is missing at that stage only.

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
        if action in ("missing", f"missing-at:{stage}"):
            raise RecordNotFoundError(f"record {record_id} does not exist")
        if action == "invalid":
            raise InvalidInputError(f"record {record_id} has no usable input")
        if action == "fail":
            raise RuntimeError("transient failure")
        if action == "fail-once" and await self.redis.set(f"failed:{stage}:{record_id}", 1, nx=True):
            raise RuntimeError(f"transient failure of {record_id}")
        if action.startswith("sleep:"):
            await asyncio.sleep(float(action.partition(":")[2]))
        await count_effect(self.redis, stage, record_id)
        if action == "crash-after" and await self.redis.set(f"crashed:{stage}:{record_id}", 1, nx=True):
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "none":
            return None
        return {**data, "seen_by": stage}


class RoutingProcessor(BaseProcessor):
    """A router over outputs `parser` and `imaging`: data["kind"] lab -> parser, imaging -> imaging, both -> both
    (each its own result), none -> nowhere, unknown -> an output the stage lacks, plain -> a dict (no Routed);
    data["sleep"] seconds first. Side effects counted as ScriptedProcessor's (`effects:{stage}`, `pids:...`)."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> ProcessResult:
        stage = self.settings.service_name
        await asyncio.sleep(float(data.get("sleep", 0)))
        await count_effect(self.redis, stage, record_id)
        kind = data.get("kind")
        routes = {
            "lab": {"parser": {**data, "to": "parser"}},
            "imaging": {"imaging": {**data, "to": "imaging"}},
            "both": {"parser": {**data, "to": "parser"}, "imaging": {**data, "to": "imaging"}},
            "none": {},
            "unknown": {"parser": data, "billing": data},
        }
        if kind == "plain":
            return data
        return Routed(routes[str(kind)])


class OutcomeProcessor(BaseProcessor):
    """ScriptedProcessor's outcomes without its side effects in Redis: data["action"] none | invalid | fail |
    sleep:<s>; default: forward. For a Redis Cluster node, which refuses ScriptedProcessor's side-effect
    transaction (its two keys hash to two slots)."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        action = str(data.get("action", ""))
        if action == "invalid":
            raise InvalidInputError(f"record {record_id} has no usable input")
        if action == "fail":
            raise RuntimeError("transient failure")
        if action.startswith("sleep:"):
            await asyncio.sleep(float(action.partition(":")[2]))
        return None if action == "none" else {**data, "seen_by": self.settings.service_name}


class LimitedCallProcessor(BaseProcessor):
    """A downstream call under the stage's rate limits: the time of each call goes to the list `calls-at:{stage}`
    (ms). data["tokens"]: the call's cost, reported (report_cost); while the key `answer-429:{stage}` exists the
    first call to see it deletes it and is refused with a 429 of Retry-After data["retry_after"] (default 1 s)."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        stage = self.settings.service_name
        await self.redis.rpush(f"calls-at:{stage}", round(time.time() * 1000))
        if await self.redis.delete(f"answer-429:{stage}"):
            raise RateLimited("HTTP 429 from the model", retry_after=float(data.get("retry_after", 1.0)))
        if tokens := data.get("tokens"):
            report_cost(float(tokens))
        return {"ok": True}


class OffRedisProcessor(BaseProcessor):
    """A stage whose work happens outside Redis (an HTTP or LLM call): waits data["sleep"] seconds and forwards, so
    its records finish, and wait for the settler, while the worker's own Redis connection hangs."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        await asyncio.sleep(float(data.get("sleep", 0)))
        return {**data, "seen_by": self.settings.service_name}


class UnreachableRedisProcessor(BaseProcessor):
    """Calls a Redis that refuses connections (data["port"], nothing listening): what a processor's Redis calls do
    while a failover's election runs."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        # No retries: the client passes None on to its connections, which take it, though Redis types it as Retry.
        async with redis.asyncio.Redis(port=int(data["port"]), retry=None) as client:  # type: ignore[arg-type]
            await client.get(record_id)
        return None


class AlwaysCrashProcessor(BaseProcessor):
    """Kills its worker on every call: a poison message."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        await self.redis.incr(f"calls:{self.settings.service_name}")
        os.kill(os.getpid(), signal.SIGKILL)
        return None


class TaskEndingProcessor(BaseProcessor):
    """Ends one of its worker's own tasks by name (data["end_task"]: the trimmer, the settler ...), as a bug would,
    then takes data["sleep"] seconds and forwards nothing: the fault a worker must report and exit non-zero for."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        if name := data.get("end_task"):
            for task in asyncio.all_tasks():
                if task.get_name() == name:
                    task.cancel()
        await asyncio.sleep(float(data.get("sleep", 0)))
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


class ProcessorBaseError(BaseException):
    """What a processor should never raise, and some libraries do: not an Exception."""


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ failed too")


class InterruptingText:
    """A value whose str() raises KeyboardInterrupt, as a processor's own objects may."""

    def __str__(self) -> str:
        raise KeyboardInterrupt

    __repr__ = __str__


class InterruptingError(Exception):
    def __str__(self) -> str:
        raise KeyboardInterrupt


class LimitUntold(Exception):
    @property
    def max_attempts(self) -> int:
        raise ValueError("no limit to tell")


#: Set by a test to end the threads MisbehavingProcessor left stuck (each ends on its own after a while anyway).
RELEASE_STUCK_THREADS = threading.Event()


def _stuck(seconds: float) -> None:
    RELEASE_STUCK_THREADS.wait(seconds)


class MisbehavingProcessor(ScriptedProcessor):
    """ScriptedProcessor, plus what user code does wrong, by data["misbehave"]:

    tuple-key / self-reference: a result JSON cannot hold (every time);
    interrupting-result: a result holding a value whose str() raises KeyboardInterrupt (every time);
    interrupting-error / limit-untold: an exception whose str() raises KeyboardInterrupt, one whose `max_attempts`
    property raises (every time);
    surrogate: a PermanentError whose text UTF-8 cannot carry (every time);
    quote:<text>: a transient error quoting <text> (every time);
    unprintable: an exception whose str() raises, the first time only;
    base-error / system-exit / keyboard-interrupt / cancelled: raised, the first time only;
    swallow-cancel:<s>: the first time, ignores its cancellation for <s> more seconds, then returns a late result
    (writing `late:{stage}:{record}` as it does);
    stuck-thread:<s>: the first time, a run_blocking call that ignores the timeout for <s> seconds.
    A record that misbehaved once (`misbehaved:{stage}:{record}`) is processed as ScriptedProcessor would.
    """

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        stage = self.settings.service_name
        action, _, arg = str(data.get("misbehave", "")).partition(":")
        if action == "tuple-key":
            return {("a", "b"): 1}  # type: ignore[dict-item]  # what the type hint cannot prevent at run time
        if action == "self-reference":
            result: dict[str, Any] = {"n": 1}
            result["self"] = result
            return result
        if action == "interrupting-result":
            return {"value": InterruptingText()}
        if action == "interrupting-error":
            raise InterruptingError
        if action == "limit-untold":
            raise LimitUntold("limited")
        if action == "surrogate":
            raise PermanentError("undecodable byte \udcff in the input")
        if action == "quote":
            raise ConnectionError(f"cannot connect with {arg}")
        if action and await self.redis.set(f"misbehaved:{stage}:{record_id}", 1, nx=True):
            await self.redis.incr(f"calls:{stage}")
            if action == "base-error":
                raise ProcessorBaseError("not an Exception")
            if action == "system-exit":
                raise SystemExit(3)
            if action == "keyboard-interrupt":
                raise KeyboardInterrupt
            if action == "unprintable":
                raise UnprintableError
            if action == "cancelled":
                raise asyncio.CancelledError  # its own, not the worker's: a failure like any other
            if action == "swallow-cancel":
                await self._swallow_cancellation(float(arg))
                await self.redis.set(f"late:{stage}:{record_id}", time.time())
                return {"late": True}
            if action == "stuck-thread":
                await self.run_blocking(_stuck, float(arg))
        return await super().process(record_id, user_id, data)

    async def _swallow_cancellation(self, seconds: float) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            # Ignored, as careless code does; an interrupting cancellation the give-up sends is ignored too.
            ends = time.monotonic() + seconds
            while (left := ends - time.monotonic()) > 0:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(left)


class MisbehavingBatchProcessor(BaseProcessor):
    """A batch processor: data["misbehave"] tuple-key gives that record a result JSON cannot hold; base-error makes
    the whole call raise a BaseException, the first time a batch holds such a record."""

    async def process_batch(self, records: Sequence[Record]) -> list[BatchResult]:
        stage = self.settings.service_name
        for r in records:
            first = r.data.get("misbehave") == "base-error" and await self.redis.set(
                f"misbehaved:{stage}:{r.record_id}", 1, nx=True
            )
            if first:
                raise ProcessorBaseError("the whole batch failed with a BaseException")
        await self.redis.rpush(f"batches:{stage}", len(records))
        return [
            {("a", "b"): 1} if r.data.get("misbehave") == "tuple-key" else {**r.data, "seen_by": stage}  # type: ignore[dict-item]
            for r in records
        ]


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
        _fail_quoting(self, "llm_call_failed", quoted, bool(data.get("permanent")))


def _fail_quoting(processor: BaseProcessor, event: str, quoted: str, permanent: bool) -> NoReturn:
    """Log `event` with the traceback of an error quoting `quoted`, then raise it: a PermanentError (DLQ) when
    `permanent`, else a transient one (retried)."""
    error = InvalidInputError(quoted) if permanent else ConnectionError(quoted)
    try:
        raise error
    except Exception:
        processor.logger.exception(event, detail=quoted)
        raise


class EnvQuotingProcessor(BaseProcessor):
    """Fails quoting `name=value` of every environment variable data["quote"] names, after logging the failure with
    its traceback. data["permanent"]: a PermanentError (DLQ), else a transient error (retried)."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        quoted = " ".join(f"{name}={os.environ.get(name)}" for name in data["quote"])
        _fail_quoting(self, "vendor_call_failed", quoted, bool(data.get("permanent")))


class KeyRefusingProcessor(BaseProcessor):
    """Refuses the first API key it is given for a record, as an LLM service refuses a revoked key (HTTP 401), and
    writes down every key it was given in the list `keys-given:{record_id}`."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        from phoenix.worker_runtime.billing import ApiKeyRejectedError, current_api_key

        if await self.redis.rpush(f"keys-given:{record_id}", current_api_key() or "") == 1:
            raise ApiKeyRejectedError("the LLM service refused the API key (HTTP 401)")
        return {"ok": True}


class StdlibLoggingProcessor(BaseProcessor):
    """Logs with the standard library's `logging`, as a processor's libraries do: a warning per record (and an info
    line, below the level stdlib lines are written from), then forwards it."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        logger = logging.getLogger("vendor.client")
        logger.info("connected to the vendor")
        logger.warning("vendor answered slowly for %s", record_id)
        return data


class TenantProbeProcessor(BaseProcessor):
    """Forwards each record; one with data["probe"] (keys of another tenant: `stream` and `entry` for XDEL and
    XRANGE, `key` for DEL) first tries them with the worker's own client and with a client of its own built from
    the pod's environment (what any processor can do), and forwards what Redis answered each, by exception class.
    The URL alone (no REDIS_USERNAME: the default user) is tried too."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        probe = data.get("probe")
        if not probe:
            return data
        own = redis.asyncio.Redis.from_url(
            os.environ["REDIS_URL"],
            username=os.environ.get("REDIS_USERNAME") or None,
            password=os.environ.get("REDIS_PASSWORD") or None,
        )
        bare = redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
        answers: dict[str, str] = {}
        try:
            for who, client in (("worker", self.redis), ("own", own), ("url", bare)):
                for command, call in (
                    ("XDEL", lambda c=client: c.xdel(probe["stream"], probe["entry"])),
                    ("XRANGE", lambda c=client: c.xrange(probe["stream"])),
                    ("DEL", lambda c=client: c.delete(probe["key"])),
                ):
                    try:
                        await call()
                        answers[f"{who} {command}"] = "done"
                    except redis.exceptions.RedisError as exc:
                        answers[f"{who} {command}"] = type(exc).__name__
        finally:
            await own.aclose()
            await bare.aclose()
        return {**data, "probes": answers}


class TenantStoreProcessor(BaseProcessor):
    """A final stage: counts each record it is given in its namespace's hash `phoenix:{<namespace>}:_delivered:
    counts`, and keeps the probes a record carries (TenantProbeProcessor) in `..._delivered:probes`."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        namespace = self.settings.key_namespace
        await self.redis.hincrby(shared_data_key(namespace, "delivered", "counts"), record_id, 1)
        if probes := data.get("probes"):
            await self.redis.hset(shared_data_key(namespace, "delivered", "probes"), record_id, json.dumps(probes))
        return None
