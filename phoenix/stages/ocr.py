"""Text of scanned pages by Tesseract OCR (the `tesseract` binary from Debian's tesseract-ocr, via pytesseract)."""

from __future__ import annotations

import shutil
import subprocess

import pytesseract
from PIL.Image import Image

from phoenix.stages.layout import Piece, layout_lines

# Scans are read at their own resolution within these bounds: a fax is 200 dpi, an office scan 300; below 200
# 9-10 pt print is too small for Tesseract, above 400 it only costs time.
MIN_OCR_DPI = 200
MAX_OCR_DPI = 400
# One uniform block of text: tables come out row by row instead of column by column.
TESSERACT_CONFIG = "--psm 6"
# Table rules, fax speckles and smudges read as quotes, bars and dashes around or instead of words.
_NOISE = "\u2018\u2019'\"`_|~\u2014\u00a9"


def ocr_unavailable_reason() -> str | None:
    """Why scanned pages cannot be read here, or None when they can."""
    binary = shutil.which(pytesseract.pytesseract.tesseract_cmd)
    if binary is None:
        return "the tesseract binary is not installed (Debian: apt-get install tesseract-ocr tesseract-ocr-eng)"
    # Asked here rather than through pytesseract.get_languages, which remembers its first answer for good.
    listed = subprocess.run([binary, "--list-langs"], capture_output=True, text=True, check=False).stdout
    if "eng" not in listed.split():
        return "Tesseract has no English language data (Debian: apt-get install tesseract-ocr-eng)"
    return None


def ocr_text(image: Image) -> str:
    """The image's text as layout lines (columns separated by tabs), like a page's text layer."""
    data = pytesseract.image_to_data(image, config=TESSERACT_CONFIG, output_type=pytesseract.Output.DICT)
    pieces = [
        Piece(word, left, top, left + width, top + height)
        for text, left, top, width, height in zip(
            data["text"], data["left"], data["top"], data["width"], data["height"], strict=True
        )
        if _is_word(word := text.strip().strip(_NOISE))
    ]
    return "\n".join(layout_lines(pieces))


def _is_word(text: str) -> bool:
    return any(c.isalnum() or c in "%<>" for c in text)
