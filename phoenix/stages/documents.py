"""Fetch a record's source document from a `file://` or `http(s)://` URL."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import aiohttp


class DocumentNotFoundError(LookupError):
    """No document: a missing file, HTTP 404/410, or a record that names none. Retrying cannot help."""


class DocumentFetchError(Exception):
    """Fetching failed in a way that may heal (server error, timeout, connection refused)."""


@dataclass(frozen=True)
class Document:
    name: str
    content: bytes


def document_url(record_id: str, data: dict[str, Any], records_api_url: str | None) -> str:
    """The record's own `document_url`, else the records API template (e.g. `http://host/records/{record_id}`)."""
    if url := data.get("document_url"):
        return str(url)
    if records_api_url:
        return records_api_url.format(record_id=quote(record_id, safe=""))
    raise DocumentNotFoundError(f"record {record_id} has no document_url and RECORDS_API_URL is not set")


def redact(url: str) -> str:
    """The URL without credentials, query or fragment: presigned URLs carry their token there."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


async def load_document(session: aiohttp.ClientSession, url: str) -> Document:
    scheme = urlsplit(url).scheme
    if scheme == "file":
        return await _load_file(Path(unquote(urlsplit(url).path)))
    if scheme in ("http", "https"):
        return await _load_http(session, url)
    raise DocumentNotFoundError(f"unsupported document URL scheme {scheme!r} in {redact(url)}")


async def _load_file(path: Path) -> Document:
    try:
        content = await asyncio.to_thread(path.read_bytes)
    except FileNotFoundError as exc:
        raise DocumentNotFoundError(f"no document at {path}") from exc
    return Document(name=path.name, content=content)


async def _load_http(session: aiohttp.ClientSession, url: str) -> Document:
    safe_url = redact(url)
    # Errors are re-raised without the aiohttp exception chained: its text repeats the full URL.
    try:
        async with session.get(url) as response:
            if response.status in (404, 410):
                raise DocumentNotFoundError(f"GET {safe_url} returned {response.status}")
            if response.status >= 400:
                raise DocumentFetchError(f"GET {safe_url} returned {response.status}")
            content = await response.read()
            name = response.content_disposition.filename if response.content_disposition else None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise DocumentFetchError(f"GET {safe_url} failed: {type(exc).__name__}") from None
    return Document(name=name or Path(urlsplit(url).path).name or "document", content=content)
