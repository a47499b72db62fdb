"""`make eval`: precision and recall of the rule-based extraction over the corpus (corpus.py).

A result counts as found when extraction reports the same (name, value, unit, flag) as expected; each report's
results are compared as multisets. The page reader in use (PDFium with column gaps, Tesseract for scans) is
scored against pypdf's plain text as a baseline. Exits 1 when the reader misses a target.
"""

from __future__ import annotations

import io
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pypdf import PdfReader

from phoenix.stages.categories import tag_pages
from phoenix.stages.corpus import CORPUS, CorpusReport
from phoenix.stages.extraction import extract_findings
from phoenix.stages.models import Flag
from phoenix.stages.ocr import ocr_unavailable_reason
from phoenix.stages.pdf_text import extract_page_texts

MIN_PRECISION = 0.99
MIN_RECALL = 0.98

Key = tuple[str, float, str, Flag]


@dataclass(frozen=True)
class ReportScore:
    file_name: str
    expected: Counter[Key]
    found: Counter[Key]
    unparsed: int

    @property
    def matched(self) -> Counter[Key]:
        return self.expected & self.found

    @property
    def missed_flagged(self) -> list[Key]:
        return sorted((self.expected - self.found).keys() & {k for k in self.expected if k[3] in ("H", "L")})


@dataclass(frozen=True)
class Score:
    reports: list[ReportScore]

    def total(self, part: Callable[[ReportScore], Counter[Key]]) -> int:
        return sum(part(report).total() for report in self.reports)

    @property
    def precision(self) -> float:
        return self.total(lambda r: r.matched) / max(1, self.total(lambda r: r.found))

    @property
    def recall(self) -> float:
        return self.total(lambda r: r.matched) / max(1, self.total(lambda r: r.expected))

    @property
    def missed_flagged(self) -> list[Key]:
        return [key for report in self.reports for key in report.missed_flagged]

    def meets_targets(self) -> bool:
        return self.precision >= MIN_PRECISION and self.recall >= MIN_RECALL and not self.missed_flagged


def evaluate(reports: Sequence[CorpusReport], read_pages: Callable[[bytes], list[str]]) -> Score:
    scores = []
    for report in reports:
        findings = extract_findings(tag_pages(read_pages(report.pdf())))
        expected = Counter((r.name, float(r.value), r.unit, r.flag) for r in report.results)
        found = Counter((b.name, b.value, b.unit, b.flag) for b in findings.biomarkers)
        scores.append(ReportScore(report.file_name, expected, found, len(findings.unparsed)))
    return Score(scores)


def pypdf_texts(content: bytes) -> list[str]:
    """The baseline: pypdf's plain text of each page, as the router read pages before."""
    return [page.extract_text() for page in PdfReader(io.BytesIO(content)).pages]


def render(name: str, score: Score, *, list_misses: bool) -> list[str]:
    lines = [f"{name}:", f"  {'REPORT':34} {'EXPECTED':>8} {'FOUND':>6} {'MATCHED':>8} {'UNPARSED':>9}"]
    for r in score.reports:
        lines.append(
            f"  {r.file_name:34} {r.expected.total():>8} {r.found.total():>6} {r.matched.total():>8} {r.unparsed:>9}"
        )
    flagged = sum(1 for r in score.reports for k in r.expected.elements() if k[3] in ("H", "L"))
    lines.append(
        f"  precision {score.precision:.3f}  recall {score.recall:.3f}  "
        f"flagged (H/L) found {flagged - len(score.missed_flagged)}/{flagged}"
    )
    if list_misses:
        lines += [f"  missed flagged result: {key}" for key in score.missed_flagged]
    return lines


def main() -> int:
    reason = ocr_unavailable_reason()
    if reason:
        print(f"OCR unavailable: {reason}; the scanned report cannot be read")
    reader = evaluate(CORPUS, lambda content: extract_page_texts(content, ocr=reason is None))
    baseline = evaluate(CORPUS, pypdf_texts)
    total = sum(len(report.results) for report in CORPUS)
    print(f"Corpus: {len(CORPUS)} reports, {total} expected results (`python -m phoenix.stages.samples` writes them)\n")
    router_reader = "PDFium page reader with column gaps + Tesseract OCR (the router's)"
    print("\n".join(render(router_reader, reader, list_misses=True)))
    print("\n".join(render("pypdf plain text (baseline)", baseline, list_misses=False)))
    verdict = "met" if reader.meets_targets() else "MISSED"
    print(f"\nTargets (precision >= {MIN_PRECISION}, recall >= {MIN_RECALL}, every H/L result found): {verdict}")
    return 0 if reader.meets_targets() else 1


if __name__ == "__main__":
    sys.exit(main())
