"""Lines of text from positioned pieces of a page (text runs of a PDF's text layer, or words found by OCR).

Pieces are grouped into lines by their vertical overlap and joined left to right: a gap wider than the line's
height is a column gap and becomes a tab, so table cells stay apart (and an empty cell leaves no trace to shift the
next one's meaning: the row grammar reads cells by content and by the header's column names).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise

from phoenix.stages.result_rows import CELL_SEPARATOR


@dataclass(frozen=True)
class Piece:
    """A run of text and its box, in page units with y growing downwards."""

    text: str
    left: float
    top: float
    right: float
    bottom: float


def layout_lines(pieces: Iterable[Piece]) -> list[str]:
    lines: list[list[Piece]] = []
    for piece in sorted((p for p in pieces if p.text.strip()), key=lambda p: (p.top, p.left)):
        line = next((line for line in reversed(lines[-3:]) if _same_line(piece, line)), None)
        if line is None:
            lines.append([piece])
        else:
            line.append(piece)
    return [_join(sorted(line, key=lambda p: p.left)) for line in lines]


def _same_line(piece: Piece, line: list[Piece]) -> bool:
    """Cells of one table row may sit at different heights (a header cell wrapped over two lines is centred
    against one-line cells): a piece that overlaps the line by 40% of its height belongs to it."""
    top, bottom = _band(line)
    overlap = min(bottom, piece.bottom) - max(top, piece.top)
    return overlap >= 0.4 * (piece.bottom - piece.top)


def _band(line: list[Piece]) -> tuple[float, float]:
    return min(p.top for p in line), max(p.bottom for p in line)


def _join(line: list[Piece]) -> str:
    top, bottom = _band(line)
    column_gap = bottom - top
    text = line[0].text.strip()
    for previous, piece in pairwise(line):
        separator = CELL_SEPARATOR if piece.left - previous.right > column_gap else " "
        text += separator + piece.text.strip()
    return text
