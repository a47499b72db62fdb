"""Page text with columns kept apart, OCR of scanned pages, and the corpus evaluation (`make eval`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytesseract
import pytest
from fpdf import FPDF

from phoenix.stages.categories import tag_pages
from phoenix.stages.corpus import CORPUS, faxed_scan
from phoenix.stages.evaluation import MIN_PRECISION, MIN_RECALL, evaluate, pypdf_texts
from phoenix.stages.extraction import extract_findings
from phoenix.stages.layout import Piece, layout_lines
from phoenix.stages.ocr import ocr_unavailable_reason
from phoenix.stages.pdf_text import PdfLimits, UnreadablePdfError, extract_page_texts
from phoenix.stages.samples import ensure_corpus
from tests.fixtures.pdf_bombs import big_image_page, image_pages, tiny_runs_page

needs_tesseract = pytest.mark.skipif(ocr_unavailable_reason() is not None, reason=str(ocr_unavailable_reason()))
SCAN = next(report for report in CORPUS if report.render is faxed_scan)


def commercial_table() -> bytes:
    """The issue's case: Test | Result | Flag | Units | Reference Interval, made with fpdf2, flag cells empty."""
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=9)
    rows = [
        ("Test", "Result", "Flag", "Units", "Reference Interval"),
        ("Glucose", "131", "H", "mg/dL", "65-99"),
        ("Sodium", "139", "", "mmol/L", "136-145"),
        ("Creatinine", "1.32", "H", "mg/dL", "0.76-1.27"),
        ("Potassium", "4.2", "", "mmol/L", "3.5-5.2"),
    ]
    with pdf.table(col_widths=(50, 25, 15, 30, 40), width=160, align="LEFT") as table:
        for row in rows:
            cells = table.row()
            for text in row:
                cells.cell(text)
    return bytes(pdf.output())


def test_commercial_table_keeps_its_columns_and_its_flagged_results() -> None:
    (text,) = extract_page_texts(commercial_table())
    assert text.splitlines()[:2] == ["Test\tResult\tFlag\tUnits\tReference Interval", "Glucose\t131\tH\tmg/dL\t65-99"]
    rows = [(b.name, b.value, b.unit, b.flag) for b in extract_findings(tag_pages([text])).biomarkers]
    assert rows == [
        ("Glucose", 131, "mg/dL", "H"),
        ("Sodium", 139, "mmol/L", "normal"),
        ("Creatinine", 1.32, "mg/dL", "H"),
        ("Potassium", 4.2, "mmol/L", "normal"),
    ]


def test_layout_joins_pieces_into_lines_with_tabs_at_column_gaps() -> None:
    pieces = [
        Piece("mg/dL", 300, 101, 330, 109),
        Piece("Glucose,", 30, 100, 70, 110),
        Piece("Fasting", 73, 100, 105, 110),  # a word gap: same cell
        Piece("131", 200, 101, 215, 109),  # a column gap: a new cell
        Piece("Sodium", 30, 120, 62, 130),  # the next line
        Piece("   ", 100, 120, 110, 130),
    ]
    assert layout_lines(pieces) == ["Glucose, Fasting\t131\tmg/dL", "Sodium"]


def test_page_without_text_stays_empty_without_ocr() -> None:
    cover, scan = extract_page_texts(SCAN.pdf(), ocr=False)
    assert cover.startswith("Fax cover")
    assert scan == ""


@pytest.mark.timeout(60)
@pytest.mark.ocr
@needs_tesseract
def test_scanned_page_is_read_by_ocr() -> None:
    _, scan = extract_page_texts(SCAN.pdf(), ocr=True)
    biomarkers = extract_findings(tag_pages(["", scan])).biomarkers
    found = {(b.name, b.value, b.comparator, b.unit, b.flag) for b in biomarkers}
    assert found == {(r.name, r.value, r.comparator, r.unit, r.flag) for r in SCAN.results}


def test_corpus_covers_four_layouts_from_two_generators() -> None:
    assert len({report.layout for report in CORPUS}) >= 4
    assert {"fpdf2", "reportlab"} <= {report.generator for report in CORPUS}


@pytest.mark.timeout(60)
@pytest.mark.ocr
@needs_tesseract
def test_evaluation_meets_the_targets_and_beats_pypdf() -> None:
    score = evaluate(CORPUS, lambda content: extract_page_texts(content, ocr=True))
    assert score.precision >= MIN_PRECISION
    assert score.recall >= MIN_RECALL
    assert score.missed_flagged == []
    assert evaluate(CORPUS, pypdf_texts).recall < score.recall


