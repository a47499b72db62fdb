"""The data the stages pass to each other through Redis, as JSON."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, TypeAdapter

Flag = Literal["H", "L", "A", "normal"]  # A: printed as abnormal without a direction
Comparator = Literal["<", "<=", ">", ">="]  # a censored value: "<0.5" is below the assay's limit


class Category(StrEnum):
    LABS = "labs"
    DIAGNOSES = "diagnoses"
    PROCEDURES = "procedures"
    GENETICS = "genetics"
    IMAGING = "imaging"
    OTHER = "other"


class Page(BaseModel):
    number: int  # 1-based, as printed
    text: str
    categories: list[Category]


PageList = TypeAdapter(list[Page])


class Biomarker(BaseModel):
    name: str  # as printed in the report
    value: float
    comparator: Comparator | None = None
    unit: str
    reference_range: str | None = None
    flag: Flag = "normal"
    page: int


class Diagnosis(BaseModel):
    icd10: str
    description: str
    page: int


class Procedure(BaseModel):
    cpt: str
    description: str
    date: str | None = None  # ISO date when the report gives one
    page: int


class GeneticVariant(BaseModel):
    gene: str
    hgvs: str  # coding DNA change, e.g. c.68_69delAG
    transcript: str | None = None
    protein: str | None = None
    classification: str | None = None
    page: int


class UnparsedRow(BaseModel):
    """A line that looks like a result (a name, a number, a unit or range) but fits no grammar."""

    text: str
    page: int


class Findings(BaseModel):
    biomarkers: list[Biomarker] = []
    diagnoses: list[Diagnosis] = []
    procedures: list[Procedure] = []
    genetics: list[GeneticVariant] = []
    unparsed: list[UnparsedRow] = []

    def is_empty(self) -> bool:
        return not (self.biomarkers or self.diagnoses or self.procedures or self.genetics)


class Measurement(BaseModel):
    """One biomarker result inside a group, with its value in the group's unit when a conversion is known."""

    name: str
    value: float
    comparator: Comparator | None = None
    unit: str
    normalized_value: float | None
    flag: Flag
    reference_range: str | None
    page: int


class BiomarkerGroup(BaseModel):
    name: str  # canonical name, e.g. "HbA1c"
    unit: str  # canonical unit that normalized values are expressed in
    units: list[str] = []  # every unit seen, in order of appearance
    mixed_units: bool = False
    measurements: list[Measurement] = []


GroupList = TypeAdapter(list[BiomarkerGroup])
