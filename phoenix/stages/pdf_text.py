"""The text of each page of a PDF, read by PDFium (pypdfium2) with its columns kept apart.

A page with a text layer is read from it: each text run with its box, joined into lines by layout.py (a column gap
becomes a tab). A page without one that holds an image (a scan, a fax) is rendered at the image's own resolution
and read by OCR when the caller allows it; a page with neither (a drawing) has no text.

A document is untrusted, and a few kilobytes of PDF can describe gigabytes of pixels. Pages are read one at a
time: PDFium (not thread-safe) is locked while one page is loaded and rendered, OCR runs outside the lock, and a
page's bitmap is gone before the next page is loaded, so a document being read holds at most one page's pixels.
What a page may cost is capped (PdfLimits, and the text caps below); a document over a cap is refused with an
UnreadablePdfError naming it, never read in part.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytesseract
from PIL.Image import Image

from phoenix.stages.layout import Piece, layout_lines
from phoenix.stages.ocr import MAX_OCR_DPI, MIN_OCR_DPI, ocr_text

# PDFium is not thread-safe, and the router reads documents in worker threads (CONCURRENCY > 1).
_PDFIUM = threading.Lock()
# A text layer is read run by run, and PDFium looks up each run's text among all the page's characters: the cost
# grows with runs x characters (20,000 runs of one letter took 9 s for one page). A dense page of small print has
# a few hundred runs and a few thousand characters.
MAX_PAGE_TEXT_RUNS = 2_000
MAX_PAGE_CHARS = 20_000


class UnreadablePdfError(ValueError):
    """The bytes are not a PDF we can read (corrupt, truncated, password-protected) or one over a cap: the same
    bytes will fail again."""


@dataclass(frozen=True)
class PdfLimits:
    """MAX_DOCUMENT_PAGES and MAX_PAGE_PIXELS of the router (RouterSettings)."""

    max_pages: int = 200
    # A rendered page's bitmap (one byte a pixel in grayscale), and the images drawn on it together: PDFium
    # decodes each whole to draw it, whatever the scale (measured: up to four bytes a pixel, gray or color; bilevel
    # fax images stay packed, so theirs count an eighth). A4 at 300 dpi is 8.7 million pixels.
    max_page_pixels: int = 10_000_000


DEFAULT_LIMITS = PdfLimits()


def extract_page_texts(content: bytes, *, ocr: bool = False, limits: PdfLimits = DEFAULT_LIMITS) -> list[str]:
    """One string per page, in order; a page without a text layer gives '' unless `ocr` reads its image."""
    with _PDFIUM:
        document = _open(content)
    try:
        with _PDFIUM:
            pages = len(document)
        if pages > limits.max_pages:
            raise UnreadablePdfError(f"the PDF has {pages} pages, more than MAX_DOCUMENT_PAGES ({limits.max_pages})")
        return [_page_text(document, number, ocr=ocr, limits=limits) for number in range(1, pages + 1)]
    finally:
        with _PDFIUM:
            document.close()


def _open(content: bytes) -> pdfium.PdfDocument:
    try:
        # Many PDFs are encrypted only to restrict printing or copying: those open without a password.
        return pdfium.PdfDocument(content)
    except pdfium.PdfiumError as exc:
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
            raise UnreadablePdfError("the PDF is password-protected") from None
        raise UnreadablePdfError(f"not a readable PDF: {exc}") from None


def _page_text(document: pdfium.PdfDocument, number: int, *, ocr: bool, limits: PdfLimits) -> str:
    with _PDFIUM:
        content = _read_page(document, number, ocr=ocr, limits=limits)
    # OCR runs outside the lock: it is the slow part, and Tesseract is a process of its own. The image goes when
    # this returns, before the next page is rendered.
    return content if isinstance(content, str) else _ocr(content, number)


def _read_page(document: pdfium.PdfDocument, number: int, *, ocr: bool, limits: PdfLimits) -> str | Image:
    """The page's text, or its rendered image when it has no text layer but a picture for OCR to read."""
    try:
        page = document[number - 1]
    except pdfium.PdfiumError as exc:  # a page that cannot be loaded fails the same way every time
        raise UnreadablePdfError(f"not a readable PDF: page {number}: {exc}") from None
    try:
        text = _text_layer(page, number)
        dpi = _render_dpi(page, number, limits) if ocr and not text else None
        if dpi is None:
            return text
        bitmap = page.render(scale=dpi / 72, grayscale=True)
        try:
            # The image shares the bitmap's buffer, which Python allocated: it outlives PDFium's handle.
            return bitmap.to_pil()
        finally:
            bitmap.close()
    except pdfium.PdfiumError as exc:
        raise UnreadablePdfError(f"not a readable PDF: page {number}: {exc}") from None
    finally:
        page.close()


