"""An `http(s)://` document: redirects followed here, each hop's address checked (network_policy.py), the body
read as a stream and stopped at MAX_DOCUMENT_BYTES.

aiohttp's own redirect handling would connect to each hop before anyone could look at it, so redirects are
followed one at a time (allow_redirects=False), at most MAX_DOCUMENT_REDIRECTS of them. The body is asked for
uncompressed and never decompressed here: a compressed body of a few kilobytes can expand to gigabytes. No proxy
from the environment is used (trust_env stays off): through a proxy the checked address would be the proxy's.
"""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import PurePosixPath

import aiohttp
from yarl import URL

from phoenix.stages.documents import (
    Document,
    DocumentFetchError,
    DocumentNotFoundError,
    DocumentRefusedError,
    redact,
    too_large,
)
from phoenix.stages.network_policy import AddressRefusedError, GuardedResolver, NetworkPolicy

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 16


class HttpFetcher:
    def __init__(self, policy: NetworkPolicy, *, max_bytes: int, max_redirects: int, timeout: float) -> None:
        self._policy = policy
        self._max_bytes = max_bytes
        self._max_redirects = max_redirects
        self._timeout = timeout
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(resolver=GuardedResolver(policy)),
            auto_decompress=False,
            headers={"Accept-Encoding": "identity"},
        )

    async def close(self) -> None:
        await self._session.close()

    async def fetch(self, url: str) -> Document:
        """DOCUMENT_TIMEOUT bounds the whole fetch, redirects included."""
        safe_url = redact(url)
        # Errors are re-raised without the aiohttp exception chained: its text repeats the full URL.
        try:
            async with asyncio.timeout(self._timeout):
                return await self._follow(_parsed(url), safe_url)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, AddressRefusedError):
                raise DocumentRefusedError(f"GET {safe_url}: {exc.os_error}") from None
            raise DocumentFetchError(f"GET {safe_url} failed: {type(exc).__name__}") from None
        except aiohttp.InvalidURL:  # e.g. a host that is no canonical IPv4 address (2130706433 for 127.0.0.1)
            raise DocumentRefusedError(f"GET {safe_url}: not a valid http(s) URL") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DocumentFetchError(f"GET {safe_url} failed: {type(exc).__name__}") from None

    async def _follow(self, url: URL, safe_url: str) -> Document:
        for _ in range(self._max_redirects + 1):
            self._check(url)
            async with self._session.get(url, allow_redirects=False) as response:
                if response.status in _REDIRECTS and (location := response.headers.get(aiohttp.hdrs.LOCATION)):
                    url = response.url.join(_parsed(location))
                    continue
                if response.status in (404, 410):
                    raise DocumentNotFoundError(f"GET {redact(str(url))} returned {response.status}")
                if response.status >= 300:
                    raise DocumentFetchError(f"GET {redact(str(url))} returned {response.status}")
                content = await self._body(response)
                name = response.content_disposition.filename if response.content_disposition else None
                return Document(name=name or PurePosixPath(url.path).name or "document", content=content)
        raise DocumentRefusedError(
            f"GET {safe_url}: more than MAX_DOCUMENT_REDIRECTS ({self._max_redirects}) redirects"
        )

    def _check(self, url: URL) -> None:
        """A hop's scheme, and its address when it is an IP literal (the resolver sees only names)."""
        if url.scheme not in ("http", "https"):
            raise DocumentRefusedError(f"{redact(str(url))}: a document is fetched over http or https only")
        host = url.raw_host or ""
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return  # a name: GuardedResolver checks what it resolves to
        if not self._policy.trusts(host, url.port) and (reason := self._policy.refusal(host)):
            raise DocumentRefusedError(f"GET {redact(str(url))}: {reason}")

    async def _body(self, response: aiohttp.ClientResponse) -> bytes:
        if response.content_length is not None and response.content_length > self._max_bytes:
            raise too_large(self._max_bytes)
        body = bytearray()
        async for chunk in response.content.iter_chunked(_CHUNK):
            body += chunk
            if len(body) > self._max_bytes:
                raise too_large(self._max_bytes)
        return bytes(body)


def _parsed(url: str) -> URL:
    try:
        return URL(url)
    except (ValueError, TypeError):
        raise DocumentRefusedError(f"{redact(url)}: not a valid http(s) URL") from None
