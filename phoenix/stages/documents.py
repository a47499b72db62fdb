"""A record's source document and what fetching it can fail with (document_loader.py fetches it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit


class DocumentNotFoundError(LookupError):
    """No document: a missing file, HTTP 404/410, or a record that names none. Retrying cannot help."""


class DocumentRefusedError(Exception):
    """The URL or the document is one the router does not fetch (a scheme other than file, http and https, a
    file outside DOCUMENT_ROOT or not a regular one, a forbidden address, too many redirects, more than
    MAX_DOCUMENT_BYTES). The same message is refused again: retrying cannot help."""


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
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:  # a message's URL may be anything: an unclosed [IPv6 literal, a port that is no number
        return "an unparsable URL"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def too_large(max_bytes: int) -> DocumentRefusedError:
    return DocumentRefusedError(f"the document is larger than MAX_DOCUMENT_BYTES ({max_bytes} bytes)")
