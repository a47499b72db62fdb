"""Property-based (issue 30): entries of any content, through a real worker on the real Valkey, each end committed or
dead-lettered once, nothing stays pending, and the worker stays up and keeps the stage flowing.

Field names and values are arbitrary: bytes that are not UTF-8, empty, over MAX_MESSAGE_BYTES, more than
MAX_ENTRY_FIELDS, names like the envelope's (record_id, data, retry_count ...) and ones that only look like them, a
name given twice in one XADD, `data` nested to any depth, numbers beyond float range or with thousands of digits,
NaN. The in-process Worker runs most examples (fast); one property drives a real `phoenix worker` process.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import example, given
from hypothesis import strategies as st

from phoenix.record_format import DATA_DEPTH_LIMIT
from phoenix.worker_runtime import jsoncodec
from phoenix.worker_runtime.processor import BaseProcessor
from phoenix.worker_runtime.worker import Worker
from tests.fixtures.eventually import wait_until
from tests.fixtures.fuzzing import FUZZ_SCALE, fuzz_settings
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.records import committed
from tests.fixtures.replies import raw_stream_entries
from tests.fixtures.sample_stage import DLQ, IN, OUT, idle
from tests.fixtures.workers import WorkerPool, WorkerProcess

pytestmark = pytest.mark.fuzz

MAX_BYTES = 16384  # MAX_MESSAGE_BYTES of these workers: "huge" is cheap to write, 3,000 levels of objects fit
MAX_FIELDS = 16  # MAX_ENTRY_FIELDS of these workers: "many" too
LIMITS: dict[str, Any] = {"max_message_bytes": MAX_BYTES, "max_entry_fields": MAX_FIELDS}
ENVELOPE = [
    b"record_id",
    b"user_id",
    b"data",
    b"retry_count",
    b"first_failed_at",
    b"last_error",
    b"original_id",
    b"traceparent",
    b"entered_at",
    b"deadline",
    b"packed_fields",
]
LOOKALIKES = [b"record_id ", b"Record_ID", b"record_id\x00", b"\xffdata", b"data\n", b"", b"user_id\xc3"]


class EchoProcessor(BaseProcessor):
    """Forwards what it was given: the record's data goes through the output encoder whatever it holds."""

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any] | None:
        return {**data, "echoed": True}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def nested(depth: int, kind: str) -> bytes:
    """An object holding lists or objects nested `depth` levels."""
    inner = "[" * depth + "]" * depth if kind == "[" else '{"a":' * depth + "1" + "}" * depth
    return b'{"deep": ' + inner.encode() + b"}"


data_values = st.one_of(
    st.dictionaries(st.text(max_size=8), json_values, max_size=5).map(lambda d: json.dumps(d).encode()),
    json_values.map(lambda v: json.dumps(v).encode()),  # a JSON value that may be no object
    # Around the limits: orjson's writer (254), the json module's recursion (near 940), DATA_DEPTH_LIMIT (1024).
    st.tuples(
        st.sampled_from([2, 254, 256, 940, 1022, 1023, 1024, 3000]) | st.integers(1, 3000), st.sampled_from("[{")
    ).map(lambda t: nested(*t)),
    st.sampled_from(
        [
            b'{"n": 1e999}',
            b'{"n": -1e400, "m": NaN, "i": -Infinity}',
            b'{"n": ' + b"9" * 400 + b"}",
            b'{"n": 1' + b"0" * 5000 + b"}",  # past Python's 4,300 digits of an int
            b'{"a": 1, "a": {"a": [1, {"a": 2}]}}',
            b'{"s": "\\ud800", "q": "]]]\\"[[["}',
            b'{"x": "' + b"[" * 600 + b'"}',  # brackets in a string nest nothing
        ]
    ),
    st.binary(max_size=60),
)
values = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20).map(str.encode),
    data_values,
    st.sampled_from([b"", b"-1", b"nan", b"inf", b"1e400", b"9" * 30, b"9" * 5000, b"00-1-2-01"]),
    st.integers(MAX_BYTES // 2, 2 * MAX_BYTES).map(lambda n: b"x" * n),
)
names = st.one_of(st.sampled_from(ENVELOPE + LOOKALIKES), st.binary(max_size=12), st.text(max_size=8).map(str.encode))
# How the record id is given: unique (most entries, so that they reach the processor), or hostile.
RECORD_IDS = st.sampled_from(["unique"] * 4 + ["missing", "empty", "not-utf8", "huge"])
_serial = itertools.count()


