"""The text of each page of a PDF."""

from __future__ import annotations

import io

from pypdf import PdfReader
from pypdf.errors import PyPdfError


class UnreadablePdfError(ValueError):
    """The bytes are not a PDF we can read (corrupt, truncated, password-protected): the same bytes will fail again."""


def extract_page_texts(content: bytes) -> list[str]:
    """One string per page, in order; a page without a text layer (a scan, a drawing) gives ''."""
    try:
        reader = PdfReader(io.BytesIO(content))
        # Many PDFs are encrypted only to restrict printing or copying: those open with the empty password.
        if reader.is_encrypted and not reader.decrypt(""):
            raise UnreadablePdfError("the PDF is password-protected")
        return [page.extract_text().strip() for page in reader.pages]
    except PyPdfError as exc:
        raise UnreadablePdfError(f"not a readable PDF: {exc}") from exc
