"""Rule-based extraction of findings from report text, one line at a time.

Lab reports print one result per row: `name value unit range [flag]`; the range is required so that prose such
as "repeat in 3 months" is not read as a result. Diagnoses and procedures are rows that
start with their code (ICD-10, CPT); variants are rows with a gene symbol followed by an HGVS coding change.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from phoenix.stages.models import Biomarker, Diagnosis, Findings, Flag, GeneticVariant, Page, Procedure

_NUMBER = r"\d+(?:\.\d+)?"
_RANGE = rf"{_NUMBER}\s*-\s*{_NUMBER}|[<>]=?\s*{_NUMBER}"

BIOMARKER_ROW = re.compile(
    rf"^(?P<name>[A-Za-z].*?)\s+(?P<value>{_NUMBER})\s+(?P<unit>[^\s\d]\S*)"
    rf"\s+(?P<range>{_RANGE})(?:\s+(?P<flag>H|L))?$"
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
    """`4.0-5.6` -> (4.0, 5.6); `<200` -> (None, 200); `>40` -> (40, None)."""
    text = text.replace(" ", "")
    if text[0] in "<>":
        bound = float(text.lstrip("<>="))
        return (None, bound) if text[0] == "<" else (bound, None)
    low, high = text.split("-")
    return float(low), float(high)


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
    return findings


def extract_from_text(text: str, page: int) -> Findings:
    findings = Findings()
    for raw_line in text.splitlines():
        line = " ".join(raw_line.split())
        # Coded rows first: "E11.9 Type 2 diabetes" also has the shape of a lab row.
        if match := VARIANT_ROW.match(line):
            findings.genetics.append(GeneticVariant(**match.groupdict(), page=page))
        elif match := DIAGNOSIS_ROW.match(line):
            findings.diagnoses.append(Diagnosis(icd10=match["code"], description=match["description"], page=page))
        elif match := PROCEDURE_ROW.match(line):
            findings.procedures.append(
                Procedure(cpt=match["code"], description=match["description"], date=match["date"], page=page)
            )
        elif match := BIOMARKER_ROW.match(line):
            value, reference_range = float(match["value"]), match["range"]
            findings.biomarkers.append(
                Biomarker(
                    name=match["name"].strip(),
                    value=value,
                    unit=match["unit"],
                    reference_range=reference_range,
                    # The printed flag wins: labs may apply age- or sex-specific limits the range omits.
                    flag=match["flag"] or flag_for(value, reference_range),
                    page=page,
                )
            )
    return findings
