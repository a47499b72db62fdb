"""Property-based (issue 30): whatever a processor returns or raises, through process and process_batch, each record
ends committed or dead-lettered once (a transient failure retried first), nothing stays pending, and the worker
stays up. The real Worker in-process on the real Valkey, with a processor generated per example.

Results of any shape: None, JSON, nested past what either encoder writes, megabytes, types JSON has none for,
objects whose str() raises, cycles, what is no dict at all. Exceptions of any type: BaseException subclasses
(SystemExit, KeyboardInterrupt, a CancelledError of the processor's own), PermanentError subclasses, ones whose
str() raises, huge or unencodable messages, odd `max_attempts`.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given
from hypothesis import strategies as st

from phoenix.worker_runtime.processor import BaseProcessor, BatchResult, PermanentError, Record, RecordNotFoundError
from phoenix.worker_runtime.worker import Worker
from tests.fixtures.eventually import wait_until
from tests.fixtures.fuzzing import FUZZ_SCALE, fuzz_settings
from tests.fixtures.inprocess import running_worker
from tests.fixtures.records import committed
from tests.fixtures.replies import stream_entries
from tests.fixtures.sample_stage import DLQ, OUT, add, idle

pytestmark = pytest.mark.fuzz

# A transient failure is retried once, then dead-lettered: both ways of a failure in one example. The circuit never
# opens: most examples fail (it would idle the worker for CIRCUIT_RESET_TIMEOUT, as it is meant to).
SETTINGS: dict[str, Any] = {
    "output_queue": OUT,
    "concurrency": 8,
    "max_attempts": 2,
    "circuit_failure_threshold": 1_000_000,
}


@dataclass(frozen=True)
class Behaviour:
    """What the generated processor does for one record: `make` builds a fresh result or exception per call (a
    cycle, an object), `raises` says which it is."""

    name: str
    make: Callable[[], Any]
    raises: bool = False
    permanent: bool = False

    def __repr__(self) -> str:  # what hypothesis prints of a falsifying example
        return f"{'raise' if self.raises else 'return'} {self.name}"


BEHAVIOURS: dict[str, Behaviour] = {}  # by record id; the examples fill it, the processors read it
_serial = itertools.count()


class GeneratedProcessor(BaseProcessor):
    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        behaviour = BEHAVIOURS[record_id]
        if behaviour.raises:
            raise behaviour.make()
        result: dict[str, Any] | None = behaviour.make()
        return result


class GeneratedBatchProcessor(BaseProcessor):
    """Each record's behaviour as its slot of the batch's results; a record whose behaviour is `raise` in a batch of
    one makes the whole call raise."""

    async def process_batch(self, records: Sequence[Record]) -> list[BatchResult]:
        behaviours = [BEHAVIOURS[r.record_id] for r in records]
        if len(behaviours) == 1 and behaviours[0].raises:
            raise behaviours[0].make()
        return [b.make() for b in behaviours]


class StrRaises:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __str__(self) -> str:
        raise self.error

    __repr__ = __str__


class BaseFailure(BaseException):
    """A BaseException of a library's own."""


class BadInput(PermanentError):
    pass


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class UnprintableBaseError(BaseException):
    def __str__(self) -> str:
        raise KeyboardInterrupt


class Limited(Exception):
    def __init__(self, max_attempts: object) -> None:
        super().__init__(f"limited to {max_attempts!r}")
        self.max_attempts = max_attempts


class LimitRaises(Exception):
    @property
    def max_attempts(self) -> int:
        raise ValueError("no limit to tell")


def _nest(depth: int, kind: str) -> dict[str, Any]:
    inner: Any = 1
    for _ in range(depth):
        inner = [inner] if kind == "list" else {"a": inner}
    return {"deep": inner}


def _cycle() -> dict[str, Any]:
    result: dict[str, Any] = {"a": [1]}
    result["a"].append(result)
    return result


class Mapping(dict):  # a dict subclass is a dict to the runtime
    pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)
