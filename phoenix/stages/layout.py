"""Lines of text from positioned pieces of a page (text runs of a PDF's text layer, or words found by OCR).

Pieces are grouped into lines by their vertical overlap, and a line into cells: a horizontal gap wider than half
the tallest piece is a column gap and becomes a tab, so table cells stay apart (an empty cell leaves no trace to
shift the next one's meaning: the row grammar reads cells by content and by the header's column names).

A table cell wrapped over two lines is centred against its one-line neighbours, so its lines land above, within
and below the row. A line right above or below a row that has text only where the row has none, or under a cell
that sits higher than the rest of its row, is such a continuation and is folded back into the row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from statistics import median

from phoenix.stages.result_rows import CELL_SEPARATOR


@dataclass(frozen=True)
class Piece:
    """A run of text and its box, in page units with y growing downwards."""

    text: str
    left: float
    top: float
    right: float
    bottom: float

    @property
    def height(self) -> float:
        return self.bottom - self.top

    @property
    def middle(self) -> float:
        return (self.top + self.bottom) / 2

    def overlaps(self, other: Piece) -> bool:
        return self.left < other.right and other.left < self.right


Line = list[Piece]


def layout_lines(pieces: Iterable[Piece]) -> list[str]:
    lines = _group_lines(p for p in pieces if p.text.strip())
    return [CELL_SEPARATOR.join(_cell_text(cell) for cell in _cells(line)) for line in _fold_wrapped_cells(lines)]


def _group_lines(pieces: Iterable[Piece]) -> list[Line]:
    """Lines top to bottom: a piece that overlaps a line by 40% of its height belongs to it (cells of a row may
    sit a little higher or lower than each other)."""
    lines: list[Line] = []
    for piece in sorted(pieces, key=lambda p: (p.top, p.left)):
        line = next((line for line in reversed(lines[-3:]) if _overlap(piece, line) >= 0.4 * piece.height), None)
        if line is None:
            lines.append([piece])
        else:
            line.append(piece)
    return lines


def _overlap(piece: Piece, line: Line) -> float:
    top, bottom = _band(line)
    return min(bottom, piece.bottom) - max(top, piece.top)


def _fold_wrapped_cells(lines: list[Line]) -> list[Line]:
    folded: list[Line] = []
    for index, line in enumerate(lines):
        above = folded[-1] if folded else None
        below = lines[index + 1] if index + 1 < len(lines) else None
        row = min(
            (row for row in (above, below) if row is not None and _continues(line, row)),
            key=lambda row: _distance(line, row),
            default=None,
        )
        if row is None:
            folded.append(line)
        else:
            row.extend(line)  # a row below is appended in its turn, with this line's pieces in it
    return folded


def _continues(fragment: Line, row: Line) -> bool:
    """Whether the fragment is the rest of wrapped cells of the row (a table row with more pieces, right above
    or below it)."""
    if len(row) < 2 or len(fragment) >= len(row) or _distance(fragment, row) >= max(p.height for p in fragment):
        return False
    centre = median(p.middle for p in row)
    raised = [r for r in row if abs(r.middle - centre) > 0.25 * r.height]  # first lines of wrapped cells
    return all(r in raised for f in fragment for r in row if f.overlaps(r))


def _distance(line: Line, other: Line) -> float:
    (top, bottom), (other_top, other_bottom) = _band(line), _band(other)
    return max(other_top - bottom, top - other_bottom, 0.0)


def _band(line: Line) -> tuple[float, float]:
    return min(p.top for p in line), max(p.bottom for p in line)


def _cells(line: Line) -> list[Line]:
    """Pieces left to right, split where the gap to everything before is wider than a column gap."""
    column_gap = 0.5 * max(p.height for p in line)
    cells: list[Line] = []
    right = float("-inf")
    for piece in sorted(line, key=lambda p: p.left):
        if piece.left - right > column_gap:
            cells.append([])
        cells[-1].append(piece)
        right = max(right, piece.right)
    return cells


def _cell_text(cell: Line) -> str:
    """A cell's lines top to bottom, each left to right: a wrapped name reads as printed."""
    return " ".join(p.text.strip() for line in _group_lines(cell) for p in sorted(line, key=lambda p: p.left))
