"""The result-row grammar on hand-written rows in the forms real reports print (none from the corpus)."""

from __future__ import annotations

import pytest

from phoenix.stages.extraction import extract_from_text, parse_range
from phoenix.stages.models import Findings, UnparsedRow


def only_biomarker(line: str) -> tuple[object, ...]:
    findings = extract_from_text(line, page=3)
    assert findings.unparsed == []
    (b,) = findings.biomarkers
    assert b.page == 3
    return b.name, b.value, b.comparator, b.unit, b.reference_range, b.flag


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # A flag printed before the unit, after it, after the range, or glued to the value.
        ("Glucose, Fasting 131 H mg/dL 70-99", ("Glucose, Fasting", 131, None, "mg/dL", "70-99", "H")),
        ("Glucose 131 mg/dL H 70-99", ("Glucose", 131, None, "mg/dL", "70-99", "H")),
        ("Potassium 3.1 mmol/L 3.5-5.1 L", ("Potassium", 3.1, None, "mmol/L", "3.5-5.1", "L")),
        ("Creatinine 1.32H mg/dL 0.57-1.00", ("Creatinine", 1.32, None, "mg/dL", "0.57-1.00", "H")),
        ("ALT 88 (H) U/L 7-35", ("ALT", 88, None, "U/L", "7-35", "H")),
        # `name: value` and parenthesised or bracketed or labelled ranges.
        ("Hemoglobin A1c: 7.4 % (4.0 - 5.6)", ("Hemoglobin A1c", 7.4, None, "%", "4.0-5.6", "H")),
        ("Ferritin: 12 ng/mL [15-150]", ("Ferritin", 12, None, "ng/mL", "15-150", "L")),
        ("25-OH Vitamin D 28 ng/mL Ref: 30-100", ("25-OH Vitamin D", 28, None, "ng/mL", "30-100", "L")),
        ("TSH 2.1 uIU/mL Reference range: 0.45-4.50", ("TSH", 2.1, None, "uIU/mL", "0.45-4.50", "normal")),
        # Dashes and words between the bounds, open ranges with <, >, <=, >=, and their Unicode forms.
        ("Sodium 139 mmol/L 136\u2013145", ("Sodium", 139, None, "mmol/L", "136-145", "normal")),
        ("Chloride 97 mmol/L 98\u2014107", ("Chloride", 97, None, "mmol/L", "98-107", "L")),
        ("Bicarbonate 18 mmol/L 22 to 29", ("Bicarbonate", 18, None, "mmol/L", "22-29", "L")),
        ("LDL Cholesterol 138 mg/dL <100", ("LDL Cholesterol", 138, None, "mg/dL", "<100", "H")),
        ("HDL 35 mg/dL >40", ("HDL", 35, None, "mg/dL", ">40", "L")),
        ("Troponin T 16 ng/L <=14", ("Troponin T", 16, None, "ng/L", "<=14", "H")),
        ("Hemoglobin 13.1 g/dL \u226512.0", ("Hemoglobin", 13.1, None, "g/dL", ">=12.0", "normal")),
        # Flag words and letters.
        ("Glucose 131 High mg/dL 65-99", ("Glucose", 131, None, "mg/dL", "65-99", "H")),
        ("Ferritin 12 Low ng/mL 15-150", ("Ferritin", 12, None, "ng/mL", "15-150", "L")),
        ("Potassium 4.1 N mmol/L 3.5-5.1", ("Potassium", 4.1, None, "mmol/L", "3.5-5.1", "normal")),
        ("TSH 2.1 uIU/mL 0.45-4.50 Normal", ("TSH", 2.1, None, "uIU/mL", "0.45-4.50", "normal")),
        ("Potassium 6.8 HH mmol/L 3.5-5.1", ("Potassium", 6.8, None, "mmol/L", "3.5-5.1", "H")),
        ("Glucose 38 LL mg/dL 70-99", ("Glucose", 38, None, "mg/dL", "70-99", "L")),
        ("Lactate 4.2 Critical mmol/L 0.5-2.2", ("Lactate", 4.2, None, "mmol/L", "0.5-2.2", "H")),
        ("Sodium 118 Critical Low mmol/L 136-145", ("Sodium", 118, None, "mmol/L", "136-145", "L")),
        ("Urine protein 30 A mg/dL <15", ("Urine protein", 30, None, "mg/dL", "<15", "H")),
        ("WBC 12.1 x10^9/L 4.0-11.0 Abnormal", ("WBC", 12.1, None, "x10^9/L", "4.0-11.0", "H")),
        # An abnormal flag the range cannot explain keeps the lab's word for it.
        ("Lipemia index 40 A mg/dL 0-100", ("Lipemia index", 40, None, "mg/dL", "0-100", "A")),
        # Thousands separators and censored values, whose comparator is kept.
        ("Vitamin B12 1,234 pg/mL 232-1245", ("Vitamin B12", 1234, None, "pg/mL", "232-1245", "normal")),
        ("Triglycerides 1,560 mg/dL <150 H", ("Triglycerides", 1560, None, "mg/dL", "<150", "H")),
        ("CRP <0.5 mg/L 0.0-5.0", ("CRP", 0.5, "<", "mg/L", "0.0-5.0", "normal")),
        ("eGFR >60 mL/min/1.73m2 >59", ("eGFR", 60, ">", "mL/min/1.73m2", ">59", "normal")),
        # Units with ^, *, /, %, x10E3, braces; a unit without a range when it is a lab unit.
        ("WBC 7.2 10*3/uL 3.4-10.8", ("WBC", 7.2, None, "10*3/uL", "3.4-10.8", "normal")),
        ("Platelets 451 x10E3/uL 150-450 H", ("Platelets", 451, None, "x10E3/uL", "150-450", "H")),
        ("RBC 4.10 x10^6/uL 4.20-5.40", ("RBC", 4.1, None, "x10^6/uL", "4.20-5.40", "L")),
        ("eGFR 58 mL/min/{1.73_m2} >59", ("eGFR", 58, None, "mL/min/{1.73_m2}", ">59", "L")),
        ("Albumin 4.1 g/dL", ("Albumin", 4.1, None, "g/dL", None, "normal")),
    ],
)
def test_row_forms(line: str, expected: tuple[object, ...]) -> None:
    assert only_biomarker(line) == expected


