"""An evaluation corpus of lab reports laid out as real ones are, each with the results it must yield.

Six layouts from two PDF generators: a LabCorp-like table with a previous-result column (fpdf2), a Quest-like
table with a lab-code column (reportlab), a hospital table with ranges in their own column (reportlab), free text
rows (fpdf2), a multi-page report in conventional and SI units (reportlab) and a faxed scan (an fpdf2 page rendered
to an image by PDFium and wrapped in a PDF without text). The results are fictional and deterministic; each layout
prints them its own way (flag words or letters, en dashes, `10*3/uL`, `1,234`, `<0.5`).
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pypdfium2 as pdfium
from fpdf import FPDF
from PIL import Image, ImageFilter
from reportlab.lib import colors
from reportlab.lib.pagesizes import letter
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.platypus import Flowable, PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

from phoenix.stages.models import Comparator, Flag

PATIENT = "Patient: Jordan Sample    DOB: 1975-09-30    Sex: M    Specimen: 24-118-0042"
CREATED = datetime(2024, 4, 2, tzinfo=UTC)  # fixed, so the bytes are reproducible


@dataclass(frozen=True)
class Result:
    """One expected biomarker: what extraction must report, and how the value is printed."""

    name: str
    value: float
    unit: str
    range: str
    flag: Flag = "normal"
    printed: str = ""  # the value as printed, when not f"{value:g}" ("1,234", "<0.5", "4.10")
    comparator: Comparator | None = None
    printed_flag: str = ""  # the flag as printed, when the layout's own style does not say it ("HH")

    @property
    def shown(self) -> str:
        return self.printed or f"{self.value:g}"


@dataclass(frozen=True)
class CorpusReport:
    file_name: str
    layout: str
    generator: str
    results: tuple[Result, ...]
    render: Callable[[tuple[Result, ...]], bytes]

    def pdf(self) -> bytes:
        return self.render(self.results)


def _letter_flag(result: Result) -> str:
    return result.printed_flag or ("" if result.flag == "normal" else result.flag)


def _word_flag(result: Result) -> str:
    return result.printed_flag or {"H": "High", "L": "Low", "A": "Abnormal"}.get(result.flag, "")


# -- fpdf2 ----------------------------------------------------------------------------------------------------------


def _fpdf_report(title: str, issuer: str) -> FPDF:
    """A document with its first page begun under a letterhead."""
    pdf = FPDF(format="letter")
    pdf.set_creation_date(CREATED)
    pdf.set_title(title)
    pdf.add_page()
    letterhead(pdf, issuer, PATIENT)
    return pdf


def letterhead(pdf: FPDF, issuer: str, patient: str) -> None:
    pdf.set_font("Helvetica", "B", 12)
    pdf.cell(0, 7, issuer, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=9)
    pdf.cell(0, 6, patient, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)


def fpdf_table(
    pdf: FPDF, rows: Sequence[Sequence[str]], widths: Sequence[int], size: int = 9, borders: str = "NONE"
) -> None:
    """A table of text cells at the left margin, its first row the header; `borders`: fpdf2's borders layout."""
    pdf.set_font("Helvetica", size=size)
    with pdf.table(col_widths=widths, width=sum(widths), align="LEFT", line_height=6, borders_layout=borders) as table:
        for row in rows:
            cells = table.row()
            for text in row:
                cells.cell(text)


def labcorp_like(results: tuple[Result, ...]) -> bytes:
    """Tests | Current Result and Flag | Previous Result and Date | Units | Reference Interval."""
    pdf = _fpdf_report("labcorp-like", "Commercial Reference Laboratory - Final Report - Collected 03/28/2024")
    previous = {"Glucose": "118  01/12/2024", "Creatinine": "1.18  01/12/2024", "WBC": "6.9  01/12/2024"}
    rows = [("Tests", "Current Result and Flag", "Previous Result and Date", "Units", "Reference Interval")]
    rows += [(r.name, f"{r.shown} {_word_flag(r)}".strip(), previous.get(r.name, ""), r.unit, r.range) for r in results]
    fpdf_table(pdf, rows, (50, 38, 38, 28, 34))
    pdf.set_font("Helvetica", size=8)
    pdf.multi_cell(0, 4, "Please note: reference intervals changed for eGFR on 01/01/2024.")
    return bytes(pdf.output())


