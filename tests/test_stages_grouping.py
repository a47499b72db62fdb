"""Canonical names and units for biomarkers reported under synonyms, abbreviations and different units."""

from __future__ import annotations

import pytest

from phoenix.stages.biomarker_groups import canonical_test, group_biomarkers, normalize
from phoenix.stages.models import Biomarker


def biomarker(name: str, value: float, unit: str, page: int = 1, reference_range: str = "0-1000") -> Biomarker:
    return Biomarker(name=name, value=value, unit=unit, reference_range=reference_range, page=page)


@pytest.mark.parametrize(
    ("printed", "canonical"),
    [
        ("Hemoglobin A1c", "HbA1c"),
        ("HbA1c", "HbA1c"),
        ("Glycated hemoglobin", "HbA1c"),
        ("Glucose, fasting", "Fasting glucose"),
        ("FBG", "Fasting glucose"),
        ("fasting  GLUCOSE", "Fasting glucose"),
        ("LDL Cholesterol", "LDL-C"),
        ("LDL-C", "LDL-C"),
        ("ldl c", "LDL-C"),
        ("Hemoglobin", "Hemoglobin"),
        ("Hgb", "Hemoglobin"),
        ("Glucose", "Glucose"),
    ],
)
def test_synonyms_and_abbreviations_share_a_canonical_name(printed: str, canonical: str) -> None:
    assert canonical_test(biomarker(printed, 1, "mg/dL")).name == canonical


@pytest.mark.parametrize(
    ("name", "value", "unit", "normalized"),
    [
        ("HbA1c", 57, "mmol/mol", 7.37),  # 57 * 0.0915 + 2.15
        ("FBG", 7.9, "mmol/L", 142.33),
        ("LDL-C", 3.9, "mmol/L", 150.81),
        ("Creatinine", 97, "umol/L", 1.1),
        ("Creatinine", 97, "\u00b5mol/L", 1.1),
        ("Sodium", 139, "mEq/L", 139),
        ("HbA1c", 7.4, "%", 7.4),
        ("Glucose", 5, "mg/L", None),  # no known conversion: left for a human
    ],
)
def test_values_are_normalized_to_the_canonical_unit(
    name: str, value: float, unit: str, normalized: float | None
) -> None:
    assert normalize(value, unit, canonical_test(biomarker(name, value, unit))) == normalized


def test_groups_gather_variants_of_one_test_and_flag_mixed_units() -> None:
    groups = group_biomarkers(
        [
            biomarker("Hemoglobin A1c", 7.4, "%", page=1),
            biomarker("Glucose, fasting", 131, "mg/dL", page=1),
            biomarker("Ferritin", 45, "ng/mL", page=1),
            biomarker("Glycated hemoglobin", 57, "mmol/mol", page=2),
            biomarker("FBG", 7.9, "mmol/L", page=2),
            biomarker("HbA1c", 7.1, "%", page=3),
            biomarker("ferritin", 101, "ug/L", page=3),
        ]
    )
    assert [(g.name, g.unit, g.units, g.mixed_units) for g in groups] == [
        ("HbA1c", "%", ["%", "mmol/mol"], True),
        ("Fasting glucose", "mg/dL", ["mg/dL", "mmol/L"], True),
        # Not in the catalog: its own group, in the unit it was first reported in.
        ("Ferritin", "ng/mL", ["ng/mL", "ug/L"], True),
    ]
    hba1c, glucose, ferritin = groups
    assert [(m.name, m.value, m.unit, m.normalized_value, m.page) for m in hba1c.measurements] == [
        ("Hemoglobin A1c", 7.4, "%", 7.4, 1),
        ("Glycated hemoglobin", 57.0, "mmol/mol", 7.37, 2),
        ("HbA1c", 7.1, "%", 7.1, 3),
    ]
    assert [m.normalized_value for m in glucose.measurements] == [131.0, 142.33]
    assert [m.normalized_value for m in ferritin.measurements] == [45.0, None]


def test_units_differing_only_in_spelling_are_not_mixed() -> None:
    (group,) = group_biomarkers([biomarker("Creatinine", 97, "umol/L"), biomarker("Creat", 88, "\u00b5mol/L")])
    assert group.units == ["umol/L", "\u00b5mol/L"]
    assert group.mixed_units is False
    assert [m.normalized_value for m in group.measurements] == [1.1, 1.0]


def test_no_biomarkers_no_groups() -> None:
    assert group_biomarkers([]) == []
