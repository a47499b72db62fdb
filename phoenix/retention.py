"""OUTPUT_RETENTION: how much of an output stream that no consumer group reads a stage keeps.

Such a stream (a sink read with XREAD, or by nobody) is never trimmed by what was acknowledged, because nothing
is; its owner chooses a bound instead: `maxlen:<entries>` keeps the newest entries, `age:<n><s|m|h|d>` keeps
the entries added within that time. One grammar for the worker's variable and the PhoenixStage field, so both
refuse the same text; its durations (`<n><s|m|h|d>`) are spec.maxRecordAge's too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DURATION = r"[1-9][0-9]{0,8}[smhd]"
DURATION_PATTERN = rf"^{_DURATION}$"
RETENTION_PATTERN = rf"^(maxlen:[1-9][0-9]{{0,11}}|age:{_DURATION})$"
RETENTION_HELP = "expected maxlen:<entries> (e.g. maxlen:100000) or age:<number><s|m|h|d> (e.g. age:7d)"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str) -> int:
    """A duration `<n><s|m|h|d>` (DURATION_PATTERN) in milliseconds; ValueError for anything else."""
    if not re.match(DURATION_PATTERN, text):
        raise ValueError(f"expected a duration <number><s|m|h|d> (e.g. 48h), got {text[:40]!r}")
    return int(text[:-1]) * _UNIT_MS[text[-1]]


@dataclass(frozen=True, slots=True)
class Retention:
    """Exactly one of `maxlen` (entries) and `age_ms` (milliseconds) is set."""

    text: str
    maxlen: int | None = None
    age_ms: int | None = None

    @classmethod
    def parse(cls, text: str) -> Retention:
        """ValueError with RETENTION_HELP for anything but the two forms."""
        if not re.match(RETENTION_PATTERN, text):
            raise ValueError(RETENTION_HELP)
        kind, _, amount = text.partition(":")
        if kind == "maxlen":
            return cls(text, maxlen=int(amount))
        return cls(text, age_ms=duration_ms(amount))

    def script_args(self) -> list[str | int]:
        """ARGV of trim.lua: the kind and its amount."""
        return ["maxlen", self.maxlen] if self.maxlen is not None else ["age", self.age_ms or 0]
