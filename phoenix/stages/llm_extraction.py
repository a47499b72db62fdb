"""Findings extraction by an OpenAI-compatible chat model, for reports the rules in extraction.py do not fit."""

from __future__ import annotations

import json

import aiohttp
from pydantic import ValidationError

from phoenix.stages.models import Category, Findings, Page
from phoenix.worker_runtime.billing import ApiKeyRejectedError

INSTRUCTIONS = (
    "You extract structured findings from medical report pages. Reply with one JSON object that follows this "
    "JSON schema, and nothing else. Copy names, codes, values and units exactly as printed; use flag H or L "
    "when the value is above or below its reference range, else normal; `page` is the page number.\n"
)


class LLMExtractionError(Exception):
    """The model service failed or did not reply with findings. Transient: services recover, models vary."""


def build_request(pages: list[Page], model: str) -> dict[str, object]:
    report = "\n\n".join(f"=== Page {page.number} ===\n{page.text}" for page in pages)
    return {
        "model": model,
        "temperature": 0,
        "response_format": {"type": "json_object"},
        "messages": [
            {"role": "system", "content": INSTRUCTIONS + json.dumps(Findings.model_json_schema())},
            {"role": "user", "content": report},
        ],
    }


class LLMExtractor:
    """Client of one OpenAI-compatible endpoint (`POST {base_url}/chat/completions`)."""

    def __init__(self, base_url: str, model: str, timeout: float) -> None:
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self.model = model
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))

    async def close(self) -> None:
        await self.session.close()

    async def extract(self, pages: list[Page], *, api_key: str | None) -> Findings:
        # Pages with nothing to extract (scans, cover pages) cost tokens and can only mislead the model.
        pages = [page for page in pages if page.categories != [Category.OTHER]]
        if not pages:
            return Findings()
        if not api_key:
            raise LLMExtractionError("no API key for the LLM: the user has none and OPENAI_API_KEY is not set")
        # aiohttp errors are not chained: their request info carries the Authorization header.
        try:
            async with self.session.post(
                self.url, json=build_request(pages, self.model), headers={"Authorization": f"Bearer {api_key}"}
            ) as response:
                if response.status in (401, 403):  # the runtime drops the user's cached key before the retry
                    raise ApiKeyRejectedError(f"POST {self.url} refused the API key (HTTP {response.status})")
                if response.status != 200:
                    raise LLMExtractionError(f"POST {self.url} returned {response.status}")
                reply = await response.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # ValueError: a body that is not JSON
            raise LLMExtractionError(f"POST {self.url} failed: {type(exc).__name__}") from None
        try:
            return Findings.model_validate_json(reply["choices"][0]["message"]["content"])
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMExtractionError(f"POST {self.url} replied without a chat completion ({exc!r})") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            raise LLMExtractionError(
                f"the model's reply is not findings JSON: {exc.error_count()} error(s), first at "
                f"{'.'.join(map(str, first['loc'])) or 'top level'}: {first['msg']}"
            ) from None
