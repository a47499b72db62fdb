"""Page text, page categories and rule-based extraction on the generated sample reports."""

from __future__ import annotations

from pathlib import Path

import pytest
from fpdf import FPDF

from phoenix.stages.categories import tag_pages
from phoenix.stages.extraction import extract_findings, extract_from_text, flag_for, parse_range
from phoenix.stages.models import Findings, Page
from phoenix.stages.pdf_text import UnreadablePdfError, extract_page_texts
from phoenix.stages.samples import REPORTS, ensure_samples, render

PDFS = {report.file_name: render(report) for report in REPORTS}


def pages_of(file_name: str) -> list[Page]:
    return tag_pages(extract_page_texts(PDFS[file_name]))


def findings_of(file_name: str) -> Findings:
    return extract_findings(pages_of(file_name))


def test_ensure_samples_writes_each_report_once(tmp_path: Path) -> None:
    directory = tmp_path / "nested" / "samples"
    paths = ensure_samples(directory)
    assert [path.name for path in paths] == sorted(PDFS)
    assert all(path.read_bytes() == PDFS[path.name] for path in paths)
    written = {path: path.stat().st_mtime_ns for path in paths}
    paths[0].write_bytes(b"stale")

    assert ensure_samples(directory) == paths
    assert paths[0].read_bytes() == PDFS[paths[0].name]
    assert all(path.stat().st_mtime_ns == written[path] for path in paths[1:])


@pytest.mark.parametrize(
    ("file_name", "categories"),
    [
        ("01-cbc-metabolic-panel.pdf", [["labs"], ["labs"]]),
        ("02-diabetes-follow-up.pdf", [["labs"], ["labs"], ["diagnoses", "procedures"]]),
        ("03-colonoscopy-discharge.pdf", [["procedures"], ["labs", "diagnoses"]]),
        ("04-hereditary-cancer-panel.pdf", [["genetics"], ["diagnoses", "procedures"]]),
        ("05-ct-chest.pdf", [["diagnoses", "procedures", "imaging"], ["other"]]),
    ],
)
def test_pages_are_tagged_with_their_categories(file_name: str, categories: list[list[str]]) -> None:
    pages = pages_of(file_name)
    assert [page.number for page in pages] == list(range(1, len(categories) + 1))
    assert [page.categories for page in pages] == categories


def test_scanned_page_has_no_text_and_category_other() -> None:
    first, scan = pages_of("05-ct-chest.pdf")
    assert first.text.startswith("Metro Imaging Center - Radiology Report\n")
    assert scan.text == ""
    assert scan.categories == ["other"]
    assert extract_from_text(scan.text, scan.number) == Findings()


def test_lab_rows_keep_name_value_unit_range_and_printed_flag() -> None:
    biomarkers = {(b.page, b.name): b for b in findings_of("01-cbc-metabolic-panel.pdf").biomarkers}
    assert len(biomarkers) == 16
    rbc = biomarkers[(1, "RBC")]
    assert (rbc.value, rbc.unit, rbc.reference_range, rbc.flag) == (4.1, "x10^6/uL", "4.20-5.40", "L")
    glucose = biomarkers[(2, "Glucose, fasting")]
    assert (glucose.value, glucose.unit, glucose.reference_range, glucose.flag) == (112.0, "mg/dL", "70-99", "H")
    egfr = biomarkers[(2, "eGFR")]
    assert (egfr.value, egfr.unit, egfr.reference_range, egfr.flag) == (58.0, "mL/min/1.73m2", ">60", "L")
    assert biomarkers[(1, "Platelets")].flag == "normal"


def test_flags_are_derived_from_the_range_when_the_lab_prints_none() -> None:
    rows = [
        (b.name, b.value, b.unit, b.reference_range, b.flag)
        for b in findings_of("02-diabetes-follow-up.pdf").biomarkers
        if b.page == 2
    ]
    assert rows == [
        ("Glycated hemoglobin", 57.0, "mmol/mol", "20-42", "H"),
        ("FBG", 7.9, "mmol/L", "3.9-5.5", "H"),
        ("LDL-C", 3.9, "mmol/L", "<2.6", "H"),
        ("Creatinine", 97.0, "umol/L", "45-90", "H"),
    ]


