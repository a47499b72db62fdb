"""Property: whatever bytes a document holds, the page reader gives its pages or an UnreadablePdfError, never
another exception, within the memory bound (+64 MiB of this process's resident memory per document).

Two sources: arbitrary bytes (most are no PDF at all, some start like one), and real PDFs (corpus reports, an
image-only page, many tiny text runs) with bytes flipped, cut, repeated or inserted, which reach deeper into
PDFium's parser: object tables that point nowhere, streams that stop early, page sizes and image sizes that are
off by orders of magnitude.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from phoenix.stages.corpus import CORPUS
from phoenix.stages.ocr import ocr_unavailable_reason
from phoenix.stages.pdf_text import PdfLimits, UnreadablePdfError, extract_page_texts
from tests.fixtures.fuzzing import FUZZ_SCALE, fuzz_settings
from tests.fixtures.memory import rss_peak
from tests.fixtures.pdf_bombs import image_pages, tiny_runs_page

pytestmark = pytest.mark.fuzz

BOUND_MIB = 64
SEEDS = (CORPUS[0].pdf(), CORPUS[-1].pdf(), image_pages(2), tiny_runs_page(200))
# Rendering is where the memory goes, and it happens only for OCR: with Tesseract here, its pages are rendered too.
OCR = ocr_unavailable_reason() is None
LIMITS = PdfLimits(max_pages=20)  # keeps a mutated page tree from running OCR over hundreds of pages


@st.composite
def mutated_pdf(draw: st.DrawFn) -> bytes:
    content = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(content)))
        edit = draw(st.sampled_from(("flip", "cut", "insert", "repeat", "digits")))
        if edit == "flip" and at < len(content):
            content[at] ^= draw(st.integers(1, 255))
        elif edit == "cut":
            del content[at : at + draw(st.integers(1, 4096))]
        elif edit == "insert":
            content[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif edit == "repeat":
            content[at:at] = content[at : at + draw(st.integers(1, 512))] * draw(st.integers(2, 50))
        else:  # a number made huge: a page size, an image size, a length, an object count
            content[at:at] = draw(st.sampled_from((b"99999999", b"1e30", b"-1", b"0", b"4294967296")))
    return bytes(content)


def _read(content: bytes) -> None:
    with rss_peak() as peak:
        try:
            texts = extract_page_texts(content, ocr=OCR, limits=LIMITS)
        except UnreadablePdfError:
            pass
        else:
            assert all(isinstance(text, str) for text in texts)
    assert peak.growth_mib < BOUND_MIB


@fuzz_settings(300)
@given(st.binary(max_size=2048) | st.binary(max_size=2048).map(lambda tail: b"%PDF-1.7\n" + tail))
def test_arbitrary_bytes_give_pages_or_an_unreadable_pdf_error(content: bytes) -> None:
    _read(content)


@pytest.mark.timeout(30 * FUZZ_SCALE)  # OCR of the rendered pages: about 0.15 s an example
@fuzz_settings(30)
@given(mutated_pdf())
def test_mutated_pdfs_give_pages_or_an_unreadable_pdf_error(content: bytes) -> None:
    _read(content)