DEPTHS = st.sampled_from([1, 100, 253, 254, 255, 600, 900, 1000, 1100, 3000])
results = st.one_of(
    st.just(Behaviour("None", lambda: None)),
    st.dictionaries(st.text(max_size=8), json_values, max_size=5).map(lambda d: Behaviour(f"json {d!r}", lambda: d)),
    st.tuples(DEPTHS, st.sampled_from(["list", "dict"])).map(lambda t: Behaviour(f"nested {t}", lambda: _nest(*t))),
    st.integers(0, 2_000_000).map(lambda n: Behaviour(f"a string of {n} bytes", lambda: {"blob": "x" * n})),
    st.sampled_from(
        [
            Behaviour(
                "non-JSON types", lambda: {"set": {1}, "bytes": b"\xff", "obj": object(), "at": datetime.now(UTC)}
            ),
            Behaviour(
                "numbers", lambda: {"c": 1j, "d": Decimal("1.10"), "big": 2**70, "nan": math.nan, "inf": -math.inf}
            ),
            Behaviour("keys no str", lambda: {1: "a", (1, 2): "b", None: "c"}),
            Behaviour("str raises", lambda: {"x": StrRaises(RuntimeError("no"))}),
            Behaviour("str raises BaseException", lambda: {"x": StrRaises(KeyboardInterrupt())}),
            Behaviour("lone surrogate", lambda: {"s": "\ud800", "\udcff": 1}),
            Behaviour("cycle", _cycle),
            Behaviour("dict subclass", lambda: Mapping(a=1)),
            Behaviour("a list", lambda: [1, 2]),
            Behaviour("a str", lambda: "done"),
            Behaviour("an object", object),
            Behaviour("an exception as result", lambda: RuntimeError("returned, not raised")),
        ]
    ),
)
exceptions = st.one_of(
    st.sampled_from(
        [
            Behaviour("RuntimeError", lambda: RuntimeError("transient"), raises=True),
            Behaviour("KeyError", lambda: KeyError("k"), raises=True),
            Behaviour("MemoryError", MemoryError, raises=True),
            Behaviour("RecursionError", lambda: RecursionError("deep"), raises=True),
            Behaviour("SystemExit", lambda: SystemExit(3), raises=True),
            Behaviour("KeyboardInterrupt", KeyboardInterrupt, raises=True),
            Behaviour("GeneratorExit", GeneratorExit, raises=True),
            Behaviour("its own CancelledError", asyncio.CancelledError, raises=True),
            Behaviour("a BaseException subclass", lambda: BaseFailure("base"), raises=True),
            Behaviour("str raises", UnprintableError, raises=True),
            Behaviour("str raises BaseException", UnprintableBaseError, raises=True),
            Behaviour("max_attempts raises", LimitRaises, raises=True),
            Behaviour("bytes message", lambda: ValueError(b"\xff\xfe"), raises=True),
            Behaviour("surrogates", lambda: ValueError("\ud800\udfff"), raises=True),
            Behaviour("RecordNotFoundError", lambda: RecordNotFoundError("gone"), raises=True, permanent=True),
            Behaviour("BadInput", lambda: BadInput("bad"), raises=True, permanent=True),
            Behaviour(
                "str raises, permanent",
                lambda: type("Odd", (BadInput,), {"__str__": UnprintableError.__str__})(),
                raises=True,
                permanent=True,
            ),
        ]
    ),
    st.integers(0, 3_000_000).map(
        lambda n: Behaviour(f"a message of {n} bytes", lambda: ValueError("m" * n), raises=True)
    ),
    st.sampled_from([0, -1, 1, "3", 10**100, None, 1.5]).map(
        lambda limit: Behaviour(f"max_attempts={limit!r}", lambda: Limited(limit), raises=True)
    ),
)
behaviours = st.lists(st.one_of(results, exceptions), min_size=1, max_size=6)


async def _each_ended_once(redis: aioredis.Redis, batch: list[Behaviour]) -> None:
    """A record per behaviour; once the input is drained and no retry waits: each committed or dead-lettered, one
    DLQ entry each (a permanent failure named by its type), one output entry per commit."""
    dead_before, out_before = await redis.xlen(DLQ), await redis.xlen(OUT)
    records = [f"p{next(_serial)}" for _ in batch]
    BEHAVIOURS.update(zip(records, batch, strict=True))
    for record_id in records:
        await add(redis, record_id)
    await wait_until(lambda: idle(redis), "every record settled", 30)
    letters = (await stream_entries(redis, DLQ))[dead_before:]
    dead = {f["record_id"]: f for _, f in letters}
    forwarded = [f["record_id"] for _, f in (await stream_entries(redis, OUT))[out_before:]]
    assert len(dead) == len(letters), letters  # one dead letter per record at most
    for record_id, behaviour in zip(records, batch, strict=True):
        done = await committed(redis, "s", record_id)
        assert bool(done) != (record_id in dead), (behaviour, done, dead.get(record_id))
        if behaviour.permanent:
            assert dead[record_id]["error_type"] not in ("UnserializableResult", "RetriesExhausted"), dead[record_id]
        if behaviour.name == "None":
            assert done
    assert sorted(forwarded) == sorted(r for r in records if r not in dead and BEHAVIOURS[r].name != "None")


@pytest.fixture(params=[GeneratedProcessor, GeneratedBatchProcessor], ids=["process", "process_batch"])
async def worker(request: pytest.FixtureRequest, redis_url: str, redis: aioredis.Redis) -> AsyncIterator[Worker]:
    async with running_worker(redis_url, processor=request.param, **SETTINGS) as w:
        yield w


@pytest.mark.timeout(60 * FUZZ_SCALE)  # a retry waits RETRY_BASE_SECONDS: about 0.5 s an example
@fuzz_settings(18)
@given(batch=behaviours)
async def test_whatever_a_processor_returns_or_raises_each_record_ends_once(
    worker: Worker, redis: aioredis.Redis, batch: list[Behaviour]
) -> None:
    await _each_ended_once(redis, batch)
    assert worker.alive()[0] and not worker.in_flight