def test_diagnoses_keep_icd10_codes() -> None:
    diagnoses = findings_of("02-diabetes-follow-up.pdf").diagnoses
    assert [(d.icd10, d.description, d.page) for d in diagnoses] == [
        ("E11.65", "Type 2 diabetes mellitus with hyperglycemia", 3),
        ("E78.5", "Hyperlipidemia, unspecified", 3),
        ("I10", "Essential (primary) hypertension", 3),
    ]
    assert [d.icd10 for d in findings_of("03-colonoscopy-discharge.pdf").diagnoses] == ["D12.5", "K57.30", "K21.9"]


def test_procedures_keep_cpt_codes_and_dates() -> None:
    procedures = findings_of("03-colonoscopy-discharge.pdf").procedures
    assert [(p.cpt, p.description, p.date, p.page) for p in procedures] == [
        ("45385", "Colonoscopy with removal of polyp by snare technique", "2024-02-14", 1),
        ("43239", "Upper GI endoscopy with biopsy", "2024-02-14", 1),
        ("88305", "Surgical pathology, gross and microscopic examination", "2024-02-15", 1),
    ]
    assert [p.cpt for p in findings_of("05-ct-chest.pdf").procedures] == ["71260"]


def test_variants_keep_gene_hgvs_protein_and_classification() -> None:
    findings = findings_of("04-hereditary-cancer-panel.pdf")
    assert [(v.gene, v.transcript, v.hgvs, v.protein, v.classification) for v in findings.genetics] == [
        ("BRCA1", "NM_007294.4", "c.68_69delAG", "p.Glu23ValfsTer17", "Pathogenic"),
        ("CHEK2", "NM_007194.4", "c.1100delC", "p.Thr367MetfsTer15", "Likely pathogenic"),
        ("ATM", "NM_000051.4", "c.1229T>C", "p.Val410Ala", "Uncertain significance"),
    ]
    # The "Genes analyzed" list names genes without variants: no findings from it.
    assert findings.biomarkers == []
    assert [d.icd10 for d in findings.diagnoses] == ["Z15.01", "Z80.3"]


@pytest.mark.parametrize(
    ("value", "reference_range", "flag"),
    [
        (5.7, "4.0-5.6", "H"),
        (3.9, "4.0 - 5.6", "L"),
        (4.0, "4.0-5.6", "normal"),
        (201, "<200", "H"),
        (39, ">40", "L"),
        (40, ">=40", "normal"),
    ],
)
def test_flag_from_reference_range(value: float, reference_range: str, flag: str) -> None:
    assert flag_for(value, reference_range) == flag


def test_parse_range_gives_open_bounds() -> None:
    assert parse_range("<200") == (None, 200.0)
    assert parse_range(">40") == (40.0, None)
    assert parse_range("0.59-1.04") == (0.59, 1.04)


@pytest.mark.parametrize(
    "content",
    [b"not a pdf at all", PDFS["01-cbc-metabolic-panel.pdf"][:2000], b""],
    ids=["garbage", "truncated", "empty"],
)
def test_unreadable_pdf_raises_a_clear_error(content: bytes) -> None:
    with pytest.raises(UnreadablePdfError, match="not a readable PDF"):
        extract_page_texts(content)


def encrypted_pdf(user_password: str) -> bytes:
    pdf = FPDF()
    pdf.set_encryption(owner_password="owner", user_password=user_password)
    pdf.add_page()
    pdf.set_font("Helvetica")
    pdf.cell(0, 10, "Sodium 139 mmol/L 136-145")
    return bytes(pdf.output())


def test_pdf_restricted_by_an_owner_password_only_is_read() -> None:
    assert extract_page_texts(encrypted_pdf(user_password="")) == ["Sodium 139 mmol/L 136-145"]


def test_password_protected_pdf_raises_a_clear_error() -> None:
    with pytest.raises(UnreadablePdfError, match="password-protected"):
        extract_page_texts(encrypted_pdf(user_password="secret"))