def _ocr(image: Image, number: int) -> str:
    try:
        return ocr_text(image)
    except pytesseract.TesseractError as exc:
        # Tesseract fails the same way on the same image: a retry cannot help, the DLQ shows why.
        raise UnreadablePdfError(f"OCR of page {number} failed: {exc.message.strip()[:200]}") from None


def _text_layer(page: pdfium.PdfPage, number: int) -> str:
    textpage = page.get_textpage()
    try:
        if (runs := textpage.count_rects()) > MAX_PAGE_TEXT_RUNS:
            raise UnreadablePdfError(f"page {number} has {runs} text runs, more than {MAX_PAGE_TEXT_RUNS}")
        if (chars := textpage.count_chars()) > MAX_PAGE_CHARS:
            raise UnreadablePdfError(f"page {number} has {chars} characters, more than {MAX_PAGE_CHARS}")
        height = page.get_height()
        pieces = []
        for index in range(runs):
            left, bottom, right, top = textpage.get_rect(index)
            # PDF space grows upwards; layout works top-down like an image.
            text = textpage.get_text_bounded(left, bottom, right, top)
            pieces.append(Piece(text, left, height - top, right, height - bottom))
        return "\n".join(layout_lines(pieces))
    finally:
        textpage.close()


def _render_dpi(page: pdfium.PdfPage, number: int, limits: PdfLimits) -> float | None:
    """The resolution to render the page at for OCR: its sharpest image's, within the OCR bounds and
    MAX_PAGE_PIXELS; None without images (or without an area to render)."""
    resolutions, pixels = [], 0
    for image in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
        width, height = image.get_px_size()
        pixels += _counted_pixels(width * height, image.get_metadata().bits_per_pixel)
        left, _, right, _ = image.get_bounds()
        if right > left:
            resolutions.append(width / ((right - left) / 72))
    if not resolutions:
        return None
    cap = limits.max_page_pixels
    if pixels > cap:
        raise UnreadablePdfError(f"the images of page {number} hold {pixels} pixels, more than MAX_PAGE_PIXELS ({cap})")
    # At the scan's own resolution: resampling it blurs the strokes that tell "." from ":".
    dpi = min(max(max(resolutions), MIN_OCR_DPI), MAX_OCR_DPI)
    width_in, height_in = page.get_width() / 72, page.get_height() / 72
    if not (width_in > 0 and height_in > 0 and math.isfinite(width_in * height_in * MAX_OCR_DPI**2)):
        return None  # nothing to render, or a size no bitmap has
    while _render_pixels(width_in, height_in, dpi) > cap:
        fitting = dpi * math.sqrt(cap / _render_pixels(width_in, height_in, dpi)) * 0.999
        if fitting < MIN_OCR_DPI:
            raise UnreadablePdfError(
                f"page {number} ({width_in:.0f} x {height_in:.0f} in) needs "
                f"{_render_pixels(width_in, height_in, MIN_OCR_DPI)} pixels at {MIN_OCR_DPI} dpi, the least OCR "
                f"reads, more than MAX_PAGE_PIXELS ({cap})"
            )
        dpi = fitting
    return dpi


def _counted_pixels(pixels: int, bits_per_pixel: int) -> int:
    """An image's pixels as MAX_PAGE_PIXELS counts them: a bilevel one's (a fax, a scan in black and white), which
    PDFium keeps packed, an eighth."""
    return pixels // 8 if 0 < bits_per_pixel <= 1 else pixels


def _render_pixels(width_in: float, height_in: float, dpi: float) -> int:
    return math.ceil(width_in * dpi) * math.ceil(height_in * dpi)