def free_text_rows(results: tuple[Result, ...]) -> bytes:
    """A clinic letter: one result per line in the order each lab printed it, amid prose."""
    pdf = _fpdf_report("free-text-rows", "Hillcrest Family Practice - Results letter - 2024-03-30")
    pdf.set_font("Helvetica", size=10)
    pdf.multi_cell(0, 5, "Dear Jordan, your blood tests from 28 March 2024 are back. The results are below.")
    pdf.ln(2)
    forms: list[Callable[[Result], str]] = [
        lambda r: f"{r.name} {r.shown} {_letter_flag(r)} {r.unit} {r.range}",
        lambda r: f"{r.name}: {r.shown} {r.unit} ({r.range}) {_word_flag(r)}",
        lambda r: f"{r.name} {r.shown}{_letter_flag(r)} {r.unit} Ref: {r.range}",
        lambda r: f"{r.name}: {r.shown} {r.unit} [{r.range}] {_letter_flag(r)}",
    ]
    for i, result in enumerate(results):
        pdf.cell(0, 6, " ".join(forms[i % len(forms)](result).split()), new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2)
    pdf.multi_cell(0, 5, "Please repeat the fasting glucose in 3 months and take 1000 mg of metformin twice daily.")
    return bytes(pdf.output())


def faxed_scan(results: tuple[Result, ...]) -> bytes:
    """A fax: a typed lab page rendered to a slightly skewed, speckled image; no text layer at all."""
    typed = _fpdf_report("typed", "County Hospital Laboratory - FAX")
    rows = [("Test", "Result", "Flag", "Units", "Reference Range")]
    rows += [(r.name, r.shown, _letter_flag(r), r.unit, r.range) for r in results]
    fpdf_table(typed, rows, (60, 25, 15, 30, 45), size=10)
    document = pdfium.PdfDocument(bytes(typed.output()))
    image = document[0].render(scale=200 / 72, grayscale=True).to_pil()  # a fax's fine mode
    document.close()
    image = image.rotate(0.3, fillcolor=255, resample=Image.Resampling.BICUBIC).filter(ImageFilter.GaussianBlur(0.4))
    speckles = random.Random(7)
    for _ in range(400):
        image.putpixel((speckles.randrange(image.width), speckles.randrange(image.height)), 90)
    pdf = _fpdf_report("faxed-scan", "Fax cover - County Hospital Laboratory - 1 page follows")
    pdf.add_page()
    pdf.image(image, x=0, y=0, w=pdf.w, h=pdf.h)
    return bytes(pdf.output())


# -- reportlab ------------------------------------------------------------------------------------------------------

_STYLES = getSampleStyleSheet()
_GRID = TableStyle(
    [
        ("FONT", (0, 0), (-1, -1), "Helvetica", 9),
        ("FONT", (0, 0), (-1, 0), "Helvetica-Bold", 9),
        ("LINEBELOW", (0, 0), (-1, 0), 0.8, colors.black),
        ("GRID", (0, 1), (-1, -1), 0.25, colors.grey),
        ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#dde4ee")),
    ]
)


def _reportlab(title: str, issuer: str, pages: Sequence[Sequence[Flowable]]) -> bytes:
    buffer = io.BytesIO()
    document = SimpleDocTemplate(buffer, pagesize=letter, title=title, invariant=1)
    story: list[Flowable] = []
    for number, flowables in enumerate(pages):
        if number:
            story.append(PageBreak())
        story += [Paragraph(issuer, _STYLES["Heading3"]), Paragraph(PATIENT, _STYLES["Normal"]), Spacer(1, 8)]
        story += flowables
    document.build(story)
    return buffer.getvalue()


def _table(rows: Sequence[Sequence[str]], widths: Sequence[float]) -> Table:
    return Table([list(row) for row in rows], colWidths=list(widths), style=_GRID, hAlign="LEFT")


def quest_like(results: tuple[Result, ...]) -> bytes:
    """Test | Result | Flag | Units | Reference Interval | Lab: a lab-code column the grammar does not know."""
    rows = [("Test", "Result", "Flag", "Units", "Reference Interval", "Lab")]
    rows += [(r.name, r.shown, _letter_flag(r), r.unit, r.range, "EZ") for r in results]
    return _reportlab(
        "quest-like",
        "Diagnostic Reference Services - Report Status: FINAL",
        [
            [
                Paragraph("COMPREHENSIVE METABOLIC PANEL AND LIPIDS", _STYLES["Heading4"]),
                _table(rows, (150, 55, 35, 70, 110, 35)),
            ]
        ],
    )


