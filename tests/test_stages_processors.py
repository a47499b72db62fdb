"""The three stage processors against a real Redis, real files and real HTTP servers."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import pytesseract
import pytest
import redis.asyncio as aioredis
import structlog
import structlog.testing
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import REGISTRY
from pydantic import SecretStr

from phoenix.keys import DEFAULT_NAMESPACE, input_stream
from phoenix.stages.corpus import CORPUS, faxed_scan
from phoenix.stages.data_keys import grouped_key, pages_key, parsed_key
from phoenix.stages.grouper import GrouperProcessor
from phoenix.stages.llm_extraction import LLMExtractionError, LLMReplyError
from phoenix.stages.models import Category, Findings, Page, PageList
from phoenix.stages.ocr import ocr_unavailable_reason
from phoenix.stages.parser import ParserProcessor
from phoenix.stages.router import RouterProcessor, UnreadableDocumentError
from phoenix.stages.samples import ensure_samples
from phoenix.worker_runtime import BaseProcessor, PermanentError, RateLimited, RecordNotFoundError, Routed
from phoenix.worker_runtime.billing import ApiKeyRejectedError, api_key_scope
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.chat_service import FINDINGS, ChatService, running_chat_service
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.replies import get_existing, stream_entries
from tests.fixtures.sample_stage import DLQ, add

P = TypeVar("P", bound=BaseProcessor)

DIABETES = "02-diabetes-follow-up.pdf"
CT_CHEST = "05-ct-chest.pdf"
NS = "lab-a"  # the KEY_NAMESPACE the stages below run in: their hand-offs are scoped by it


@pytest.fixture(autouse=True)
def document_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The router reads files only under DOCUMENT_ROOT: here the session's temporary directory, where every test
    writes its documents."""
    monkeypatch.setenv("DOCUMENT_ROOT", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {path.name: path for path in ensure_samples(tmp_path_factory.mktemp("samples"))}


async def started(processor: P, redis: aioredis.Redis) -> P:
    """What the runtime does before the first message (the stages read only KEY_NAMESPACE of the WorkerSettings)."""
    processor.redis = redis
    processor.settings = WorkerSettings(service_name="stage", processor="unused", key_namespace=NS)
    processor.logger = structlog.get_logger()
    await processor.initialize()
    return processor


async def one_output(router: RouterProcessor, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """What a router of one output forwards (a dict, never a Routed)."""
    result = await router.process(record_id, user_id, data)
    assert isinstance(result, dict)
    return result


@pytest.fixture
async def router(redis: aioredis.Redis) -> AsyncIterator[RouterProcessor]:
    processor = await started(RouterProcessor(), redis)
    yield processor
    await processor.cleanup()


@pytest.fixture
async def parser(redis: aioredis.Redis) -> AsyncIterator[ParserProcessor]:
    processor = await started(ParserProcessor(), redis)
    yield processor
    await processor.cleanup()


@pytest.fixture
async def grouper(redis: aioredis.Redis) -> GrouperProcessor:
    return await started(GrouperProcessor(), redis)


async def test_pipeline_from_pdf_to_grouped_biomarkers(
    redis: aioredis.Redis,
    router: RouterProcessor,
    parser: ParserProcessor,
    grouper: GrouperProcessor,
    samples: dict[str, Path],
) -> None:
    routed = await one_output(router, "rec-1", "user-1", {"document_url": samples[DIABETES].as_uri()})
    assert routed == {"pages_key": pages_key(NS, "rec-1"), "document_name": DIABETES, "page_count": 3}
    pages = json.loads(await get_existing(redis, pages_key(NS, "rec-1")))
    assert [page["categories"] for page in pages] == [["labs"], ["labs"], ["diagnoses", "procedures"]]
    assert (
        await redis.ttl(pages_key(NS, "rec-1")) == -1
    )  # no expiry: the pages wait for the parser however long it is down

    parsed = await parser.process("rec-1", "user-1", routed)
    assert parsed == {
        "biomarker_count": 10,
        "diagnosis_count": 3,
        "procedures_count": 3,
        "genetics_count": 0,
        "unparsed_count": 0,
        "status": "parsed",
    }
    assert await redis.exists(pages_key(NS, "rec-1")) == 0
    findings = Findings.model_validate_json(await get_existing(redis, parsed_key(NS, "rec-1")))
    assert [d.icd10 for d in findings.diagnoses] == ["E11.65", "E78.5", "I10"]
    assert await redis.ttl(parsed_key(NS, "rec-1")) == -1  # a hand-off too, until the grouper has used it

    grouped = await grouper.process("rec-1", "user-1", parsed)
    assert grouped == {"grouped_key": grouped_key(NS, "rec-1"), "group_count": 7, "mixed_unit_groups": 3}
    assert 0 < await redis.ttl(parsed_key(NS, "rec-1")) <= 86400  # now it expires with the groups
    groups = {group["name"]: group for group in json.loads(await get_existing(redis, grouped_key(NS, "rec-1")))}
    assert list(groups) == [
        "HbA1c",
        "Fasting glucose",
        "Total cholesterol",
        "LDL-C",
        "HDL-C",
        "Triglycerides",
        "Creatinine",
    ]
    assert groups["LDL-C"]["units"] == ["mg/dL", "mmol/L"]
    assert [(m["name"], m["value"], m["normalized_value"]) for m in groups["LDL-C"]["measurements"]] == [
        ("LDL Cholesterol", 138.0, 138.0),
        ("LDL-C", 3.9, 150.81),
    ]
    assert groups["Creatinine"]["measurements"][0]["normalized_value"] == 1.1


async def test_router_keeps_the_textless_scanned_page(
    redis: aioredis.Redis, router: RouterProcessor, samples: dict[str, Path]
) -> None:
    await router.process("rec-ct", "user-1", {"document_url": samples[CT_CHEST].as_uri()})
    first, scan = json.loads(await get_existing(redis, pages_key(NS, "rec-ct")))
    assert first["categories"] == ["diagnoses", "procedures", "imaging"]
    assert scan == {"number": 2, "text": "", "categories": ["other"]}


@pytest.mark.ocr
async def test_router_reads_from_the_records_api(
    redis: aioredis.Redis, samples: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def document(request: web.Request) -> web.Response:
        if request.match_info["record_id"] != "rec/api":
            raise web.HTTPNotFound()
        return web.Response(body=samples[CT_CHEST].read_bytes(), content_type="application/pdf")

    app = web.Application()
    app.router.add_get("/records/{record_id}/document", document)
    async with TestServer(app, host="127.0.0.1") as server:
        monkeypatch.setenv("RECORDS_API_URL", f"{server.make_url('/records')}/{{record_id}}/document")
        router = await started(RouterProcessor(), redis)
        try:
            routed = await one_output(router, "rec/api", "user-1", {})  # quoted into one path segment
            with pytest.raises(RecordNotFoundError, match="returned 404"):
                await router.process("rec-unknown", "user-1", {})
        finally:
            await router.cleanup()
    assert routed == {"pages_key": pages_key(NS, "rec/api"), "document_name": "document", "page_count": 2}
    assert await redis.exists(pages_key(NS, "rec-unknown")) == 0


async def test_router_missing_file_is_record_not_found(
    redis: aioredis.Redis, router: RouterProcessor, tmp_path: Path
) -> None:
    with pytest.raises(RecordNotFoundError, match="no document at"):
        await router.process("rec-2", "user-1", {"document_url": (tmp_path / "nope.pdf").as_uri()})
    assert await redis.exists(pages_key(NS, "rec-2")) == 0


async def test_router_corrupt_pdf_is_dead_lettered_not_retried(
    redis: aioredis.Redis, router: RouterProcessor, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt.pdf"
    corrupt.write_bytes(b"%PDF-1.7\n1 0 obj <</Type /Catalog")
    with pytest.raises(UnreadableDocumentError, match=r"corrupt\.pdf: not a readable PDF") as caught:
        await router.process("rec-3", "user-1", {"document_url": corrupt.as_uri()})
    assert isinstance(caught.value, PermanentError)  # the runtime's signal for "dead-letter at once"
    assert await redis.exists(pages_key(NS, "rec-3")) == 0


async def test_parser_without_pages_is_record_not_found(parser: ParserProcessor) -> None:
    with pytest.raises(RecordNotFoundError, match=re.escape(f"no pages for record rec-4 at {pages_key(NS, 'rec-4')}")):
        await parser.process("rec-4", "user-1", {"pages_key": pages_key(NS, "rec-4")})


async def test_parser_reads_no_pages_of_another_namespace(redis: aioredis.Redis, parser: ParserProcessor) -> None:
    foreign = pages_key("lab-b", "rec-4")
    await redis.set(foreign, "[]")
    with pytest.raises(PermanentError, match=re.escape(f"pages_key '{foreign}' of record rec-4 is not a pages key")):
        await parser.process("rec-4", "user-1", {"pages_key": foreign})
    assert await redis.get(foreign) == "[]"  # neither read into a result nor deleted


async def test_parser_redelivery_after_success_returns_the_stored_result(
    router: RouterProcessor, parser: ParserProcessor, samples: dict[str, Path]
) -> None:
    routed = await one_output(router, "rec-5", "user-1", {"document_url": samples[CT_CHEST].as_uri()})
    first = await parser.process("rec-5", "user-1", routed)
    assert await parser.process("rec-5", "user-1", routed) == first
    assert (first["diagnosis_count"], first["procedures_count"]) == (1, 1)


async def test_grouper_without_findings_is_record_not_found(grouper: GrouperProcessor) -> None:
    with pytest.raises(RecordNotFoundError, match="no findings for record rec-6"):
        await grouper.process("rec-6", "user-1", {})


@pytest.fixture
async def llm_parser(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ParserProcessor, ChatService]]:
    async with running_chat_service() as service:
        monkeypatch.setenv("PARSER_LLM_URL", service.url)
        monkeypatch.setenv("PARSER_LLM_MODEL", "test-model")
        monkeypatch.setenv("OPENAI_API_KEY", "process-key")
        parser = await started(ParserProcessor(), redis)
        yield parser, service
        await parser.cleanup()
    assert service.invalid == []  # every request the parser sent is one the SDK's types accept


async def test_llm_mode_bills_the_users_key_and_stores_the_models_findings(
    redis: aioredis.Redis,
    router: RouterProcessor,
    llm_parser: tuple[ParserProcessor, ChatService],
    samples: dict[str, Path],
) -> None:
    parser, fake = llm_parser
    routed = await one_output(router, "rec-7", "user-7", {"document_url": samples[CT_CHEST].as_uri()})
    with api_key_scope(SecretStr("user-7-key"), swap_env=False):
        parsed = await parser.process("rec-7", "user-7", routed)

    assert parsed == {
        "biomarker_count": 1,
        "diagnosis_count": 1,
        "procedures_count": 0,
        "genetics_count": 1,
        "unparsed_count": 0,
        "status": "parsed",
    }
    assert Findings.model_validate_json(await get_existing(redis, parsed_key(NS, "rec-7"))) == Findings.model_validate(
        FINDINGS
    )
    (request,) = fake.requests
    assert request.key == "user-7-key"
    assert (request.body["model"], request.body["temperature"]) == ("test-model", 0)
    report = request.report
    assert "=== Page 1 ===\nMetro Imaging Center" in report
    assert "=== Page 2 ===" not in report  # the textless scan is not sent


async def test_llm_mode_falls_back_to_the_process_key(
    router: RouterProcessor, llm_parser: tuple[ParserProcessor, ChatService], samples: dict[str, Path]
) -> None:
    parser, fake = llm_parser
    routed = await one_output(router, "rec-8", "user-8", {"document_url": samples[CT_CHEST].as_uri()})
    await parser.process("rec-8", "user-8", routed)
    assert fake.sent_keys() == ["process-key"]


@pytest.mark.parametrize(
    ("status", "content", "error"),
    [
        (503, "", "returned 503"),
        (400, "", "returned 400"),
        (200, "not JSON at all", "not findings JSON: 1 error"),
        (200, '{"biomarkers": [{"name": "HbA1c"}]}', "not findings JSON: 3 error"),
    ],
)
async def test_llm_failures_are_transient_keep_the_pages_and_hide_the_key(
    redis: aioredis.Redis,
    router: RouterProcessor,
    llm_parser: tuple[ParserProcessor, ChatService],
    samples: dict[str, Path],
    status: int,
    content: str,
    error: str,
) -> None:
    parser, fake = llm_parser
    fake.status, fake.content = status, content
    routed = await one_output(router, "rec-9", "user-9", {"document_url": samples[CT_CHEST].as_uri()})
    with pytest.raises(LLMExtractionError, match=error) as caught:
        await parser.process("rec-9", "user-9", routed)
    assert not isinstance(caught.value, RecordNotFoundError)
    assert "process-key" not in str(caught.value)
    assert await redis.exists(pages_key(NS, "rec-9")) == 1
    assert await redis.exists(parsed_key(NS, "rec-9")) == 0


async def _llm_failure(redis: aioredis.Redis, record_id: str) -> LLMExtractionError:
    """What a parser in LLM mode (as the environment sets it) raises for one page of labs, on a user's key."""
    parser = await started(ParserProcessor(), redis)
    labs = Page(number=1, text="HbA1c 6.1 % (4.0-5.6) H", categories=[Category.LABS])
    await redis.set(pages_key(NS, record_id), PageList.dump_json([labs]))
    try:
        with api_key_scope(SecretStr("sk-user-key"), swap_env=False), pytest.raises(LLMExtractionError) as caught:
            await parser.process(record_id, "user", {})
    finally:
        await parser.cleanup()
    assert "sk-user-key" not in str(caught.value)
    # Never the SDK's error, which carries the request: neither chained nor shown as the context.
    assert caught.value.__cause__ is None and (caught.value.__context__ is None or caught.value.__suppress_context__)
    return caught.value


async def test_an_llm_service_unreachable_or_too_slow_is_a_transient_error_sent_once(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK's timeout (PARSER_LLM_TIMEOUT) and connection error, each one request: the SDK retries nothing."""
    monkeypatch.setenv("PARSER_LLM_TIMEOUT", "0.5")
    async with running_chat_service() as service:
        service.delay = 2.0
        monkeypatch.setenv("PARSER_LLM_URL", service.url)
        slow = await _llm_failure(redis, "rec-13")
        assert len(service.requests) == 1
    # Nothing listens on the service's port any more; a proxy's credentials in the URL are in no message.
    monkeypatch.setenv("PARSER_LLM_URL", service.url.replace("http://", "http://proxy-user:proxy-secret@"))
    gone = await _llm_failure(redis, "rec-14")
    assert (type(slow), str(slow)) == (
        LLMExtractionError,
        f"POST {service.url}/chat/completions failed: APITimeoutError",
    )
    assert (type(gone), str(gone)) == (
        LLMExtractionError,
        f"POST {service.url}/chat/completions failed: APIConnectionError",
    )
    assert len(service.requests) == 1


@pytest.mark.parametrize(
    ("status", "content", "limited"),
    [(200, '{"biomarkers": [{"name": "HbA1c"}]}', True), (503, "", False)],
    ids=["reply-not-findings", "service-down"],
)
async def test_llm_reply_that_is_not_findings_is_retried_a_few_times_then_dead_lettered(
    redis: aioredis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch, status: int, content: str, limited: bool
) -> None:
    """In a real worker: a reply that is not findings is billed on every attempt, so LLMReplyError.max_attempts
    ends it in the DLQ; a service that is down is retried on (it recovers)."""
    labs = Page(number=1, text="HbA1c 6.1 % (4.0-5.6) H", categories=[Category.LABS])
    await redis.set(pages_key(DEFAULT_NAMESPACE, "rec-12"), PageList.dump_json([labs]))
    await add(redis, "rec-12", pages_key=pages_key(DEFAULT_NAMESPACE, "rec-12"))

    async def requests(n: int) -> bool:
        return len(fake.requests) >= n

    async with running_chat_service() as fake:
        fake.status, fake.content = status, content
        monkeypatch.setenv("PARSER_LLM_URL", fake.url)
        monkeypatch.setenv("OPENAI_API_KEY", "process-key")
        async with running_worker(redis_url, processor=ParserProcessor, circuit_failure_threshold=100):
            if limited:
                await wait_until(lambda: redis.xlen(DLQ), "the dead letter", 20)
            else:
                await wait_until(lambda: requests(5), "five attempts", 20)
    assert await redis.exists(pages_key(DEFAULT_NAMESPACE, "rec-12")) == 1  # kept for a replay
    if not limited:
        assert await redis.xlen(DLQ) == 0
        return
    assert len(fake.requests) == LLMReplyError.max_attempts == 3
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert (dead["error_type"], dead["attempts"]) == ("RetriesExhausted", "3")
    reason = "reached LLMReplyError.max_attempts=3; last error: LLMReplyError: the model's reply is not findings JSON"
    assert reason in dead["error"]
    assert "process-key" not in json.dumps(dead)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("not JSON", " replied without a chat completion (not JSON)"),
        ("[1, 2]", " replied without a chat completion"),
        ('{"choices": [{}], "usage": {}}', " replied without a chat completion's message"),
        ('{"choices": [{"message": {"content": 5}}], "usage": {"total_tokens": "many"}}', " completion's message"),
        ('{"choices": [{"message": {"content": "[]"}}]}', "first at top level: Input should be an object"),
    ],
)
async def test_an_llm_reply_that_is_no_chat_completion_of_findings_is_a_reply_error(
    redis: aioredis.Redis, llm_parser: tuple[ParserProcessor, ChatService], raw: str, error: str
) -> None:
    """Replies of a proxy the SDK does not validate: whatever part is missing or wrong, an LLMReplyError (a few
    attempts, then the DLQ), never an AttributeError or TypeError retried for ever."""
    _, fake = llm_parser
    fake.raw_reply = raw
    failure = await _llm_failure(redis, "rec-16")
    assert isinstance(failure, LLMReplyError) and str(failure).endswith(error)


@pytest.mark.parametrize(("retry_after", "seconds"), [("3", 3.0), ("0.25", 0.25), (None, 1.0), ("soon", 1.0)])
async def test_an_llm_429_is_rate_limited_for_its_retry_after(
    redis: aioredis.Redis,
    llm_parser: tuple[ParserProcessor, ChatService],
    retry_after: str | None,
    seconds: float,
) -> None:
    """The provider's Retry-After (seconds; none or unreadable: a second) becomes RateLimited.retry_after, which the
    runtime turns into a pause of the stage's shared limits (tests/test_parser_llm.py runs it in a worker)."""
    parser, fake = llm_parser
    fake.status, fake.retry_after = 429, retry_after
    labs = Page(number=1, text="HbA1c 6.1 % (4.0-5.6) H", categories=[Category.LABS])
    await redis.set(pages_key(NS, "rec-15"), PageList.dump_json([labs]))
    with pytest.raises(RateLimited, match="returned 429") as caught:
        await parser.process("rec-15", "user-15", {})
    assert caught.value.retry_after == seconds and caught.value.__cause__ is None
    assert await redis.exists(pages_key(NS, "rec-15")) == 1


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refused_llm_key_is_signalled_to_the_runtime(
    router: RouterProcessor, llm_parser: tuple[ParserProcessor, ChatService], samples: dict[str, Path], status: int
) -> None:
    parser, fake = llm_parser
    fake.status = status
    routed = await one_output(router, "rec-12", "user-12", {"document_url": samples[CT_CHEST].as_uri()})
    with pytest.raises(ApiKeyRejectedError, match=f"refused the API key \\(HTTP {status}\\)") as caught:
        await parser.process("rec-12", "user-12", routed)
    assert "process-key" not in str(caught.value)


async def test_llm_mode_does_not_call_the_model_for_pages_without_findings(
    redis: aioredis.Redis, llm_parser: tuple[ParserProcessor, ChatService]
) -> None:
    parser, fake = llm_parser
    scan = Page(number=1, text="", categories=[Category.OTHER])
    await redis.set(pages_key(NS, "rec-10"), PageList.dump_json([scan]))
    parsed = await parser.process("rec-10", "user-10", {"pages_key": pages_key(NS, "rec-10")})
    assert parsed["status"] == "empty"
    assert fake.requests == []


async def test_llm_mode_without_any_key_is_a_clear_transient_error(
    redis: aioredis.Redis,
    router: RouterProcessor,
    llm_parser: tuple[ParserProcessor, ChatService],
    samples: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parser, fake = llm_parser
    monkeypatch.delenv("OPENAI_API_KEY")
    routed = await one_output(router, "rec-11", "user-11", {"document_url": samples[CT_CHEST].as_uri()})
    with pytest.raises(LLMExtractionError, match="no API key"):
        await parser.process("rec-11", "user-11", routed)
    assert fake.requests == []
    assert await redis.exists(pages_key(NS, "rec-11")) == 1


@pytest.fixture
def scan_pdf(tmp_path: Path) -> Path:
    path = tmp_path / "fax.pdf"
    path.write_bytes(next(report for report in CORPUS if report.render is faxed_scan).pdf())
    return path


@pytest.mark.ocr
@pytest.mark.skipif(ocr_unavailable_reason() is not None, reason=str(ocr_unavailable_reason()))
async def test_scanned_page_is_read_by_ocr_and_parsed(
    redis: aioredis.Redis, router: RouterProcessor, parser: ParserProcessor, scan_pdf: Path
) -> None:
    routed = await one_output(router, "rec-fax", "user-1", {"document_url": scan_pdf.as_uri()})
    cover, scan = json.loads(await get_existing(redis, pages_key(NS, "rec-fax")))
    assert (cover["categories"], scan["categories"]) == (["other"], ["labs"])
    parsed = await parser.process("rec-fax", "user-1", routed)
    assert (parsed["biomarker_count"], parsed["unparsed_count"]) == (6, 0)


async def test_router_without_tesseract_says_so_once_and_keeps_scanned_pages_empty(
    redis: aioredis.Redis, scan_pdf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pytesseract.pytesseract, "tesseract_cmd", str(tmp_path / "no-tesseract"))
    with structlog.testing.capture_logs() as logs:
        router = await started(RouterProcessor(), redis)
        try:
            await router.process("rec-fax2", "user-1", {"document_url": scan_pdf.as_uri()})
            await router.process("rec-fax3", "user-1", {"document_url": scan_pdf.as_uri()})
        finally:
            await router.cleanup()
    (warning,) = [log for log in logs if log["log_level"] == "warning"]
    assert warning["event"] == "ocr_unavailable"
    assert "tesseract binary is not installed" in warning["reason"]
    _, scan = json.loads(await get_existing(redis, pages_key(NS, "rec-fax2")))
    assert (scan["text"], scan["categories"]) == ("", ["other"])


async def test_parser_keeps_unparsed_result_lines_and_counts_them(
    redis: aioredis.Redis, parser: ParserProcessor
) -> None:
    page = Page(number=2, text="Sodium 139 mmol/L 136-145\nLipase 1O2 U/L 13-60", categories=[Category.LABS])
    await redis.set(pages_key(NS, "rec-12"), PageList.dump_json([page]))
    before = REGISTRY.get_sample_value("phoenix_parser_unparsed_rows_total") or 0.0
    parsed = await parser.process("rec-12", "user-12", {"pages_key": pages_key(NS, "rec-12")})
    assert (parsed["biomarker_count"], parsed["unparsed_count"]) == (1, 1)
    findings = Findings.model_validate_json(await get_existing(redis, parsed_key(NS, "rec-12")))
    assert [(row.text, row.page) for row in findings.unparsed] == [("Lipase 1O2 U/L 13-60", 2)]
    assert REGISTRY.get_sample_value("phoenix_parser_unparsed_rows_total") == before + 1


async def test_router_with_named_outputs_sends_lab_pages_to_the_parser_and_imaging_pages_to_imaging(
    redis: aioredis.Redis, samples: dict[str, Path]
) -> None:
    outputs = {name: {"queue": input_stream(name, NS)} for name in ("parser", "imaging")}
    router = await started(RouterProcessor(), redis)
    router.settings = WorkerSettings(service_name="router", processor="unused", key_namespace=NS, outputs=outputs)
    try:
        lab = await router.process("lab-1", "u", {"document_url": samples[DIABETES].as_uri()})
        scan = await router.process("ct-1", "u", {"document_url": samples[CT_CHEST].as_uri()})
    finally:
        await router.cleanup()
    assert isinstance(lab, Routed) and list(lab.outputs) == ["parser"]
    assert lab.outputs["parser"]["pages_key"] == pages_key(NS, "lab-1")
    assert isinstance(scan, Routed) and "imaging" in scan.outputs
    assert all("CT" in page["text"] or "ct" in page["text"].lower() for page in scan.outputs["imaging"]["pages"])
    # Pages are stored only for the parser, which deletes them: an imaging-only document leaves none behind.
    assert ("parser" in scan.outputs) == bool(await redis.exists(pages_key(NS, "ct-1")))