def test_header_names_the_columns_and_unknown_columns_are_skipped() -> None:
    text = "\n".join(
        [
            "Tests\tCurrent Result and Flag\tPrevious Result and Date\tUnits\tReference Interval",
            "Glucose\t131 High\t118 01/12/2024\tmg/dL\t65-99",
            "BUN\t18\tmg/dL\t6-24",  # no previous result: the empty cell is not printed
            "Test\tResult\tFlag\tUnits\tReference Interval\tLab",  # a second table on the same page
            "POTASSIUM\t5.6\tH\tmmol/L\t3.5-5.3\tEZ",
            "HS CRP\t<0.2\tmg/L\t<1.0\tEZ",
        ]
    )
    biomarkers = extract_from_text(text, 1).biomarkers
    rows = [(b.name, b.value, b.comparator, b.unit, b.reference_range, b.flag) for b in biomarkers]
    assert rows == [
        ("Glucose", 131, None, "mg/dL", "65-99", "H"),
        ("BUN", 18, None, "mg/dL", "6-24", "normal"),
        ("POTASSIUM", 5.6, None, "mmol/L", "3.5-5.3", "H"),
        ("HS CRP", 0.2, "<", "mg/L", "<1.0", "normal"),
    ]


def test_without_the_header_an_unknown_column_leaves_the_row_unparsed_not_lost() -> None:
    findings = extract_from_text("Glucose\t131 High\t118 01/12/2024\tmg/dL\t65-99", page=2)
    assert findings.biomarkers == []
    assert findings.unparsed == [UnparsedRow(text="Glucose 131 High 118 01/12/2024 mg/dL 65-99", page=2)]


@pytest.mark.parametrize(
    "line",
    [
        "Lipase 1O2 U/L 13-60",  # an OCR misread: letter O for zero
        "Glucose 131 118 mg/dL 65-99",  # two numbers before the unit: which is the result?
        "Sodium 139 mmol/L 136-145 see note 4",
        "22.4 L ng/mL 30.0-100.0",  # a row whose name was printed elsewhere
    ],
)
def test_result_like_lines_that_do_not_parse_are_kept_with_their_page(line: str) -> None:
    assert extract_from_text(line, page=5) == Findings(unparsed=[UnparsedRow(text=line, page=5)])


@pytest.mark.parametrize(
    "line",
    [
        "Follow-up: surveillance colonoscopy in 3 years.",
        "Plan: increase metformin to 1000 mg twice daily; repeat HbA1c in 3 months.",
        "Patient: Maria Example DOB: 1968-04-12 Sex: F MRN: 000123",
        "Patient: Jordan Sample DOB: 1975-09-30 Sex: M Specimen: 24-118-0042",
        "Findings: a 6 mm solid nodule in the right upper lobe.",
        "Northside Clinical Laboratory - Collected 2024-03-04 07:45",
        "Flags: H = above the reference range, L = below the reference range.",
        "2024-03-04 07:45",
        "1 of 2",
    ],
)
def test_prose_and_letterheads_are_neither_results_nor_unparsed(line: str) -> None:
    assert extract_from_text(line, page=1) == Findings()


@pytest.mark.parametrize(
    ("text", "bounds"),
    [
        ("4.0-5.6", (4.0, 5.6)),
        ("136\u2013145", (136.0, 145.0)),
        ("(0.5 to 1.2)", (0.5, 1.2)),
        ("1,000-2,000", (1000.0, 2000.0)),
        ("<=14", (None, 14.0)),
        ("\u226540", (40.0, None)),
    ],
)
def test_parse_range_reads_every_printed_form(text: str, bounds: tuple[float | None, float | None]) -> None:
    assert parse_range(text) == bounds


def test_parse_range_rejects_what_is_not_a_range() -> None:
    with pytest.raises(ValueError, match="not a reference range"):
        parse_range("see note")