def hospital_table(results: tuple[Result, ...]) -> bytes:
    """Component | Value | Reference Range | Units | Flag, ranges with en dashes and `to`, critical flags."""
    rows = [("Component", "Value", "Reference Range", "Units", "Flag")]
    rows += [(r.name, r.shown, r.range, r.unit, _letter_flag(r)) for r in results]
    return _reportlab(
        "hospital-table",
        "Mercy General Hospital - Inpatient Laboratory - Ward 4B",
        [
            [
                Paragraph("Chemistry and Hematology, drawn 03/27/2024 06:10", _STYLES["Normal"]),
                Spacer(1, 6),
                _table(rows, (160, 60, 110, 80, 40)),
            ]
        ],
    )


def multi_page_mixed_units(results: tuple[Result, ...]) -> bytes:
    """Three pages, the same header on each; page 1 in conventional units, pages 2 and 3 in SI units."""
    header = ("Test", "Result", "Units", "Reference Range", "Flag")
    pages = [results[:6], results[6:12], results[12:]]
    return _reportlab(
        "multi-page-mixed-units",
        "Riverside Hospital Laboratory - Cumulative Report",
        [
            [
                Paragraph(title, _STYLES["Heading4"]),
                _table(
                    [header, *((r.name, r.shown, r.unit, r.range, _letter_flag(r)) for r in page)],
                    (150, 60, 90, 110, 40),
                ),
            ]
            for title, page in zip(
                ("Conventional units, 2024-03-20", "SI units, 2023-11-02", "SI units, 2023-06-15"), pages, strict=True
            )
        ],
    )


# -- the corpus -----------------------------------------------------------------------------------------------------

