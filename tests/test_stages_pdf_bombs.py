"""PDF bombs through a real `phoenix worker` running the router (with Tesseract) on the embedded Valkey: a few
kilobytes that describe hundreds of megabytes of pixels. Each is read or refused with the reason within +64 MiB
of the worker's resident memory (docs/durability.md, "Hostile documents")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.stages.ocr import ocr_unavailable_reason
from tests.fixtures.eventually import wait_until
from tests.fixtures.memory import rss_peak
from tests.fixtures.pdf_bombs import big_image_page, image_pages, tiny_runs_page
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.workers import WorkerPool, WorkerProcess

pytestmark = [
    pytest.mark.ocr,
    pytest.mark.skipif(ocr_unavailable_reason() is not None, reason=str(ocr_unavailable_reason())),
]

ROUTER = StageKeys.for_stage("router")
OUTPUT = "phoenix:{default}:router:routed"
BOUND_MIB = 64  # what a bomb may add
WORST_PAGE_MIB = 96  # what a page at the caps may add: a color image of MAX_PAGE_PIXELS, rendered at the cap
BOMBS = {
    # name: (document, the DLQ reason or None: routed, the bound in MiB)
    "forty-pages": (lambda: image_pages(40), None, BOUND_MIB),  # 15 KB: 40 pages to render at 3.9 Mpx each
    "huge-page": (lambda: image_pages(1, (2100, 2970)), "needs 386710896 pixels at 200 dpi", BOUND_MIB),  # 1 KB
    "500-pages": (lambda: image_pages(500), "500 pages, more than MAX_DOCUMENT_PAGES (200)", BOUND_MIB),
    "gray-image": (lambda: big_image_page(7500), "hold 56250000 pixels, more than MAX_PAGE_PIXELS", BOUND_MIB),
    "fax-image": (lambda: big_image_page(8000, "1"), None, BOUND_MIB),  # 64 Mpx bilevel, counted 8 Mpx: read
    "tiny-runs": (lambda: tiny_runs_page(20_000), "20000 text runs, more than 2000", BOUND_MIB),
    "color-image": (lambda: big_image_page(3160, "RGB"), None, WORST_PAGE_MIB),  # 9.99 Mpx in color: read
}


async def _finished(redis: aioredis.Redis, done: int, worker: WorkerProcess) -> bool:
    """The record routed or dead-lettered, or the worker gone (killed by rss_peak's ceiling)."""
    return await redis.xlen(ROUTER.dlq) + await redis.xlen(OUTPUT) > done or not worker.alive


@pytest.mark.timeout(180)
async def test_pdf_bombs_are_read_or_refused_within_the_memory_bound(
    redis: aioredis.Redis, workers: WorkerPool, tmp_path: Path
) -> None:
    root = tmp_path / "docs"
    root.mkdir()
    for name, (document, *_) in {"warm-up": (lambda: image_pages(1), None, 0), **BOMBS}.items():
        (root / f"{name}.pdf").write_bytes(document())
    worker = workers.start("router", processor="router", OUTPUT_QUEUE=OUTPUT, DOCUMENT_ROOT=str(root))
    # The first document loads PDFium, PIL and the OCR path: what every later one starts from.
    await add_entry(redis, ROUTER.input, {"record_id": "warm-up", "document_url": (root / "warm-up.pdf").as_uri()})
    await wait_until(lambda: _finished(redis, 0, worker), "the warm-up document routed", timeout=60)

    growth = {}
    for done, name in enumerate(BOMBS, start=1):
        with rss_peak(worker.pid) as peak:
            await add_entry(redis, ROUTER.input, {"record_id": name, "document_url": (root / f"{name}.pdf").as_uri()})
            await wait_until(
                lambda done=done: _finished(redis, done, worker), f"{name} routed or dead-lettered", timeout=90
            )
        growth[name] = round(peak.growth_mib, 1)
        assert not peak.killed, f"{name}: the worker passed +512 MiB and was killed ({growth})"
    print("peak RSS growth (MiB):", growth)  # the figures docs/durability.md quotes
    assert all(growth[name] < bound for name, (*_, bound) in BOMBS.items()), growth

    dead = {fields["record_id"]: fields for _, fields in await stream_entries(redis, ROUTER.dlq)}
    routed = {fields["record_id"]: json.loads(fields["data"]) for _, fields in await stream_entries(redis, OUTPUT)}
    for name, (_, reason, _) in BOMBS.items():
        if reason is None:
            assert routed[name]["page_count"] == (40 if name == "forty-pages" else 1)
        else:
            assert (dead[name]["error_type"], dead[name]["attempts"]) == ("UnreadableDocumentError", "1")
            assert f"{name}.pdf: " in dead[name]["error"] and reason in dead[name]["error"], dead[name]["error"]
    assert worker.alive