def test_a_reader_that_loses_results_misses_the_targets() -> None:
    score = evaluate(CORPUS[:1], lambda content: [""])
    assert (score.precision, score.recall) == (0.0, 0.0)
    assert len(score.missed_flagged) == sum(r.flag in ("H", "L") for r in CORPUS[0].results)
    assert not score.meets_targets()


def test_samples_command_writes_the_corpus_with_expected_results(tmp_path: Path) -> None:
    paths = ensure_corpus(tmp_path)
    assert [p.name for p in paths[:2]] == [CORPUS[0].file_name, f"{CORPUS[0].file_name}.expected.json"]
    expected = json.loads(paths[1].read_text())
    assert expected[0] == asdict(CORPUS[0].results[0])
    assert paths[0].read_bytes() == CORPUS[0].pdf()  # deterministic: the same bytes every time


@pytest.mark.ocr
def test_ocr_failure_is_a_clear_unreadable_document_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A Tesseract that knows its version and fails on every image, as it does on one it cannot read.
    broken = tmp_path / "tesseract"
    broken.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo "tesseract 5.3.0" && exit 0\necho "Error: bad image" >&2\nexit 1\n'
    )
    broken.chmod(0o755)
    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", str(broken))
    with pytest.raises(UnreadablePdfError, match="OCR of page 2 failed: Error: bad image"):
        extract_page_texts(SCAN.pdf(), ocr=True)


def test_cells_wrapped_over_two_lines_are_folded_back_into_their_row() -> None:
    # A header whose "Previous Result and Date" wraps (centred against one-line cells: one part above the row,
    # one below), then a row whose name wraps (first line level with the row's top, the rest below).
    pieces = [
        Piece("Previous Result and", 280, 78, 380, 85),
        Piece("Tests", 30, 87, 55, 94),
        Piece("Result", 170, 87, 200, 94),
        Piece("Units", 390, 87, 410, 94),
        Piece("Date", 280, 95, 300, 102),
        Piece("Vitamin D, 25-Hydroxy,", 31, 110, 140, 117),
        Piece("22.4 Low", 170, 114, 205, 121),
        Piece("ng/mL", 390, 114, 415, 121),
        Piece("Total", 30, 119, 52, 126),
        Piece("BUN", 30, 131, 48, 138),  # the next row: under the name, but the name does not sit raised
        Piece("18", 170, 131, 180, 138),
    ]
    assert layout_lines(pieces) == [
        "Tests\tResult\tPrevious Result and Date\tUnits",
        "Vitamin D, 25-Hydroxy, Total\t22.4 Low\tng/mL",
        "BUN\t18",
    ]


@pytest.mark.ocr
def test_tesseract_without_english_data_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bare = tmp_path / "tesseract"
    bare.write_text('#!/bin/sh\necho "List of available languages in /usr/share/tessdata (1):"\necho osd\n')
    bare.chmod(0o755)
    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", str(bare))
    assert ocr_unavailable_reason() == (
        "Tesseract has no English language data (Debian: apt-get install tesseract-ocr-eng)"
    )


def test_a_pdf_over_the_page_cap_is_refused_before_any_page_is_read() -> None:
    assert extract_page_texts(image_pages(3), limits=PdfLimits(max_pages=3)) == ["", "", ""]
    with pytest.raises(UnreadablePdfError, match=r"the PDF has 4 pages, more than MAX_DOCUMENT_PAGES \(3\)"):
        extract_page_texts(image_pages(4), limits=PdfLimits(max_pages=3))


def test_a_text_layer_of_too_many_runs_is_refused() -> None:
    assert extract_page_texts(tiny_runs_page(1000))[0].startswith("x\tx\tx")
    with pytest.raises(UnreadablePdfError, match="page 1 has 2100 text runs, more than 2000"):
        extract_page_texts(tiny_runs_page(2100))


@pytest.mark.ocr
@needs_tesseract
def test_a_page_over_the_pixel_cap_is_rendered_smaller_down_to_the_least_ocr_reads() -> None:
    # A bilevel 2000 x 2000 scan over A4: 242 dpi, 5.7 Mpx to render (its 4 Mpx count as 0.5).
    scan = big_image_page(2000, "1")
    assert extract_page_texts(scan, ocr=True, limits=PdfLimits(max_page_pixels=4_000_000)) == [""]  # at 203 dpi
    with pytest.raises(UnreadablePdfError, match=r"needs 3868706 pixels at 200 dpi, the least OCR reads, more than"):
        extract_page_texts(scan, ocr=True, limits=PdfLimits(max_page_pixels=3_000_000))
    with pytest.raises(UnreadablePdfError, match=r"the images of page 1 hold 4000000 pixels, more than MAX_PAGE"):
        extract_page_texts(big_image_page(2000), ocr=True, limits=PdfLimits(max_page_pixels=3_000_000))
