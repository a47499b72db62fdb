"""Fetching documents over file:// and real HTTP (aiohttp's server on loopback), and what a hostile URL gets:
refused at once, with the reason, whatever file, address or body it names."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from phoenix.stages.document_loader import DocumentLoader, FetchLimits
from phoenix.stages.documents import (
    DocumentFetchError,
    DocumentNotFoundError,
    DocumentRefusedError,
    document_url,
    redact,
)
from phoenix.stages.network_policy import NetworkPolicy, trusted_origin
from tests.fixtures.document_server import PDF_BODY, DocumentServer, document_server

LOOPBACK = NetworkPolicy((ipaddress.ip_network("127.0.0.1/32"),))  # how the tests reach their own servers
CAP = 1 << 20


@asynccontextmanager
async def loader(
    root: Path | None = None, network: NetworkPolicy = LOOPBACK, max_bytes: int = CAP, max_redirects: int = 5
) -> AsyncIterator[DocumentLoader]:
    limits = FetchLimits(
        document_root=root,
        max_bytes=max_bytes,
        max_redirects=max_redirects,
        timeout=10,
        network=network,
    )
    documents = DocumentLoader(limits, asyncio.to_thread)
    try:
        yield documents
    finally:
        await documents.close()


@pytest.fixture
async def server() -> AsyncIterator[DocumentServer]:
    async with document_server() as documents:
        yield documents


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """DOCUMENT_ROOT, resolved as RouterSettings resolves it."""
    (tmp_path / "docs").mkdir()
    return tmp_path.resolve() / "docs"


async def refused(url: str, *, match: str, **limits: object) -> DocumentRefusedError:
    """The refusal, which must come at once: nothing is read first."""
    began = time.monotonic()
    async with loader(**limits) as documents:  # type: ignore[arg-type]
        with pytest.raises(DocumentRefusedError, match=match) as caught:
            await documents.load(url)
    assert time.monotonic() - began < 5
    return caught.value


# -- file:// ------------------------------------------------------------------------------------------------------


async def test_a_file_under_the_document_root_gives_name_and_bytes(root: Path) -> None:
    (root / "report with space.pdf").write_bytes(b"%PDF-1.7 content")
    (root / "lab").mkdir()
    (root / "lab" / "a.pdf").write_bytes(b"%PDF-a")
    (root / "latest.pdf").symlink_to(root / "lab" / "a.pdf")  # a symlink that stays inside is followed
    async with loader(root) as documents:
        document = await documents.load((root / "report with space.pdf").as_uri())
        linked = await documents.load((root / "latest.pdf").as_uri())
    assert (document.name, document.content) == ("report with space.pdf", b"%PDF-1.7 content")
    assert (linked.name, linked.content) == ("a.pdf", b"%PDF-a")


async def test_a_missing_file_is_not_found(root: Path) -> None:
    async with loader(root) as documents:
        with pytest.raises(DocumentNotFoundError, match="no document at"):
            await documents.load((root / "gone.pdf").as_uri())


async def test_file_urls_are_refused_without_a_document_root(root: Path) -> None:
    (root / "a.pdf").write_bytes(b"%PDF-a")
    await refused((root / "a.pdf").as_uri(), match="DOCUMENT_ROOT is not set")


@pytest.mark.parametrize("path", ["/dev/zero", "/proc/self/environ", "/etc/passwd"])
async def test_files_outside_the_document_root_are_refused(root: Path, path: str) -> None:
    await refused(f"file://{path}", match="is not a file under DOCUMENT_ROOT", root=root)


@pytest.mark.parametrize("tree", ["/dev", "/proc/self"])
async def test_devices_and_proc_are_refused_even_as_the_document_root(tree: str) -> None:
    await refused(f"file://{tree}/{'zero' if tree == '/dev' else 'environ'}", match="not a file under", root=Path(tree))


async def test_dot_dot_and_symlink_escapes_are_refused(root: Path) -> None:
    secret = root.parent / "secret.pdf"
    secret.write_bytes(b"%PDF-secret")
    (root / "innocent.pdf").symlink_to(secret)
    (root / "zero.pdf").symlink_to("/dev/zero")
    (root / "sub").mkdir()
    (root / "sub" / "up").symlink_to(root.parent)
    for url in (
        f"file://{root}/../secret.pdf",
        f"file://{root}/sub/../../secret.pdf",
        (root / "innocent.pdf").as_uri(),
        (root / "zero.pdf").as_uri(),
        f"file://{root}/sub/up/secret.pdf",
    ):
        error = await refused(url, match="is not a file under DOCUMENT_ROOT", root=root)
        assert "secret" not in str(error).split("under")[1]  # the message names what was asked, not where it led


async def test_a_fifo_or_a_directory_under_the_root_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "pipe.pdf")  # opening a FIFO for reading blocks until a writer comes, unless told not to
    (root / "folder.pdf").mkdir()
    await refused((root / "pipe.pdf").as_uri(), match="not a regular file", root=root)
    await refused((root / "folder.pdf").as_uri(), match="not a regular file", root=root)


async def test_a_file_is_read_only_up_to_the_cap(root: Path) -> None:
    (root / "exact.pdf").write_bytes(b"%" * CAP)
    (root / "over.pdf").write_bytes(b"%" * (CAP + 1))
    async with loader(root) as documents:
        assert len((await documents.load((root / "exact.pdf").as_uri())).content) == CAP
    await refused((root / "over.pdf").as_uri(), match=r"larger than MAX_DOCUMENT_BYTES \(1048576 bytes\)", root=root)


async def test_a_file_url_naming_a_host_is_refused(root: Path) -> None:
    await refused(f"file://elsewhere{root}/a.pdf", match="names no host", root=root)


# -- http(s):// ---------------------------------------------------------------------------------------------------


async def test_http_document_takes_its_name_from_content_disposition(server: DocumentServer) -> None:
    async with loader() as documents:
        document = await documents.load(server.url("/files/a1"))
    assert (document.name, document.content) == ("lab.pdf", b"%PDF-a1")


async def test_http_404_is_not_found(server: DocumentServer) -> None:
    async with loader() as documents:
        with pytest.raises(DocumentNotFoundError, match="returned 404"):
            await documents.load(server.url("/files/missing.pdf"))


async def test_http_errors_are_transient_and_hide_the_url_token(server: DocumentServer) -> None:
    async with loader() as documents:
        with pytest.raises(DocumentFetchError, match="returned 500") as caught:
            await documents.load(server.url("/files/broken.pdf?token=s3cr3t"))
    assert "s3cr3t" not in str(caught.value)


async def test_unreachable_server_is_transient() -> None:
    # Port 9 (discard) on loopback has no listener: the connection is refused at once.
    async with loader() as documents:
        with pytest.raises(DocumentFetchError, match="ClientConnectorError"):
            await documents.load("http://user:pw@127.0.0.1:9/doc.pdf?sig=abc")


@pytest.mark.parametrize("url", ["ftp://host/doc.pdf", "gopher://127.0.0.1:70/", "data:application/pdf,x"])
async def test_other_schemes_are_refused(url: str) -> None:
    await refused(url, match="unsupported document URL scheme")


async def test_a_body_over_the_cap_is_stopped_at_the_cap(server: DocumentServer) -> None:
    await refused(server.url("/endless"), match=r"larger than MAX_DOCUMENT_BYTES \(1048576 bytes\)")
    # Read as a stream and dropped at the cap: what the server got out is the cap and the sockets' buffers.
    assert server.endless_sent < CAP + (16 << 20)
    await refused(server.url("/declared"), match="larger than MAX_DOCUMENT_BYTES")  # 10 GiB announced


async def test_redirects_are_followed_up_to_the_cap(server: DocumentServer) -> None:
    async with loader(max_redirects=3) as documents:
        assert (await documents.load(server.url("/chain/3"))).content == PDF_BODY
    server.requests.clear()
    await refused(server.url("/chain/4"), match=r"more than MAX_DOCUMENT_REDIRECTS \(3\) redirects", max_redirects=3)
    assert server.requests == ["/chain/4", "/chain/3", "/chain/2", "/chain/1"]  # the fifth hop is never asked


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
        ("http://[::ffff:169.254.169.254]/", "169.254.169.254 is a link-local address"),
        ("http://127.0.0.1:{port}/files/a.pdf", "127.0.0.1 is a loopback address"),
        ("http://127.0.0.2:{port}/files/a.pdf", "127.0.0.2 is a loopback address"),
        ("http://[::1]:{port}/files/a.pdf", "::1 is a loopback address"),
        ("http://10.0.0.1/", "10.0.0.1 is a private address"),
        (
            "http://localhost:{port}/files/a.pdf",
            "localhost resolves to no allowed address: 127.0.0.1 is a loopback address",
        ),
    ],
)
async def test_every_redirect_hop_is_checked(server: DocumentServer, target: str, reason: str) -> None:
    """The first hop is the server itself, trusted as RECORDS_API_URL's origin would be; where it redirects to is
    checked like any URL a message names (the same server on another port, name or address too)."""
    location = target.format(port=server.port + 1 if "127.0.0.1" in target else server.port)
    network = NetworkPolicy(trusted=trusted_origin(server.url("/records/{record_id}")))
    error = await refused(server.url(f"/to?location={location}"), match=re.escape(reason), network=network)
    assert "unless DOCUMENT_ALLOWED_NETWORKS holds it" in str(error)
    assert [request.partition("?")[0] for request in server.requests] == ["/to"]  # nothing asked of the target


async def test_a_redirect_to_another_scheme_is_refused(server: DocumentServer) -> None:
    await refused(server.url("/to?location=file:///etc/passwd"), match="fetched over http or https only")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_loopback_is_refused_by_default_and_allowed_by_the_setting(server: DocumentServer, host: str) -> None:
    url = server.url("/files/a.pdf", host=host)
    await refused(url, match="127.0.0.1 is a loopback address", network=NetworkPolicy())
    assert server.requests == []
    async with loader(network=NetworkPolicy((ipaddress.ip_network("127.0.0.0/8"),))) as documents:
        assert (await documents.load(url)).content == b"%PDF-a.pdf"


async def test_the_records_api_origin_is_reached_whatever_its_address(server: DocumentServer) -> None:
    template = server.url("/files/{record_id}")  # RECORDS_API_URL: configuration, not a message
    async with loader(network=NetworkPolicy(trusted=trusted_origin(template))) as documents:
        assert (await documents.load(document_url("r.pdf", {}, template))).content == b"%PDF-r.pdf"


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "127.1"])
async def test_a_host_in_a_legacy_ipv4_form_is_refused(server: DocumentServer, host: str) -> None:
    # aiohttp refuses the forms socket would read as 127.0.0.1, the resolver what one resolves to.
    await refused(f"http://{host}:{server.port}/files/a.pdf", match="not a valid|loopback", network=NetworkPolicy())
    assert server.requests == []


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
    assert redact("http://[::1/x?token=t") == "an unparsable URL"
