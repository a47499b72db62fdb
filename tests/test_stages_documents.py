"""Fetching documents over file:// and real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestServer

from phoenix.stages.documents import (
    DocumentFetchError,
    DocumentNotFoundError,
    document_url,
    load_document,
    redact,
)


async def serve_document(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name == "missing.pdf":
        raise web.HTTPNotFound()
    if name == "broken.pdf":
        raise web.HTTPInternalServerError()
    return web.Response(body=b"%PDF-" + name.encode(), headers={"Content-Disposition": 'inline; filename="lab.pdf"'})


@pytest.fixture
async def server() -> AsyncIterator[BaseTestServer]:
    app = web.Application()
    app.router.add_get("/files/{name}", serve_document)
    async with TestServer(app, host="127.0.0.1") as test_server:
        yield test_server


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def test_file_url_gives_name_and_bytes(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    path = tmp_path / "report with space.pdf"
    path.write_bytes(b"%PDF-1.7 content")
    document = await load_document(session, path.as_uri())
    assert (document.name, document.content) == ("report with space.pdf", b"%PDF-1.7 content")


async def test_missing_file_is_not_found(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    with pytest.raises(DocumentNotFoundError, match="no document at"):
        await load_document(session, (tmp_path / "gone.pdf").as_uri())


async def test_http_document_takes_its_name_from_content_disposition(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    document = await load_document(session, str(server.make_url("/files/a1")))
    assert (document.name, document.content) == ("lab.pdf", b"%PDF-a1")


async def test_http_404_is_not_found(server: TestServer, session: aiohttp.ClientSession) -> None:
    with pytest.raises(DocumentNotFoundError, match="returned 404"):
        await load_document(session, str(server.make_url("/files/missing.pdf")))


async def test_http_errors_are_transient_and_hide_the_url_token(
    server: TestServer, session: aiohttp.ClientSession
) -> None:
    url = str(server.make_url("/files/broken.pdf").with_query(token="s3cr3t"))
    with pytest.raises(DocumentFetchError, match="returned 500") as caught:
        await load_document(session, url)
    assert "s3cr3t" not in str(caught.value)


async def test_unreachable_server_is_transient(session: aiohttp.ClientSession) -> None:
    # Port 9 (discard) on loopback has no listener: the connection is refused at once.
    with pytest.raises(DocumentFetchError, match="ClientConnectorError"):
        await load_document(session, "http://user:pw@127.0.0.1:9/doc.pdf?sig=abc")


async def test_unsupported_scheme_is_not_found(session: aiohttp.ClientSession) -> None:
    with pytest.raises(DocumentNotFoundError, match="unsupported document URL scheme 'ftp'"):
        await load_document(session, "ftp://host/doc.pdf")


def test_document_url_prefers_the_record_then_the_records_api() -> None:
    template = "http://records.local/records/{record_id}/document"
    assert document_url("r1", {"document_url": "file:///a.pdf"}, template) == "file:///a.pdf"
    assert document_url("r1", {}, template) == "http://records.local/records/r1/document"
    assert document_url("a/b?c", {}, template) == "http://records.local/records/a%2Fb%3Fc/document"
    with pytest.raises(DocumentNotFoundError, match="RECORDS_API_URL is not set"):
        document_url("r1", {}, None)


def test_redact_drops_credentials_query_and_fragment() -> None:
    assert redact("https://user:pw@bucket.s3.local:9000/a/b.pdf?X-Amz-Signature=abc#p2") == (
        "https://bucket.s3.local:9000/a/b.pdf"
    )
