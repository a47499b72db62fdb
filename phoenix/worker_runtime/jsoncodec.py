"""JSON on the hot path: orjson, with the standard library wherever orjson would read or write differently.

A record's data is decoded and its result encoded once per message, and at LOG_LEVEL=info every message logs
a line: with the json module these were the largest costs of a no-op stage. orjson does each in a twentieth of
the time. Where the two disagree, the json module decides, so no stage sees its data change:
- numbers of 19 digits or more: orjson reads integers past 64 bits as floats (losing digits);
- input orjson refuses but json reads (NaN, Infinity, lone surrogates): json reads it, or names the error;
- output orjson cannot write (integers past 64 bits, dict keys that are not str): json writes it.
What orjson writes differently is in the README's Messages section (NaN becomes null, datetimes RFC 3339).

Nesting has one explicit limit, MAX_DATA_DEPTH (`nests_deeper`), checked before either parser reads: orjson stops
at 1024 levels, but the json module stops at Python's recursion limit less the stack below it, with a
RecursionError that once ended a worker's intake.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import orjson

# Every digit mapped to 0, so that a number of 19 digits or more shows as a run of 19 zeros: a C-speed check
# (bytes.translate, then a substring search), where a regular expression cost more than the parse on a page of text.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
# For nests_deeper: every byte but the brackets deleted, and each bracket's step in depth.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = tuple(1 if b in b"[{" else -1 for b in range(256))


def loads(data: bytes) -> Any:
    """Parse UTF-8 JSON as Redis returns it; raises json.JSONDecodeError (a ValueError) with the json module's
    message."""
    if _LONG_NUMBER not in data.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json either reads it or raises its own, familiar error
    return json.loads(data)


def nests_deeper(data: bytes, limit: int) -> bool:
    """True when the JSON text nests lists and objects deeper than `limit`, brackets inside strings not counted.

    Data with no more openers than `limit` cannot be deeper, which two byte counts tell (the one cost on the hot
    path); the rest is C-speed passes, linear in the size: escapes out, so that every quote left delimits a string,
    the strings out, then the brackets' running depth."""
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    plain = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[::2])
    return max(accumulate(map(_STEP.__getitem__, outside.translate(None, _NOT_BRACKETS))), default=0) > limit


def dumps(obj: Any, default: Callable[[Any], Any]) -> str:
    """Compact JSON; `default` turns what JSON has no type for into something it has (str, repr)."""
    try:
        return orjson.dumps(obj, default=default).decode()
    except TypeError:  # orjson.JSONEncodeError: a 65-bit integer, a non-str key
        return json.dumps(obj, default=default, separators=(",", ":"))
