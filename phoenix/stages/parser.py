"""Parser stage: extract biomarkers, diagnoses, procedures and variants from the pages the router stored.

Rules (extraction.py) by default; an OpenAI-compatible model through the `openai` SDK (llm_extraction.py) when
PARSER_LLM_URL is set, each call billed to its record's user through the key the runtime makes current.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter
from pydantic import Field
from pydantic_settings import BaseSettings

from phoenix.stages.data_keys import is_pages_key, pages_key, parsed_key
from phoenix.stages.extraction import extract_findings
from phoenix.stages.llm_extraction import LLMExtractor
from phoenix.stages.models import Findings, Page, PageList
from phoenix.worker_runtime import BaseProcessor, PermanentError, RecordNotFoundError
from phoenix.worker_runtime.billing import current_api_key

UNPARSED_ROWS = Counter(
    "phoenix_parser_unparsed_rows", "Lines that look like results but fit no row grammar (kept in the parsed findings)."
)


class ParserSettings(BaseSettings):
    """PARSER_LLM_URL (unset = rules), PARSER_LLM_MODEL and PARSER_LLM_TIMEOUT configure the model. Findings have
    no TTL until the grouper has used them (keys.py)."""

    parser_llm_url: str | None = None
    parser_llm_model: str = "gpt-4o-mini"
    parser_llm_timeout: float = Field(120, gt=0)


def summary(findings: Findings) -> dict[str, Any]:
    """What the parser forwards to the next stage: counts, not the findings (those are in Redis)."""
    return {
        "biomarker_count": len(findings.biomarkers),
        "diagnosis_count": len(findings.diagnoses),
        "procedures_count": len(findings.procedures),
        "genetics_count": len(findings.genetics),
        "unparsed_count": len(findings.unparsed),
        "status": "empty" if findings.is_empty() else "parsed",
    }


class ParserProcessor(BaseProcessor):
    config: ParserSettings
    llm: LLMExtractor | None = None

    async def initialize(self) -> None:
        self.config = ParserSettings()
        if self.config.parser_llm_url:
            self.llm = LLMExtractor(
                self.config.parser_llm_url, self.config.parser_llm_model, self.config.parser_llm_timeout
            )

    async def cleanup(self) -> None:
        if self.llm is not None:
            await self.llm.close()

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        namespace = self.settings.key_namespace
        source, target = data.get("pages_key") or pages_key(namespace, record_id), parsed_key(namespace, record_id)
        if not is_pages_key(namespace, source):
            # The key comes with the message: read (and delete) no other tenant's pages, nor any other key.
            raise PermanentError(f"pages_key {source!r} of record {record_id} is not a pages key of {namespace}")
        raw_pages = await self.redis.get(source)
        if raw_pages is None:
            # A redelivery after this stage already succeeded (a crash before the ack) finds its own result.
            if (done := await self.redis.get(target)) is not None:
                return summary(Findings.model_validate_json(done))
            raise RecordNotFoundError(f"no pages for record {record_id} at {source}: expired or never routed")
        findings = await self.extract(PageList.validate_json(raw_pages))
        # One transaction: the pages disappear only together with the findings that replace them.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(target, findings.model_dump_json())
            pipe.delete(source)
            await pipe.execute()
        result = summary(findings)
        UNPARSED_ROWS.inc(len(findings.unparsed))
        self.logger.info("document_parsed", record_id=record_id, **result)
        return result

    async def extract(self, pages: list[Page]) -> Findings:
        if self.llm is None:
            return await self.run_blocking(extract_findings, pages)
        return await self.llm.extract(pages, api_key=current_api_key())
