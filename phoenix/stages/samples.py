"""Write the sample medical reports used by the demo and the tests: `python -m phoenix.stages.samples [DIR]`.

The reports are fictional and deterministic (fixed text, fixed dates, no randomness), so tests can assert the
exact values the pipeline extracts from them. They are generated rather than committed as binary files. The
command also writes the evaluation corpus (corpus.py), each report beside its expected results as JSON.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from fpdf import FPDF

from phoenix.stages.corpus import CORPUS, fpdf_table, letterhead

DEFAULT_DIR = Path(".cache/samples")
PATIENT = "Patient: Maria Example    DOB: 1968-04-12    Sex: F    MRN: 000123"

LAB_HEADER = ("Test", "Result", "Unit", "Reference range", "Flag")
LAB_WIDTHS = (62, 22, 30, 44, 18)
CODE_WIDTHS = (24, 126, 26)


@dataclass(frozen=True)
class Heading:
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    widths: tuple[int, ...]


@dataclass(frozen=True)
class ScanPlaceholder:
    """A page that is only an image, as a scanner produces: it carries no text at all."""


Block = Heading | Paragraph | Table | ScanPlaceholder


@dataclass(frozen=True)
class Report:
    file_name: str
    issuer: str
    pages: tuple[tuple[Block, ...], ...]


def lab_table(*rows: tuple[str, ...]) -> Table:
    return Table(LAB_HEADER, rows, LAB_WIDTHS)


def diagnosis_table(*rows: tuple[str, str]) -> Table:
    return Table(("ICD-10", "Diagnosis"), rows, CODE_WIDTHS[:2])


def procedure_table(*rows: tuple[str, str, str]) -> Table:
    return Table(("CPT", "Procedure", "Date"), rows, CODE_WIDTHS)


REPORTS: tuple[Report, ...] = (
    Report(
        "01-cbc-metabolic-panel.pdf",
        "Northside Clinical Laboratory - Collected 2024-03-04 07:45",
        (
            (
                Heading("Complete Blood Count (CBC)"),
                lab_table(
                    ("WBC", "7.2", "x10^3/uL", "4.0-11.0", ""),
                    ("RBC", "4.10", "x10^6/uL", "4.20-5.40", "L"),
                    ("Hemoglobin", "11.8", "g/dL", "12.0-16.0", "L"),
                    ("Hematocrit", "35.9", "%", "36.0-46.0", "L"),
                    ("MCV", "87.6", "fL", "80.0-100.0", ""),
                    ("Platelets", "262", "x10^3/uL", "150-400", ""),
                ),
                Paragraph("Flags: H = above the reference range, L = below the reference range."),
            ),
            (
                Heading("Comprehensive Metabolic Panel"),
                lab_table(
                    ("Glucose, fasting", "112", "mg/dL", "70-99", "H"),
                    ("BUN", "18", "mg/dL", "7-20", ""),
                    ("Creatinine", "1.12", "mg/dL", "0.59-1.04", "H"),
                    ("eGFR", "58", "mL/min/1.73m2", ">60", "L"),
                    ("Sodium", "139", "mmol/L", "136-145", ""),
                    ("Potassium", "4.6", "mmol/L", "3.5-5.1", ""),
                    ("Chloride", "101", "mmol/L", "98-107", ""),
                    ("Calcium", "9.4", "mg/dL", "8.6-10.3", ""),
                    ("ALT", "24", "U/L", "7-35", ""),
                    ("AST", "41", "U/L", "13-35", "H"),
                ),
                Paragraph("Reviewed by: J. Rivera, MD, Laboratory Director."),
            ),
        ),
    ),
    Report(
        "02-diabetes-follow-up.pdf",
        "Lakeside Endocrinology Clinic - Visit 2024-03-11",
        (
            (
                Heading("HbA1c and Lipid Panel"),
                lab_table(
                    ("Hemoglobin A1c", "7.4", "%", "4.0-5.6", "H"),
                    ("Glucose, fasting", "131", "mg/dL", "70-99", "H"),
                    ("Total Cholesterol", "212", "mg/dL", "<200", "H"),
                    ("LDL Cholesterol", "138", "mg/dL", "<100", "H"),
                    ("HDL Cholesterol", "52", "mg/dL", ">40", ""),
                    ("Triglycerides", "162", "mg/dL", "<150", "H"),
                ),
            ),
            (
                Heading("Prior results - Riverside Hospital Laboratory, 2023-09-12 (SI units)"),
                # This lab prints no flag column: the parser derives the flags from the ranges.
                Table(
                    ("Test", "Result", "Unit", "Reference range"),
                    (
                        ("Glycated hemoglobin", "57", "mmol/mol", "20-42"),
                        ("FBG", "7.9", "mmol/L", "3.9-5.5"),
                        ("LDL-C", "3.9", "mmol/L", "<2.6"),
                        ("Creatinine", "97", "umol/L", "45-90"),
                    ),
                    LAB_WIDTHS[:4],
                ),
            ),
            (
                Heading("Assessment and Plan"),
                diagnosis_table(
                    ("E11.65", "Type 2 diabetes mellitus with hyperglycemia"),
                    ("E78.5", "Hyperlipidemia, unspecified"),
                    ("I10", "Essential (primary) hypertension"),
                ),
                Paragraph("Plan: increase metformin to 1000 mg twice daily; repeat HbA1c in 3 months."),
                Heading("Services"),
                procedure_table(
                    ("99214", "Office visit, established patient, moderate complexity", "2024-03-11"),
                    ("83036", "Hemoglobin; glycosylated (A1C)", "2024-03-11"),
                    ("80061", "Lipid panel", "2024-03-11"),
                ),
            ),
        ),
    ),
    Report(
        "03-colonoscopy-discharge.pdf",
        "St. Mary Medical Center - Procedure and Discharge Summary",
        (
            (
                Heading("Procedures performed"),
                procedure_table(
                    ("45385", "Colonoscopy with removal of polyp by snare technique", "2024-02-14"),
                    ("43239", "Upper GI endoscopy with biopsy", "2024-02-14"),
                    ("88305", "Surgical pathology, gross and microscopic examination", "2024-02-15"),
                ),
                Paragraph(
                    "Findings: a 9 mm sessile polyp in the sigmoid colon was removed completely. Scattered "
                    "diverticula in the sigmoid colon. Mild erythema of the distal esophagus, biopsied."
                ),
            ),
            (
                Heading("Discharge diagnoses"),
                diagnosis_table(
                    ("D12.5", "Benign neoplasm of sigmoid colon"),
                    ("K57.30", "Diverticulosis of large intestine without perforation or abscess"),
                    ("K21.9", "Gastro-esophageal reflux disease without esophagitis"),
                ),
                Heading("Labs at discharge"),
                lab_table(
                    ("Hemoglobin", "13.1", "g/dL", "12.0-16.0", ""),
                    ("Potassium", "3.3", "mmol/L", "3.5-5.1", "L"),
                ),
                # A result the parser cannot read: it is kept as an unparsed row, not dropped.
                Paragraph("Magnesium 1.9 mg/dL 1.7-2.2 (specimen hemolyzed, interpret with caution)"),
                Paragraph("Follow-up: surveillance colonoscopy in 3 years."),
            ),
        ),
    ),
    Report(
        "04-hereditary-cancer-panel.pdf",
        "Helix Genomics Laboratory - Hereditary Cancer Panel - Reported 2024-01-30",
        (
            (
                Heading("Results"),
                Table(
                    ("Gene", "Transcript", "Variant", "Protein", "Zygosity", "Classification"),
                    (
                        (
                            "BRCA1",
                            "NM_007294.4",
                            "c.68_69delAG",
                            "p.Glu23ValfsTer17",
                            "Heterozygous",
                            "Pathogenic",
                        ),
                        (
                            "CHEK2",
                            "NM_007194.4",
                            "c.1100delC",
                            "p.Thr367MetfsTer15",
                            "Heterozygous",
                            "Likely pathogenic",
                        ),
                        (
                            "ATM",
                            "NM_000051.4",
                            "c.1229T>C",
                            "p.Val410Ala",
                            "Heterozygous",
                            "Uncertain significance",
                        ),
                    ),
                    (16, 28, 30, 36, 26, 54),
                ),
                Paragraph(
                    "Genes analyzed: APC, ATM, BRCA1, BRCA2, CDH1, CHEK2, MLH1, MSH2, MSH6, PALB2, PMS2, "
                    "PTEN, STK11, TP53. Method: next-generation sequencing with deletion/duplication analysis."
                ),
            ),
            (
                Heading("Interpretation"),
                Paragraph(
                    "A pathogenic BRCA1 variant was identified, consistent with hereditary breast and "
                    "ovarian cancer syndrome. Cascade testing of first-degree relatives is recommended."
                ),
                diagnosis_table(
                    ("Z15.01", "Genetic susceptibility to malignant neoplasm of breast"),
                    ("Z80.3", "Family history of malignant neoplasm of breast"),
                ),
                procedure_table(
                    (
                        "81162",
                        "BRCA1 and BRCA2 full sequence and deletion/duplication analysis",
                        "2024-01-16",
                    ),
                    ("81432", "Hereditary breast cancer genomic sequence analysis panel", "2024-01-16"),
                ),
            ),
        ),
    ),
    Report(
        "05-ct-chest.pdf",
        "Metro Imaging Center - Radiology Report",
        (
            (
                Heading("CT chest with IV contrast - 2024-01-22"),
                Paragraph("Indication: chronic cough; former smoker."),
                Paragraph(
                    "Findings: a 6 mm solid nodule in the right upper lobe. No mediastinal or hilar "
                    "lymphadenopathy. No pleural effusion."
                ),
                Paragraph("Impression: solitary 6 mm pulmonary nodule; follow-up CT in 12 months."),
                diagnosis_table(("R91.1", "Solitary pulmonary nodule")),
                procedure_table(("71260", "CT thorax with contrast material", "2024-01-22")),
            ),
            (ScanPlaceholder(),),
        ),
    ),
)


def render(report: Report) -> bytes:
    pdf = FPDF(format="A4")
    pdf.set_creation_date(datetime(2024, 3, 15, tzinfo=UTC))  # fixed, so the bytes are reproducible
    pdf.set_title(report.file_name)
    for blocks in report.pages:
        pdf.add_page()
        if ScanPlaceholder() not in blocks:  # a scanned page has no text, not even a letterhead
            letterhead(pdf, report.issuer, PATIENT)
        for block in blocks:
            _render_block(pdf, block)
    return bytes(pdf.output())


def _render_block(pdf: FPDF, block: Block) -> None:
    match block:
        case Heading(text):
            pdf.set_font("Helvetica", "B", 11)
            pdf.cell(0, 8, text, new_x="LMARGIN", new_y="NEXT")
        case Paragraph(text):
            pdf.set_font("Helvetica", size=10)
            pdf.multi_cell(0, 5, text, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(2)
        case Table(header, rows, widths):
            fpdf_table(pdf, (header, *rows), widths, borders="ALL")
            pdf.ln(3)
        case ScanPlaceholder():
            # A grey "scan" with a frame: only drawing operators, no text layer.
            pdf.set_fill_color(220, 220, 220)
            pdf.rect(20, 20, 170, 250, style="DF")
            pdf.rect(40, 60, 130, 90, style="D")


def ensure_samples(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Write the sample reports into `directory` (created), skipping identical files; return their paths."""
    return [_write(directory / report.file_name, render(report)) for report in REPORTS]


def ensure_corpus(directory: Path = DEFAULT_DIR) -> list[Path]:
    """Write the evaluation corpus into `directory`: each report and `<report>.expected.json`."""
    paths = []
    for report in CORPUS:
        expected = json.dumps([asdict(result) for result in report.results], indent=2, ensure_ascii=False)
        paths.append(_write(directory / report.file_name, report.pdf()))
        paths.append(_write(directory / f"{report.file_name}.expected.json", expected.encode()))
    return paths


def _write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != content:
        path.write_bytes(content)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=DEFAULT_DIR)
    directory = parser.parse_args(argv).directory
    for path in ensure_samples(directory) + ensure_corpus(directory):
        print(path)


if __name__ == "__main__":
    main()
