"""JSON on the hot path: orjson, with the standard library wherever orjson would read or write differently.

A record's data is decoded and its result encoded once per message, and at LOG_LEVEL=info every message logs
a line: with the json module these were the largest costs of a no-op stage. orjson does each in a twentieth of
the time. Where the two disagree, the json module decides, so no stage sees its data change:
- numbers of 19 digits or more: orjson reads integers past 64 bits as floats (losing digits);
- input orjson refuses but json reads (NaN, Infinity, lone surrogates): json reads it, or names the error;
- output orjson cannot write (integers past 64 bits, dict keys that are not str): json writes it.
What orjson writes differently is in docs/guarantees.md's Messages section (NaN becomes null, datetimes RFC 3339).

Nesting has one limit, DATA_DEPTH_LIMIT (1,024 levels of lists and objects), both ways: orjson's own. The json
module recurses once a level, and under Python 3.11 counts that against the interpreter's recursion limit, less the
stack below the call: data orjson read was refused as it, with a RecursionError that once ended a worker's
intake, and results orjson cannot write (deeper than 254 levels) stopped near 940. Where it reads or writes, it is
given the room, and told the limit (`nesting`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

import orjson

from phoenix.errors import PhoenixError
from phoenix.record_format import DATA_DEPTH_LIMIT

# Every digit mapped to 0, so that a number of 19 digits or more shows as a run of 19 zeros: a C-speed check
# (bytes.translate, then a substring search), where a regular expression cost more than the parse on a page of text.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
# For nesting: every byte but the brackets deleted, and each bracket's step in depth.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = tuple(1 if b in b"[{" else -1 for b in range(256))


class DataTooDeep(PhoenixError, ValueError):
    """JSON nested deeper than DATA_DEPTH_LIMIT, read or to be written."""

    def __init__(self) -> None:
        super().__init__(f"nests deeper than {DATA_DEPTH_LIMIT} levels")


def loads(data: bytes) -> Any:
    """Parse UTF-8 JSON as Redis returns it; raises json.JSONDecodeError (a ValueError) with the json module's
    message, DataTooDeep past DATA_DEPTH_LIMIT (orjson refuses that itself; the json module is told)."""
    if _LONG_NUMBER not in data.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json either reads it or raises its own, familiar error
    if nesting(data) > DATA_DEPTH_LIMIT:
        raise DataTooDeep
    with _recursion_room():
        return json.loads(data)


def dumps(obj: Any, default: Callable[[Any], Any]) -> str:
    """Compact JSON; `default` turns what JSON has no type for into something it has (str, repr). Raises
    DataTooDeep past DATA_DEPTH_LIMIT, what the next stage would refuse to read."""
    try:
        return orjson.dumps(obj, default=default).decode()
    except TypeError:  # orjson.JSONEncodeError: a 65-bit integer, a non-str key, deeper than 254 levels
        pass
    try:
        with _recursion_room():
            text = json.dumps(obj, default=default, separators=(",", ":"))
    except RecursionError:  # deeper than the room given: far past the limit
        raise DataTooDeep from None
    if nesting(text.encode()) > DATA_DEPTH_LIMIT:
        raise DataTooDeep
    return text


def nesting(data: bytes) -> int:
    """How deep the JSON text nests lists and objects, brackets inside strings not counted: C-speed passes, linear
    in the size (escapes out, so that every quote left delimits a string; the strings out; the running depth)."""
    plain = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[::2])
    return max(accumulate(map(_STEP.__getitem__, outside.translate(None, _NOT_BRACKETS))), default=0)


@contextlib.contextmanager
def _recursion_room() -> Iterator[None]:
    """Room for the json module's DATA_DEPTH_LIMIT levels over the stack the call starts on (Python 3.11 counts
    them against the recursion limit; later versions give C code a limit of its own, far above). The event loop's
    thread runs it, whose stack holds that many levels of the module's C reader many times over."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + DATA_DEPTH_LIMIT + 100)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)