CORPUS: tuple[CorpusReport, ...] = (
    CorpusReport(
        "10-labcorp-like-table.pdf",
        "commercial lab table, flag words, previous-result column",
        "fpdf2",
        (
            Result("Glucose", 131, "mg/dL", "65-99", "H"),
            Result("BUN", 18, "mg/dL", "6-24"),
            Result("Creatinine", 1.32, "mg/dL", "0.76-1.27", "H"),
            Result("eGFR", 58, "mL/min/1.73", ">59", "L"),
            Result("Sodium", 139, "mmol/L", "134-144"),
            Result("Potassium", 3.3, "mmol/L", "3.5-5.2", "L"),
            Result("WBC", 7.2, "x10E3/uL", "3.4-10.8"),
            Result("Platelets", 451, "x10E3/uL", "150-450", "H"),
            Result("Vitamin B12", 1234, "pg/mL", "232-1245", printed="1,234"),
            Result("Hemoglobin A1c", 7.4, "%", "4.8-5.6", "H"),
            Result("Vitamin D, 25-Hydroxy, Total (D2 + D3)", 22.4, "ng/mL", "30.0-100.0", "L"),
        ),
        labcorp_like,
    ),
    CorpusReport(
        "11-quest-like-table.pdf",
        "commercial lab table, flag letters, lab-code column",
        "reportlab",
        (
            Result("GLUCOSE", 112, "mg/dL", "65-99", "H"),
            Result("UREA NITROGEN (BUN)", 15, "mg/dL", "7-25"),
            Result("CREATININE", 0.88, "mg/dL", "0.60-1.29"),
            Result("SODIUM", 141, "mmol/L", "135-146"),
            Result("POTASSIUM", 5.6, "mmol/L", "3.5-5.3", "H"),
            Result("CHOLESTEROL, TOTAL", 236, "mg/dL", "<200", "H"),
            Result("HDL CHOLESTEROL", 38, "mg/dL", ">39", "L"),
            Result("TRIGLYCERIDES", 1560, "mg/dL", "<150", "H", printed="1,560"),
            Result("WHITE BLOOD CELL COUNT", 3.1, "Thousand/uL", "3.8-10.8", "L"),
            Result("HS CRP", 0.2, "mg/L", "<1.0", printed="<0.2", comparator="<"),
        ),
        quest_like,
    ),
    CorpusReport(
        "12-hospital-table.pdf",
        "hospital table, ranges in their own column, critical flags",
        "reportlab",
        (
            Result("Sodium", 128, "mmol/L", "136\u2013145", "L"),
            Result("Potassium", 6.8, "mmol/L", "3.5\u20135.1", "H", printed_flag="HH"),
            Result("Chloride", 99, "mmol/L", "98 - 107"),
            Result("Bicarbonate", 18, "mmol/L", "22 to 29", "L"),
            Result("Lactate", 4.2, "mmol/L", "0.5 to 2.2", "H", printed_flag="Critical"),
            Result("Troponin I, high sensitivity", 5, "ng/L", "<=34", printed="<5", comparator="<"),
            Result("Hemoglobin", 8.9, "g/dL", "13.5\u201317.5", "L"),
            Result("WBC", 15.2, "10*3/uL", "4.0\u201311.0", "H"),
            Result("Platelets", 212, "10*3/uL", "150\u2013400"),
            Result("INR", 1.1, "ratio", "0.9\u20131.1"),
        ),
        hospital_table,
    ),
    CorpusReport(
        "13-free-text-rows.pdf",
        "free text rows in four row forms",
        "fpdf2",
        (
            Result("Glucose, Fasting", 131, "mg/dL", "70-99", "H"),
            Result("Hemoglobin A1c", 7.4, "%", "4.0 - 5.6", "H"),
            Result("TSH", 2.1, "uIU/mL", "0.45-4.50"),
            Result("Ferritin", 12, "ng/mL", "15-150", "L"),
            Result("Creatinine", 1.32, "mg/dL", "0.57-1.00", "H"),
            Result("CRP", 0.5, "mg/L", "0.0-5.0", printed="<0.5", comparator="<"),
            Result("eGFR", 60, "mL/min/1.73m2", ">59", printed=">60", comparator=">"),
            Result("Vitamin D, 25-Hydroxy", 22, "ng/mL", "30-100", "L"),
        ),
        free_text_rows,
    ),
    CorpusReport(
        "14-multi-page-mixed-units.pdf",
        "three pages, conventional and SI units",
        "reportlab",
        (
            Result("Hemoglobin A1c", 8.1, "%", "4.0-5.6", "H"),
            Result("Glucose, fasting", 162, "mg/dL", "70-99", "H"),
            Result("LDL Cholesterol", 96, "mg/dL", "<100"),
            Result("Creatinine", 1.05, "mg/dL", "0.70-1.30"),
            Result("Hemoglobin", 14.2, "g/dL", "13.5-17.5"),
            Result("Platelets", 140, "x10^3/uL", "150-400", "L"),
            Result("Glycated hemoglobin", 64, "mmol/mol", "20-42", "H"),
            Result("FBG", 8.4, "mmol/L", "3.9-5.5", "H"),
            Result("LDL-C", 2.9, "mmol/L", "<2.6", "H"),
            Result("Creatinine", 88, "umol/L", "62-115"),
            Result("Hemoglobin", 141, "g/L", "135-175"),
            Result("Platelets", 162, "x10^9/L", "150-400"),
            Result("Glycated hemoglobin", 59, "mmol/mol", "20-42", "H"),
            Result("FBG", 7.1, "mmol/L", "3.9-5.5", "H"),
            Result("Total cholesterol", 5.9, "mmol/L", "<5.2", "H"),
            Result("Potassium", 4.4, "mmol/L", "3.5-5.1"),
        ),
        multi_page_mixed_units,
    ),
    CorpusReport(
        "15-faxed-scan.pdf",
        "faxed scan: a rasterized page without a text layer",
        "fpdf2 + PDFium raster",
        (
            Result("Glucose, Fasting", 131, "mg/dL", "70-99", "H"),
            Result("Sodium", 139, "mmol/L", "136-145"),
            Result("Creatinine", 1.32, "mg/dL", "0.57-1.00", "H"),
            Result("WBC", 7.2, "x10E3/uL", "3.4-10.8"),
            Result("Hemoglobin", 11.2, "g/dL", "12.0-16.0", "L"),
            Result("CRP", 0.5, "mg/L", "0.0-5.0", printed="<0.5", comparator="<"),
        ),
        faxed_scan,
    ),
)
