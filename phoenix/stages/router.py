"""Router stage: fetch a record's PDF, split it into pages tagged with categories, and hand them to the parser.

With named outputs (spec.outputs `parser` and `imaging`, docs/pipelines.md) it routes by content: a document whose
pages are all imaging reports goes to `imaging` alone, one with imaging pages among others to both, any other to
`parser`; with one output (output.stage) every document goes there, as before."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, IPvAnyNetwork, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from phoenix.stages.categories import tag_pages
from phoenix.stages.data_keys import pages_key
from phoenix.stages.document_loader import DocumentLoader, FetchLimits
from phoenix.stages.documents import DocumentNotFoundError, DocumentRefusedError, document_url
from phoenix.stages.models import Category, Page, PageList
from phoenix.stages.network_policy import NetworkPolicy, trusted_origin
from phoenix.stages.ocr import ocr_unavailable_reason
from phoenix.stages.pdf_text import DEFAULT_LIMITS, PdfLimits, UnreadablePdfError, extract_page_texts
from phoenix.worker_runtime import BaseProcessor, PermanentError, ProcessResult, RecordNotFoundError, Routed


class RouterSettings(BaseSettings):
    """What the router fetches and reads (docs/configuration.md, "The example stages"). Pages have no TTL: they
    wait for the parser (data_keys.py)."""

    model_config = SettingsConfigDict(env_ignore_empty=True)

    records_api_url: str | None = None
    document_timeout: float = Field(60, gt=0)
    document_root: Path | None = None
    max_document_bytes: int = Field(32 * 2**20, ge=1)
    max_document_redirects: int = Field(5, ge=0, le=50)
    document_allowed_networks: Annotated[tuple[IPvAnyNetwork, ...], NoDecode] = ()
    max_document_pages: int = Field(DEFAULT_LIMITS.max_pages, ge=1)
    max_page_pixels: int = Field(DEFAULT_LIMITS.max_page_pixels, ge=1_000_000)

    @field_validator("document_root")
    @classmethod
    def _an_existing_directory(cls, root: Path | None) -> Path | None:
        if root is None:
            return None
        real = Path(os.path.realpath(root))
        if not real.is_dir():
            raise ValueError(f"{root} is not a directory")
        if real == Path(real.anchor):
            raise ValueError("/ would let a message name any file of the pod: name the documents' own directory")
        return real

    @field_validator("document_allowed_networks", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value

    def fetch_limits(self) -> FetchLimits:
        return FetchLimits(
            document_root=self.document_root,
            max_bytes=self.max_document_bytes,
            max_redirects=self.max_document_redirects,
            timeout=self.document_timeout,
            network=NetworkPolicy(tuple(self.document_allowed_networks), trusted_origin(self.records_api_url)),
        )

    def pdf_limits(self) -> PdfLimits:
        return PdfLimits(max_pages=self.max_document_pages, max_page_pixels=self.max_page_pixels)


class UnreadableDocumentError(PermanentError):
    """The document is not a readable PDF: the same bytes fail on every retry, and retrying forever would hide the
    bad document instead of putting it in front of an operator, so it is dead-lettered at once."""


class RefusedDocumentError(PermanentError):
    """The record names a document the router does not fetch (documents.DocumentRefusedError): the same message
    is refused on every attempt, so it is dead-lettered at once with the reason."""


class RouterProcessor(BaseProcessor):
    config: RouterSettings
    loader: DocumentLoader
    ocr: bool

    async def initialize(self) -> None:
        self.config = RouterSettings()
        reason = ocr_unavailable_reason()
        self.ocr = reason is None
        if reason:
            self.logger.warning("ocr_unavailable", reason=reason, effect="pages without a text layer stay empty")
        # A file is read in a run_blocking thread, so one stuck on a slow disk counts as leaked (/healthz).
        self.loader = DocumentLoader(self.config.fetch_limits(), self.run_blocking)

    async def cleanup(self) -> None:
        # Called after a failed initialize() too, which may have stopped before the loader.
        if (loader := getattr(self, "loader", None)) is not None:
            await loader.close()

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> ProcessResult:
        try:
            document = await self.loader.load(document_url(record_id, data, self.config.records_api_url))
            texts = await self.run_blocking(
                extract_page_texts, document.content, ocr=self.ocr, limits=self.config.pdf_limits()
            )
        except DocumentNotFoundError as exc:
            raise RecordNotFoundError(str(exc)) from exc
        except DocumentRefusedError as exc:
            raise RefusedDocumentError(str(exc)) from exc
        except UnreadablePdfError as exc:
            raise UnreadableDocumentError(f"{document.name}: {exc}") from exc
        pages = tag_pages(texts)
        outputs = self.settings.outputs
        imaging = [page for page in pages if Category.IMAGING in page.categories]
        to_parser = not outputs or (PARSER in outputs and (not pages or len(imaging) < len(pages)))
        routes: dict[str, dict[str, Any]] = {}
        if to_parser:
            # Stored only for the parser, which deletes them: pages nobody reads would stay forever (no TTL).
            key = pages_key(self.settings.key_namespace, record_id)
            await self.redis.set(key, PageList.dump_json(pages))
            routes[PARSER] = {"pages_key": key, "document_name": document.name, "page_count": len(pages)}
        if IMAGING in outputs and imaging:
            routes[IMAGING] = imaging_result(document.name, imaging)
        self.logger.info(
            "document_routed", record_id=record_id, document=document.name, pages=len(pages), to=list(routes)
        )
        if not outputs:
            return routes[PARSER]
        return Routed(routes)


# The router's named outputs (spec.outputs): where lab pages and imaging pages go.
PARSER = "parser"
IMAGING = "imaging"


def imaging_result(document_name: str, pages: list[Page]) -> dict[str, Any]:
    """What `imaging` gets: the imaging pages themselves (the parser's stored pages are deleted when it is done)."""
    return {
        "document_name": document_name,
        "pages": [{"number": page.number, "text": page.text} for page in pages],
    }
