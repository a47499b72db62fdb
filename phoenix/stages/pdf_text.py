"""The text of each page of a PDF, read by PDFium (pypdfium2) with its columns kept apart.

A page with a text layer is read from it: each text run with its box, joined into lines by layout.py (a column gap
becomes a tab). A page without one that holds an image (a scan, a fax) is rendered at the image's own resolution
and read by OCR when the caller allows it; a page with neither (a drawing) has no text.
"""

from __future__ import annotations

import threading

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytesseract
from PIL.Image import Image

from phoenix.stages.layout import Piece, layout_lines
from phoenix.stages.ocr import MAX_OCR_DPI, MIN_OCR_DPI, ocr_text

# PDFium is not thread-safe, and the router reads documents in worker threads (CONCURRENCY > 1).
_PDFIUM = threading.Lock()


class UnreadablePdfError(ValueError):
    """The bytes are not a PDF we can read (corrupt, truncated, password-protected): the same bytes will fail again."""


def extract_page_texts(content: bytes, *, ocr: bool = False) -> list[str]:
    """One string per page, in order; a page without a text layer gives '' unless `ocr` reads its image."""
    with _PDFIUM:
        pages = _read(content, ocr=ocr)
    # OCR runs outside the lock: it is the slow part, and Tesseract is a process of its own.
    return [page if isinstance(page, str) else _ocr(page, number) for number, page in enumerate(pages, 1)]


def _ocr(image: Image, number: int) -> str:
    try:
        return ocr_text(image)
    except pytesseract.TesseractError as exc:
        # Tesseract fails the same way on the same image: a retry cannot help, the DLQ shows why.
        raise UnreadablePdfError(f"OCR of page {number} failed: {exc.message.strip()[:200]}") from None


def _read(content: bytes, *, ocr: bool) -> list[str | Image]:
    """Each page's text, or its rendered image when it has no text layer but a picture for OCR to read."""
    try:
        # Many PDFs are encrypted only to restrict printing or copying: those open without a password.
        document = pdfium.PdfDocument(content)
    except pdfium.PdfiumError as exc:
        if exc.err_code == pdfium_c.FPDF_ERR_PASSWORD:
            raise UnreadablePdfError("the PDF is password-protected") from None
        raise UnreadablePdfError(f"not a readable PDF: {exc}") from None
    try:
        return [_page_content(page, ocr=ocr) for page in document]
    except pdfium.PdfiumError as exc:  # a page that cannot be loaded or rendered fails the same way every time
        raise UnreadablePdfError(f"not a readable PDF: {exc}") from None
    finally:
        document.close()


def _page_content(page: pdfium.PdfPage, *, ocr: bool) -> str | Image:
    text = "\n".join(layout_lines(_text_runs(page)))
    dpi = _image_dpi(page) if ocr and not text else None
    if dpi is None:
        return text
    # At the scan's own resolution: resampling it blurs the strokes that tell "." from ":".
    dpi = min(max(dpi, MIN_OCR_DPI), MAX_OCR_DPI)
    return page.render(scale=dpi / 72, grayscale=True).to_pil()


def _text_runs(page: pdfium.PdfPage) -> list[Piece]:
    textpage = page.get_textpage()
    height = page.get_height()
    pieces = []
    for index in range(textpage.count_rects()):
        left, bottom, right, top = textpage.get_rect(index)
        # PDF space grows upwards; layout works top-down like an image.
        text = textpage.get_text_bounded(left, bottom, right, top)
        pieces.append(Piece(text, left, height - top, right, height - bottom))
    return pieces


def _image_dpi(page: pdfium.PdfPage) -> float | None:
    """The resolution of the sharpest image on the page, in pixels per inch as placed; None without images."""
    resolutions = []
    for image in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]):
        left, _, right, _ = image.get_bounds()
        if right > left:
            resolutions.append(image.get_px_size()[0] / ((right - left) / 72))
    return max(resolutions, default=None)
