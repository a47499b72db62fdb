"""Tag each page with what it reports, so readers can skip pages that carry no findings."""

from __future__ import annotations

import re

from phoenix.stages.extraction import extract_from_text
from phoenix.stages.models import Category, Page

# Modality names are matched case-sensitively: "CT" and "PET" are acronyms, "ct" and "pet" are not.
IMAGING_TERMS = re.compile(
    r"\b(?:CT|MRI|PET|X-ray)\b|\b(?i:radiology|radiograph\w*|ultrasound|sonograph\w*|mammogra\w*)\b"
)


def categorize(text: str) -> list[Category]:
    """The categories of one page's text; `other` when it has none (cover pages, scans without text)."""
    found = extract_from_text(text, page=0)
    categories = [
        category
        for category, items in (
            (Category.LABS, found.biomarkers),
            (Category.DIAGNOSES, found.diagnoses),
            (Category.PROCEDURES, found.procedures),
            (Category.GENETICS, found.genetics),
        )
        if items
    ]
    if IMAGING_TERMS.search(text):
        categories.append(Category.IMAGING)
    return categories or [Category.OTHER]


def tag_pages(texts: list[str]) -> list[Page]:
    return [Page(number=number, text=text, categories=categorize(text)) for number, text in enumerate(texts, 1)]
