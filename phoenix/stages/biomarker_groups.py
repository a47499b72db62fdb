"""Group biomarkers under canonical names, so one test reported under several names and units reads as one."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from phoenix.stages.models import Biomarker, BiomarkerGroup, Measurement


@dataclass(frozen=True)
class CanonicalTest:
    name: str
    unit: str
    aliases: tuple[str, ...]
    # unit -> (factor, offset): value in `unit` * factor + offset = value in the canonical unit.
    conversions: Mapping[str, tuple[float, float]] = field(default_factory=dict)


_CHOLESTEROL_MMOL = {"mmol/L": (38.67, 0.0)}
_SAME_COUNT = {"x10^9/L": (1.0, 0.0)}  # 10^9/L and 10^3/uL are the same quantity
_SAME_ION = {"mEq/L": (1.0, 0.0)}  # monovalent ions: one mEq is one mmol

CATALOG: tuple[CanonicalTest, ...] = (
    CanonicalTest(
        "HbA1c",
        "%",
        (
            "HbA1c",
            "Hemoglobin A1c",
            "Haemoglobin A1c",
            "A1c",
            "Glycated hemoglobin",
            "Glycosylated hemoglobin",
        ),
        {"mmol/mol": (0.0915, 2.15)},  # NGSP % from IFCC mmol/mol (the master equation)
    ),
    CanonicalTest(
        "Fasting glucose",
        "mg/dL",
        (
            "Glucose, fasting",
            "Fasting glucose",
            "FBG",
            "Fasting blood glucose",
            "FPG",
            "Fasting plasma glucose",
        ),
        {"mmol/L": (18.016, 0.0)},
    ),
    CanonicalTest("Glucose", "mg/dL", ("Glucose", "Blood glucose", "Random glucose"), {"mmol/L": (18.016, 0.0)}),
    CanonicalTest(
        "Total cholesterol",
        "mg/dL",
        ("Total cholesterol", "Cholesterol, total", "Cholesterol", "TC"),
        _CHOLESTEROL_MMOL,
    ),
    CanonicalTest(
        "LDL-C",
        "mg/dL",
        (
            "LDL-C",
            "LDL Cholesterol",
            "LDL",
            "Low-density lipoprotein cholesterol",
            "LDL cholesterol, calculated",
        ),
        _CHOLESTEROL_MMOL,
    ),
    CanonicalTest(
        "HDL-C",
        "mg/dL",
        ("HDL-C", "HDL Cholesterol", "HDL", "High-density lipoprotein cholesterol"),
        _CHOLESTEROL_MMOL,
    ),
    CanonicalTest("Triglycerides", "mg/dL", ("Triglycerides", "TG", "Trig"), {"mmol/L": (88.57, 0.0)}),
    CanonicalTest("Creatinine", "mg/dL", ("Creatinine", "Creat", "Serum creatinine"), {"umol/L": (1 / 88.42, 0.0)}),
    CanonicalTest("eGFR", "mL/min/1.73m2", ("eGFR", "Estimated GFR", "GFR, estimated")),
    CanonicalTest("BUN", "mg/dL", ("BUN", "Blood urea nitrogen", "Urea nitrogen"), {"mmol/L": (2.801, 0.0)}),
    CanonicalTest("Sodium", "mmol/L", ("Sodium", "Na"), _SAME_ION),
    CanonicalTest("Potassium", "mmol/L", ("Potassium", "K"), _SAME_ION),
    CanonicalTest("Chloride", "mmol/L", ("Chloride", "Cl"), _SAME_ION),
    CanonicalTest("Calcium", "mg/dL", ("Calcium", "Ca", "Total calcium"), {"mmol/L": (4.008, 0.0)}),
    CanonicalTest("ALT", "U/L", ("ALT", "Alanine aminotransferase", "SGPT")),
    CanonicalTest("AST", "U/L", ("AST", "Aspartate aminotransferase", "SGOT")),
    CanonicalTest("Hemoglobin", "g/dL", ("Hemoglobin", "Haemoglobin", "Hgb", "Hb"), {"g/L": (0.1, 0.0)}),
    CanonicalTest("Hematocrit", "%", ("Hematocrit", "Haematocrit", "Hct")),
    CanonicalTest("WBC", "x10^3/uL", ("WBC", "White blood cells", "White blood cell count", "Leukocytes"), _SAME_COUNT),
    CanonicalTest("RBC", "x10^6/uL", ("RBC", "Red blood cells", "Erythrocytes"), {"x10^12/L": (1.0, 0.0)}),
    CanonicalTest("Platelets", "x10^3/uL", ("Platelets", "PLT", "Platelet count"), _SAME_COUNT),
    CanonicalTest("MCV", "fL", ("MCV", "Mean corpuscular volume")),
)


def name_key(name: str) -> str:
    """Case, punctuation and spacing do not distinguish tests: "LDL-C" and "ldl c" are one name."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", name.lower()).split())


def unit_key(unit: str) -> str:
    return unit.lower().replace("\u00b5", "u").replace("\u03bc", "u")


_BY_ALIAS: dict[str, CanonicalTest] = {name_key(alias): test for test in CATALOG for alias in test.aliases}


def canonical_test(biomarker: Biomarker) -> CanonicalTest:
    """The catalog entry for this name; a test not in the catalog is its own group, in its own unit."""
    return _BY_ALIAS.get(name_key(biomarker.name)) or CanonicalTest(biomarker.name, biomarker.unit, ())


def normalize(value: float, unit: str, test: CanonicalTest) -> float | None:
    """The value in the test's canonical unit, or None when no conversion from `unit` is known."""
    if unit_key(unit) == unit_key(test.unit):
        return value
    for known_unit, (factor, offset) in test.conversions.items():
        if unit_key(unit) == unit_key(known_unit):
            return round(value * factor + offset, 2)
    return None


def group_biomarkers(biomarkers: Iterable[Biomarker]) -> list[BiomarkerGroup]:
    """Groups in order of first appearance; measurements keep their printed name, value and unit."""
    groups: dict[str, tuple[CanonicalTest, BiomarkerGroup]] = {}
    for biomarker in biomarkers:
        found = canonical_test(biomarker)
        # The first result of a test outside the catalog fixes its group's unit.
        test, group = groups.setdefault(name_key(found.name), (found, BiomarkerGroup(name=found.name, unit=found.unit)))
        if biomarker.unit not in group.units:
            group.units.append(biomarker.unit)
        group.mixed_units = len({unit_key(unit) for unit in group.units}) > 1
        group.measurements.append(
            Measurement(
                name=biomarker.name,
                value=biomarker.value,
                comparator=biomarker.comparator,
                unit=biomarker.unit,
                normalized_value=normalize(biomarker.value, biomarker.unit, test),
                flag=biomarker.flag,
                reference_range=biomarker.reference_range,
                page=biomarker.page,
            )
        )
    return [group for _, group in groups.values()]