@st.composite
def entries(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    """One entry's field-value pairs, in XADD order (a name may come twice: the last one counts)."""
    pairs = draw(st.lists(st.tuples(names, values), max_size=6))
    if draw(st.sampled_from([True, True, False])):
        pairs.append((b"data", draw(data_values)))
    if many := draw(st.sampled_from([0, 0, 0, MAX_FIELDS - 3, MAX_FIELDS + 10])):
        pairs += [(b"f%d" % i, b"v") for i in range(many)]
    how = draw(RECORD_IDS)
    pairs = [(name, value) for name, value in pairs if name != b"record_id"] if how == "missing" else pairs
    if how != "missing":
        record_id = {
            "unique": f"r{next(_serial)}-{draw(st.text(max_size=6))}".encode(),
            "empty": b"",
            "not-utf8": b"r\xff\xfe",
            "huge": b"r" * (MAX_BYTES + 1),
        }[how]
        pairs.append((b"record_id", record_id))
    return pairs


async def _add(raw: aioredis.Redis, pairs: list[tuple[bytes, bytes]]) -> str:
    """XADD the pairs as given, a name twice included (redis-py's xadd takes a dict)."""
    flat = list(itertools.chain.from_iterable(pairs or [(b"k", b"v")]))  # an entry has one field at least
    entry_id = await raw.execute_command("XADD", IN, "*", *flat)
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


def _record_id(pairs: list[tuple[bytes, bytes]]) -> str | None:
    """The record id the worker reads (the last pair of the name), if it is text."""
    given = [value for name, value in pairs if name == b"record_id"]
    try:
        return given[-1].decode() if given else None
    except UnicodeDecodeError:
        return None


async def _each_ended_once(redis: aioredis.Redis, raw: aioredis.Redis, batch: list[list[tuple[bytes, bytes]]]) -> None:
    """Add `batch`, then a plain record; once the input is drained: every entry committed (its record's marker
    names it, one output entry each) or dead-lettered, one DLQ entry each, nothing pending, no retry waiting."""
    dead_before, out_before = await redis.xlen(DLQ), await redis.xlen(OUT)
    sentinel = f"ok-{next(_serial)}"
    batch = [*batch, [(b"record_id", sentinel.encode()), (b"data", b"{}")]]
    added = [(await _add(raw, pairs), pairs) for pairs in batch]
    await wait_until(lambda: committed(redis, "s", sentinel), "the plain record behind the hostile ones", 20)
    await wait_until(lambda: idle(redis), "input drained", 20)
    done, dead = [], []
    for entry_id, pairs in added:
        record_id = _record_id(pairs)
        if record_id and await committed(redis, "s", record_id) == entry_id:
            done.append(record_id)
        elif b"original_id" not in dict(pairs):  # else the dead letter keeps the one the entry gave
            dead.append(entry_id)
    forwarded = [fields[b"record_id"].decode() for _, fields in (await raw_stream_entries(raw, OUT))[out_before:]]
    assert sorted(forwarded) == sorted(done)
    dead_letters = (await raw_stream_entries(raw, DLQ))[dead_before:]
    assert len(dead_letters) == len(added) - len(done)
    assert set(dead) <= {fields[b"original_id"].decode(errors="replace") for _, fields in dead_letters}


@pytest.fixture
async def worker(redis_url: str, redis: aioredis.Redis) -> AsyncIterator[Worker]:
    """One in-process worker for every example of a property (a worker per example would cost most of the time)."""
    async with running_worker(redis_url, processor=EchoProcessor, output_queue=OUT, concurrency=8, **LIMITS) as w:
        yield w


# What the review measured on the code before this suite (issue 30): each ended the intake, and the worker.
MEASURED = [
    [(b"record_id", b"lists"), (b"data", b"[" * 3000 + b"]" * 3000)],
    [(b"record_id", b"objects"), (b"data", nested(3000, "{"))],
]


@pytest.mark.timeout(30 * FUZZ_SCALE)
@fuzz_settings(25)
@given(batch=st.lists(entries(), min_size=1, max_size=6))
@example(batch=MEASURED)
async def test_any_entry_ends_committed_or_dead_lettered_and_the_worker_stays_up(
    worker: Worker, redis: aioredis.Redis, raw_redis: aioredis.Redis, batch: list[list[tuple[bytes, bytes]]]
) -> None:
    await _each_ended_once(redis, raw_redis, batch)
    assert await drained(worker) and not worker.stop_requested
    assert worker.alive()[0]


@pytest.fixture
def worker_process(workers: WorkerPool, redis: aioredis.Redis) -> Iterator[WorkerProcess]:
    env = {"OUTPUT_QUEUE": OUT, "CONCURRENCY": "8", "MAX_MESSAGE_BYTES": str(MAX_BYTES)}
    yield workers.start("s", processor="tests.test_fuzz_entries:EchoProcessor", MAX_ENTRY_FIELDS=str(MAX_FIELDS), **env)


@pytest.mark.timeout(60 * FUZZ_SCALE)
@fuzz_settings(4)
@given(batch=st.lists(entries(), min_size=5, max_size=15))
async def test_a_phoenix_worker_process_takes_any_entry_and_stays_up(
    worker_process: WorkerProcess,
    redis: aioredis.Redis,
    raw_redis: aioredis.Redis,
    batch: list[list[tuple[bytes, bytes]]],
) -> None:
    await _each_ended_once(redis, raw_redis, batch)
    assert worker_process.alive
    assert not [e for e in worker_process.events() if e["level"] == "error"]


def _depth(value: object) -> int:
    """How deep a parsed value nests lists and dicts, level by level (a recursion would stop at Python's limit)."""
    depth, level = 0, [value]
    while level := [v for v in level if isinstance(v, list | dict)]:
        depth += 1
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v)]
    return depth


tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\ax\u00e9'), max_size=8)
deep_values = st.recursive(
    st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=30,
)


@fuzz_settings(300)
@given(value=deep_values, indent=st.sampled_from([None, 1]))
def test_nesting_is_the_depth_json_reads(value: object, indent: int | None) -> None:
    """Brackets inside strings (escaped quotes and backslashes around them) nest nothing; whitespace changes
    nothing."""
    text = json.dumps(value, indent=indent, ensure_ascii=False).encode()
    assert jsoncodec.nesting(text) == _depth(json.loads(text))


@fuzz_settings(40)
@given(depth=st.integers(2, 2 * DATA_DEPTH_LIMIT), kind=st.sampled_from("[{"), odd=st.booleans())
@example(depth=DATA_DEPTH_LIMIT, kind="[", odd=True)
@example(depth=DATA_DEPTH_LIMIT + 1, kind="{", odd=True)
def test_data_reads_and_results_write_to_the_depth_limit_and_no_deeper(depth: int, kind: str, odd: bool) -> None:
    """Either way orjson goes (`odd`: a number only the json module reads exactly, or a key orjson cannot write),
    data within DATA_DEPTH_LIMIT reads, and a result within it writes; deeper is DataTooDeep."""
    text = nested(depth - 1, kind).replace(b'"deep"', b'"n": 12345678901234567890, "deep"' if odd else b'"deep"')
    if depth > DATA_DEPTH_LIMIT:
        with pytest.raises(jsoncodec.DataTooDeep):
            jsoncodec.loads(text)
        return
    value = jsoncodec.loads(text)
    assert _depth(value) == depth
    if odd:
        value[1] = "a key orjson cannot write"
    assert _depth(json.loads(jsoncodec.dumps(value, str))) == depth
