"""Fetch a record's document from the URL its message names, within the router's limits: `file://` under
DOCUMENT_ROOT (document_files.py), `http(s)://` to allowed addresses (document_http.py), nothing else."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from phoenix.stages.document_files import read_document_file
from phoenix.stages.document_http import HttpFetcher
from phoenix.stages.documents import Document, DocumentRefusedError, redact
from phoenix.stages.network_policy import NetworkPolicy

T = TypeVar("T")


class RunBlocking(Protocol):
    """BaseProcessor.run_blocking: a blocking call in a thread the runtime accounts for."""

    def __call__(self, func: Callable[..., T], /, *args: Any) -> Awaitable[T]: ...


@dataclass(frozen=True)
class FetchLimits:
    document_root: Path | None  # resolved; None refuses file://
    max_bytes: int
    max_redirects: int
    timeout: float
    network: NetworkPolicy


class DocumentLoader:
    def __init__(self, limits: FetchLimits, run_blocking: RunBlocking) -> None:
        self._limits = limits
        self._run_blocking = run_blocking
        self._http = HttpFetcher(
            limits.network, max_bytes=limits.max_bytes, max_redirects=limits.max_redirects, timeout=limits.timeout
        )

    async def close(self) -> None:
        await self._http.close()

    async def load(self, url: str) -> Document:
        try:
            scheme = urlsplit(url).scheme
        except ValueError:
            raise DocumentRefusedError("the document URL cannot be parsed") from None
        if scheme == "file":
            limits = self._limits
            return await self._run_blocking(read_document_file, url, limits.document_root, limits.max_bytes)
        if scheme in ("http", "https"):
            return await self._http.fetch(url)
        raise DocumentRefusedError(
            f"unsupported document URL scheme {scheme!r} in {redact(url)}: file (under DOCUMENT_ROOT), http and https"
        )
