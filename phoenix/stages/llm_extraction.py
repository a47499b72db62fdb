"""Findings extraction by an OpenAI-compatible chat model, for reports the rules in extraction.py do not fit.

The official `openai` SDK (AsyncOpenAI) makes the calls: one client and one connection pool per process, each call
on a copy carrying its record's API key (`with_options`), so concurrent records of different users never share one.
The SDK's own retries are off: the runtime retries with backoff, and a 429 pauses the stage's shared rate limits.
"""

from __future__ import annotations

import json

import openai
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
from pydantic import ValidationError
from yarl import URL

from phoenix.stages.models import Category, Findings, Page
from phoenix.worker_runtime import RateLimited, report_cost
from phoenix.worker_runtime.billing import ApiKeyRejectedError

INSTRUCTIONS = (
    "You extract structured findings from medical report pages. Reply with one JSON object that follows this "
    "JSON schema, and nothing else. Copy names, codes, values and units exactly as printed; use flag H or L "
    "when the value is above or below its reference range, else normal; `page` is the page number.\n"
)
# A 429 without Retry-After (or Retry-After-Ms) waits this long.
DEFAULT_RETRY_AFTER_SECONDS = 1.0


class LLMExtractionError(Exception):
    """The model service failed or did not reply with findings. Transient: services recover, models vary."""


class LLMReplyError(LLMExtractionError):
    """The model replied, but not with findings (not JSON, or not the schema). Another attempt may get a better
    reply, but each is billed and the same report tends to get the same reply: a few attempts, then the DLQ."""

    max_attempts = 3  # the runtime's per-exception retry limit (phoenix.worker_runtime.PermanentError)


def build_messages(pages: list[Page]) -> list[ChatCompletionMessageParam]:
    report = "\n\n".join(f"=== Page {page.number} ===\n{page.text}" for page in pages)
    return [
        {"role": "system", "content": INSTRUCTIONS + json.dumps(Findings.model_json_schema())},
        {"role": "user", "content": report},
    ]


async def _no_shared_key() -> str:
    """The shared client's key: none. Every call names its record's key; one that did not is refused unsent."""
    raise LLMExtractionError("an LLM call without the record's API key")


class LLMExtractor:
    """Client of one OpenAI-compatible endpoint (`POST {base_url}/chat/completions`): OpenAI's, or a proxy's."""

    def __init__(self, base_url: str, model: str, timeout: float) -> None:
        # For messages: without the base URL's user info and query, where a proxy's credentials may be.
        self.url = f"{str(URL(base_url).with_user(None).with_query(None)).rstrip('/')}/chat/completions"
        self.model = model
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=_no_shared_key, max_retries=0, timeout=timeout)

    async def close(self) -> None:
        await self.client.close()

    async def extract(self, pages: list[Page], *, api_key: str | None) -> Findings:
        # Pages with nothing to extract (scans, cover pages) cost tokens and can only mislead the model.
        pages = [page for page in pages if page.categories != [Category.OTHER]]
        if not pages:
            return Findings()
        if not api_key:
            raise LLMExtractionError("no API key for the LLM: the user has none and OPENAI_API_KEY is not set")
        completion = await self._complete(build_messages(pages), api_key)
        if not isinstance(completion, ChatCompletion):  # a body that is not JSON, served as text
            raise LLMReplyError(f"POST {self.url} replied without a chat completion")
        # The SDK builds replies without validating them: a proxy's reply may lack any part, or have it wrong.
        tokens = getattr(completion.usage, "total_tokens", None)
        if isinstance(tokens, int) and tokens > 0:  # billed whatever the reply says: counts for a `cost: tokens` limit
            report_cost(tokens)
        return self._findings(completion)

    async def _complete(self, messages: list[ChatCompletionMessageParam], api_key: str) -> ChatCompletion:
        # The SDK's errors are never chained nor quoted: they carry the request, and a proxy's reply may echo it.
        try:
            return await self.client.with_options(api_key=api_key).chat.completions.create(
                model=self.model, temperature=0, response_format={"type": "json_object"}, messages=messages
            )
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            # The runtime drops the user's cached key before the retry (billing.py).
            raise ApiKeyRejectedError(f"POST {self.url} refused the API key (HTTP {exc.status_code})") from None
        except openai.RateLimitError as exc:
            # The SDK's own reading of Retry-After-Ms / Retry-After (seconds or a date), as its retries use it.
            retry_after = self.client._parse_retry_after_header(exc.response.headers)
            raise RateLimited(
                f"POST {self.url} returned 429", retry_after=retry_after or DEFAULT_RETRY_AFTER_SECONDS
            ) from None
        except openai.APIStatusError as exc:
            raise LLMExtractionError(f"POST {self.url} returned {exc.status_code}") from None
        except openai.APIError as exc:  # timeouts, connection errors
            raise LLMExtractionError(f"POST {self.url} failed: {type(exc).__name__}") from None
        except ValueError:  # a body served as JSON that is not
            raise LLMReplyError(f"POST {self.url} replied without a chat completion (not JSON)") from None

    def _findings(self, completion: ChatCompletion) -> Findings:
        choices = getattr(completion, "choices", None)
        message = getattr(choices[0], "message", None) if isinstance(choices, list) and choices else None
        content = getattr(message, "content", None)
        if not isinstance(content, str):
            raise LLMReplyError(f"POST {self.url} replied without a chat completion's message")
        try:
            return Findings.model_validate_json(content)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise LLMReplyError(
                f"the model's reply is not findings JSON: {exc.error_count()} error(s), first at "
                f"{'.'.join(map(str, first['loc'])) or 'top level'}: {first['msg']}"
            ) from None
