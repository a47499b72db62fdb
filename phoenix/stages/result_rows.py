"""The grammar of one lab result row, as real reports print it.

A row is a test name followed by its value, flag, unit and reference range in any order (`Glucose, Fasting 131 H
mg/dL 70-99`, `Hemoglobin A1c: 7.4 % (4.0 - 5.6)`, `CRP <0.5 mg/L 0.0-5.0`). Table rows arrive with their cells
separated by tabs (pdf_text.py puts a tab where the page has a column gap); when a header row names the columns, the
cells of the rows under it are read by column, so columns the grammar does not know (previous result, lab code) are
skipped instead of spoiling the row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from phoenix.stages.models import Comparator, Flag

CELL_SEPARATOR = "\t"

_NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d*\.\d+|\d+"
_COMPARATOR = r"<=|>=|≤|≥|<|>"
_DASH = r"\s*(?:-|\u2013|\u2014|\bto\b)\s*"  # hyphen, en dash, em dash, "to"
_END = r"(?=\s|$)"
_RANGE_LABEL = r"(?:(?:ref(?:erence)?\.?(?:\s+(?:range|interval))?|normal\s+range)\s*:?\s*)?"
RANGE = re.compile(
    rf"(?i:{_RANGE_LABEL})[(\[]?\s*(?:(?P<low>{_NUMBER}){_DASH}(?P<high>{_NUMBER})"
    rf"|(?P<bound_op>{_COMPARATOR})\s*(?P<bound>{_NUMBER}))\s*[)\]]?{_END}"
)
# A flag printed right after the value ("131H", "131 (H)" is a separate token) counts as the row's flag.
VALUE = re.compile(rf"(?P<op>{_COMPARATOR})?\s*(?P<number>{_NUMBER})(?P<flag>HH|LL|H|L)?{_END}")
FLAG_WORDS: dict[str, Flag | None] = {
    "h": "H",
    "hh": "H",
    "high": "H",
    "critical high": "H",
    "l": "L",
    "ll": "L",
    "low": "L",
    "critical low": "L",
    "n": "normal",
    "normal": "normal",
    # No direction: the range decides between H and L.
    "a": None,
    "aa": None,
    "abnormal": None,
    "critical": None,
}
FLAG = re.compile(
    r"\(?(?P<word>HH|LL|H|L|AA|A|N|(?i:critical\s+high|critical\s+low|critical|high|low|abnormal|normal))\)?" + _END
)
# Units: `mg/dL`, `%`, `x10E3/uL`, `10*3/uL`, `10^9/L`, `mL/min/1.73m2`, `mL/min/{1.73_m2}`.
UNIT = re.compile(r"(?P<unit>(?:x\s?)?10[\^*Ee]\d+/[A-Za-zµμ]+|[A-Za-zµμ%][\w%/^*.{}\-²³µμ]*)" + _END)
# Without a range or flag, a unit alone must look like a lab unit: prose has "3 months" and "6 mm".
LAB_UNIT = re.compile(r"[/%^*]|^(?:fL|pg|mmHg|ratio|sec|IU|U|mEq|index)$", re.IGNORECASE)

Role = Literal["name", "value", "flag", "unit", "range", "other"]
HEADER_WORDS: dict[str, Role] = {
    "test": "name",
    "tests": "name",
    "test name": "name",
    "analyte": "name",
    "component": "name",
    "parameter": "name",
    "investigation": "name",
    "result": "value",
    "results": "value",
    "value": "value",
    "your value": "value",
    "current result": "value",
    "current result and flag": "value",
    "result and flag": "value",
    "flag": "flag",
    "flags": "flag",
    "abnormal flag": "flag",
    "status": "flag",
    "unit": "unit",
    "units": "unit",
    "reference range": "range",
    "reference interval": "range",
    "ref range": "range",
    "ref. range": "range",
    "reference": "range",
    "normal range": "range",
    "range": "range",
    "reference values": "range",
    "standard range": "range",
}
# What each column may hold; an unknown column ("Previous result", "Lab") is skipped.
_ALLOWED: dict[Role, frozenset[str]] = {
    "value": frozenset({"value", "flag"}),
    "flag": frozenset({"flag"}),
    "unit": frozenset({"unit"}),
    "range": frozenset({"range", "unit"}),
}


@dataclass
class ResultRow:
    name: str
    value: float
    comparator: Comparator | None = None
    unit: str | None = None
    reference_range: str | None = None
    printed_flag: Flag | None = None  # H, L or normal as printed; None when absent or without direction
    abnormal: bool = False  # printed "A", "Abnormal" or "Critical"


@dataclass
class _Tail:
    """The items found after a name; each at most once."""

    value: tuple[float, Comparator | None] | None = None
    flag: tuple[Flag | None, bool] | None = None  # (direction, printed as abnormal without one)
    unit: str | None = None
    range: str | None = None

    def add(self, kind: str, item: object) -> bool:
        if getattr(self, kind) is not None:
            return False
        setattr(self, kind, item)
        return True


def canonical_range(match: re.Match[str]) -> str:
    """`(4.0 - 5.6)`, `Ref: 4.0 to 5.6` -> `4.0-5.6`; `≥ 40` -> `>=40`: one spelling for every reader."""
    if match["low"]:
        return f"{match['low']}-{match['high']}"
    return f"{_comparator(match['bound_op'])}{match['bound']}"


def _number(text: str) -> float:
    return float(text.replace(",", ""))


_COMPARATORS: dict[str, Comparator] = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "≤": "<=", "≥": ">="}


def _comparator(op: str | None) -> Comparator | None:
    return _COMPARATORS[op] if op else None


def _flag(word: str) -> tuple[Flag | None, bool]:
    direction = FLAG_WORDS[" ".join(word.lower().split())]
    return direction, direction is None


def parse_tail(text: str, allowed: frozenset[str] | None = None) -> _Tail | None:
    """Read value, flag, unit and range in any order; None unless every character is one of them."""
    tail, position = _Tail(), 0
    while position < len(text):
        if text[position].isspace():
            position += 1
            continue
        match, kind, item = _next_item(text, position, tail, allowed)
        if match is None or (allowed is not None and kind not in allowed) or not tail.add(kind, item):
            return None
        if kind == "value" and match["flag"] and not tail.add("flag", _flag(match["flag"])):
            return None
        position = match.end()
    return tail


def _next_item(
    text: str, position: int, tail: _Tail, allowed: frozenset[str] | None
) -> tuple[re.Match[str] | None, str, object]:
    # The first number is the value, even with a comparator (`<0.5`), unless the column holds no value;
    # "70-99" is never a value.
    value_expected = tail.value is None and (allowed is None or "value" in allowed)
    if (match := RANGE.match(text, position)) and (match["low"] or not value_expected):
        return match, "range", canonical_range(match)
    if value_expected and (match := VALUE.match(text, position)):
        return match, "value", (_number(match["number"]), _comparator(match["op"]))
    if match := FLAG.match(text, position):
        return match, "flag", _flag(match["word"])
    if match := UNIT.match(text, position):
        return match, "unit", match["unit"]
    return None, "", None


def _row(name: str, tail: _Tail | None) -> ResultRow | None:
    if tail is None or tail.value is None or not _is_result(tail) or not _is_name(name):
        return None
    direction, abnormal = tail.flag or (None, False)
    value, comparator = tail.value
    return ResultRow(name, value, comparator, tail.unit, tail.range, direction, abnormal)


def _is_result(tail: _Tail) -> bool:
    """A value with a range, a flag or a lab unit: a bare number with a word after it is prose."""
    return tail.value is not None and (
        tail.range is not None or tail.flag is not None or bool(tail.unit and LAB_UNIT.search(tail.unit))
    )


def _is_name(name: str) -> bool:
    # A name ending in a number ("Glucose 131") means two numbers before the unit: ambiguous, not a name.
    return (
        bool(re.match(r"[A-Za-z0-9]", name))
        and sum(c.isalpha() for c in name) >= 2
        and not VALUE.fullmatch(name.split()[-1])
    )


def parse_row(line: str) -> ResultRow | None:
    """A result row without a header: the name is the shortest prefix after which the rest parses."""
    text = " ".join(line.split())
    for split in re.finditer(r"\s", text):
        name = text[: split.start()].rstrip(":").strip()
        if row := _row(name, parse_tail(text[split.end() :])):
            return row
    return None


def header_roles(cells: Sequence[str]) -> list[Role] | None:
    """The column roles of a header row (`Test | Result | Flag | Units | Reference Interval`), else None."""
    if len(cells) < 3 or any(re.search(r"\d", cell) for cell in cells):
        return None
    roles: list[Role] = [HEADER_WORDS.get(" ".join(cell.lower().split()), "other") for cell in cells]
    return roles if roles[0] == "name" and "value" in roles else None


def parse_table_row(cells: Sequence[str], roles: Sequence[Role]) -> ResultRow | None:
    """Cells read under their header. Empty cells are not printed, so a cell may belong to a later column."""
    assignment = _align(cells, roles, 0, 0)
    if assignment is None:
        return None
    tail = _Tail()
    for cell, role in zip(cells[1:], assignment[1:], strict=True):
        if role == "other":
            continue
        found = parse_tail(cell, _ALLOWED[role])
        if found is None or not all(
            getattr(found, kind) is None or tail.add(kind, getattr(found, kind)) for kind in _ALLOWED[role]
        ):
            return None
    return _row(cells[0].rstrip(":").strip(), tail)


def _align(cells: Sequence[str], roles: Sequence[Role], i: int, j: int) -> list[Role] | None:
    """Roles for cells[i:] from roles[j:], in order; a column may be skipped unless it is the name or the value.

    A known column takes the cell if it fits; an unknown one is tried empty first, so it never takes a unit.
    """
    if i == len(cells):
        return [] if all(role not in ("name", "value") for role in roles[j:]) else None
    if len(roles) - j < len(cells) - i:
        return None
    role = roles[j]

    def take() -> list[Role] | None:
        rest = _align(cells, roles, i + 1, j + 1) if _fits(cells[i], role) else None
        return None if rest is None else [role, *rest]

    def skip() -> list[Role] | None:
        return None if role in ("name", "value") else _align(cells, roles, i, j + 1)

    for attempt in (skip, take) if role == "other" else (take, skip):
        if (found := attempt()) is not None:
            return found
    return None


def _fits(cell: str, role: Role) -> bool:
    if role == "name":
        return _is_name(cell)
    if role == "other":
        return True
    return parse_tail(cell, _ALLOWED[role]) is not None


_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b\d{1,2}:\d{2}\b")
# Not inside a longer chain of numbers: "24-118-0042" is a specimen id.
_RANGE_LIKE = re.compile(
    rf"(?<![\d-])(?:{_NUMBER}){_DASH}(?:{_NUMBER})(?![\d-])|(?:{_COMPARATOR})\s*(?:{_NUMBER})|\S[/%^]|%"
)


def looks_like_result(line: str) -> bool:
    """A name, a number and a range or lab unit, in a short line that is not a sentence: worth reporting when
    it does not parse, because a result lost without a word is worse than no extraction."""
    text = " ".join(_DATE.sub(" ", line).split())
    if text and not re.match(r"[A-Za-z]", text):
        # A row that lost its name (printed elsewhere on the page) still shows its value, unit and range.
        return (tail := parse_tail(text)) is not None and _is_result(tail)
    return (
        bool(re.match(r"[A-Za-z]", text))
        and bool(re.search(r"\d", text))
        and bool(_RANGE_LIKE.search(text))
        and len(text.split()) <= 14
        and not text.endswith(".")
    )
