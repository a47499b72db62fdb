"""Router stage: fetch a record's PDF, split it into pages tagged with categories, and hand them to the parser."""

from __future__ import annotations

from typing import Any

import aiohttp
from pydantic import Field
from pydantic_settings import BaseSettings

from phoenix.stages.categories import tag_pages
from phoenix.stages.data_keys import pages_key
from phoenix.stages.documents import DocumentNotFoundError, document_url, load_document
from phoenix.stages.models import PageList
from phoenix.stages.ocr import ocr_unavailable_reason
from phoenix.stages.pdf_text import UnreadablePdfError, extract_page_texts
from phoenix.worker_runtime import BaseProcessor, PermanentError, RecordNotFoundError


class RouterSettings(BaseSettings):
    """RECORDS_API_URL (e.g. `http://records/records/{record_id}/document`) serves records without a
    document_url; DOCUMENT_TIMEOUT bounds a download. Pages have no TTL: they wait for the parser (keys.py)."""

    records_api_url: str | None = None
    document_timeout: float = Field(60, gt=0)


class UnreadableDocumentError(PermanentError):
    """The document is not a readable PDF: the same bytes fail on every retry, and retrying forever would hide the
    bad document instead of putting it in front of an operator, so it is dead-lettered at once."""


class RouterProcessor(BaseProcessor):
    config: RouterSettings
    session: aiohttp.ClientSession
    ocr: bool

    async def initialize(self) -> None:
        self.config = RouterSettings()
        reason = ocr_unavailable_reason()
        self.ocr = reason is None
        if reason:
            self.logger.warning("ocr_unavailable", reason=reason, effect="pages without a text layer stay empty")
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.document_timeout))

    async def cleanup(self) -> None:
        await self.session.close()

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        try:
            document = await load_document(self.session, document_url(record_id, data, self.config.records_api_url))
            texts = await self.run_blocking(extract_page_texts, document.content, ocr=self.ocr)
        except DocumentNotFoundError as exc:
            raise RecordNotFoundError(str(exc)) from exc
        except UnreadablePdfError as exc:
            raise UnreadableDocumentError(f"{document.name}: {exc}") from exc
        pages = tag_pages(texts)
        key = pages_key(self.settings.key_namespace, record_id)
        await self.redis.set(key, PageList.dump_json(pages))
        self.logger.info("document_routed", record_id=record_id, document=document.name, pages=len(pages))
        return {"pages_key": key, "document_name": document.name, "page_count": len(pages)}
