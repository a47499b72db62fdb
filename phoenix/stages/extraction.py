"""Rule-based extraction of findings from report text, one line at a time.

Result rows follow the grammar in result_rows.py. Diagnoses and procedures are rows that start with their code
(ICD-10, CPT); variants are rows with a gene symbol followed by an HGVS coding change. A line that looks like a
result but fits no grammar is kept as an unparsed row, so nothing is lost without a trace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from phoenix.stages.models import (
    Biomarker,
    Diagnosis,
    Findings,
    Flag,
    GeneticVariant,
    Page,
    Procedure,
    UnparsedRow,
)
from phoenix.stages.result_rows import (
    CELL_SEPARATOR,
    RANGE,
    ResultRow,
    Role,
    header_roles,
    looks_like_result,
    parse_row,
    parse_table_row,
)

# ICD-10-CM: a letter (U is reserved), two characters, then an optional dot and up to four more.
DIAGNOSIS_ROW = re.compile(r"^(?P<code>[A-TV-Z]\d[0-9A-Z](?:\.[0-9A-Z]{1,4})?)\s+(?P<description>[A-Za-z].*)$")
# CPT: five digits, or four and a category II/III letter; a trailing ISO date is the date of service.
PROCEDURE_ROW = re.compile(
    r"^(?P<code>\d{4}[0-9FT])\s+(?P<description>[A-Za-z].*?)(?:\s+(?P<date>\d{4}-\d{2}-\d{2}))?$"
)
VARIANT_ROW = re.compile(
    r"^(?P<gene>[A-Z][A-Z0-9]{1,9})\s+(?:(?P<transcript>N[MC]_\d+\.\d+)[:\s]\s*)?"
    r"(?P<hgvs>c\.[-*]?\d+(?:[-+]\d+)?(?:_[-*]?\d+(?:[-+]\d+)?)?(?:[ACGT]>[ACGT]|delins[ACGT]+|del[ACGT]*|dup[ACGT]*|ins[ACGT]+))"
    r"(?:\s+\(?(?P<protein>p\.[A-Za-z0-9*=]+)\)?)?"
    r"(?:\s+(?:Heterozygous|Homozygous|Hemizygous))?"
    r"(?:\s+(?P<classification>Pathogenic|Likely pathogenic|Uncertain significance|Likely benign|Benign))?$"
)


def parse_range(text: str) -> tuple[float | None, float | None]:
    """`4.0-5.6`, `136-145` (any dash), `(0.5 to 1.2)` -> (low, high); `<200` -> (None, 200); `>=40` -> (40, None)."""
    match = RANGE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a reference range: {text!r}")
    if match["low"]:
        return float(match["low"].replace(",", "")), float(match["high"].replace(",", ""))
    bound = float(match["bound"].replace(",", ""))
    return (None, bound) if match["bound_op"] in ("<", "<=", "≤") else (bound, None)


def flag_for(value: float, reference_range: str) -> Flag:
    """The flag a lab would print: above the range H, below L."""
    low, high = parse_range(reference_range)
    if high is not None and value > high:
        return "H"
    if low is not None and value < low:
        return "L"
    return "normal"


def extract_findings(pages: Iterable[Page]) -> Findings:
    findings = Findings()
    for page in pages:
        found = extract_from_text(page.text, page.number)
        findings.biomarkers += found.biomarkers
        findings.diagnoses += found.diagnoses
        findings.procedures += found.procedures
        findings.genetics += found.genetics
        findings.unparsed += found.unparsed
    return findings


def extract_from_text(text: str, page: int) -> Findings:
    findings = Findings()
    roles: list[Role] | None = None  # the columns named by the last header row on this page
    for raw_line in text.splitlines():
        cells = [" ".join(cell.split()) for cell in raw_line.split(CELL_SEPARATOR) if cell.strip()]
        line = " ".join(cells)
        if not line:
            continue
        # Coded rows first: "E11.9 Type 2 diabetes" also has the shape of a lab row.
        if match := VARIANT_ROW.match(line):
            findings.genetics.append(GeneticVariant(**match.groupdict(), page=page))
        elif match := DIAGNOSIS_ROW.match(line):
            findings.diagnoses.append(Diagnosis(icd10=match["code"], description=match["description"], page=page))
        elif match := PROCEDURE_ROW.match(line):
            findings.procedures.append(
                Procedure(cpt=match["code"], description=match["description"], date=match["date"], page=page)
            )
        elif header := header_roles(cells):
            roles = header
        elif row := (roles and len(cells) > 1 and parse_table_row(cells, roles)) or parse_row(line):
            findings.biomarkers.append(biomarker(row, page))
        elif looks_like_result(line):
            findings.unparsed.append(UnparsedRow(text=line, page=page))
    return findings


def biomarker(row: ResultRow, page: int) -> Biomarker:
    # The printed flag wins: labs may apply age- or sex-specific limits the range omits.
    derived = flag_for(row.value, row.reference_range) if row.reference_range else "normal"
    if row.printed_flag is not None:
        flag = row.printed_flag
    elif row.abnormal:
        flag = derived if derived != "normal" else "A"
    else:
        flag = derived
    return Biomarker(
        name=row.name,
        value=row.value,
        comparator=row.comparator,
        unit=row.unit or "",
        reference_range=row.reference_range,
        flag=flag,
        page=page,
    )
