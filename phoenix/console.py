"""Tables on a terminal: aligned columns, redrawn in place on a TTY and printed as plain snapshots elsewhere.

Shared by the demo's live table and `phoenix status --watch`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TextIO


def format_columns(lines: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]


class TableDisplay:
    """Redraws the table in place on a terminal; elsewhere (CI, pipes) prints each changed snapshot as lines."""

    def __init__(self, out: TextIO, started: float) -> None:
        self.out = out
        self.started = started
        self.redraw = out.isatty()
        self._drawn_lines = 0
        self._last_key: object = None

    def show(self, lines: Sequence[str], key: object, *, final: bool = False) -> None:
        """Draw `lines`; off a terminal only when `key` (what the snapshot's figures are) changed, or `final`."""
        if self.redraw:
            # Cursor up to the first line of the previous table, clear to the end of the screen, draw again.
            prefix = f"\x1b[{self._drawn_lines}F\x1b[J" if self._drawn_lines else ""
            self.out.write(prefix + "\n".join(lines) + "\n")
            self._drawn_lines = len(lines)
        elif final or key != self._last_key:
            elapsed = time.monotonic() - self.started
            self.out.write(f"--- {elapsed:5.1f} s{' (final)' if final else ''}\n" + "\n".join(lines) + "\n")
        self._last_key = key
        self.out.flush()
