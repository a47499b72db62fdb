"""Secret values masked out of every error string the runtime stores (DLQ, retry entries) or logs.

A processor's exception text is the processor's business and may quote anything it had: the Redis URL with its
password, the billing master key, the user's API key. Two kinds of known secrets are masked:

- the process's own (`register`): the Redis passwords (RedisSpec.secrets), BILLING_MASTER_KEY, BILLING_CACHE_KEY,
  OPENAI_API_KEY;
- the users' API keys a task has put in scope (`expose`, by `billing.api_key_scope`), held in a context variable,
  so each message's task masks exactly the keys its processor call was given (every user of a batch) and nothing
  grows with the number of users. The error strings must be built in the message's task, as the worker's outcome
  methods do (dead_letter_fields, retry_member, the failure's log line).

Each value is also masked as JSON and `repr` escape it, the forms it takes inside a log line. Values shorter than
MIN_LENGTH are not masked: they would match ordinary words, and protect nothing anyway.
"""

from __future__ import annotations

import json
from contextvars import ContextVar

MASK = "***"
MIN_LENGTH = 4

_registered: set[str] = set()
# Longest first, so that a value containing another one is masked whole.
_ordered: tuple[str, ...] = ()
_exposed: ContextVar[tuple[str, ...]] = ContextVar("phoenix_exposed_secrets", default=())


def _forms(value: str) -> set[str]:
    return {value, json.dumps(value)[1:-1], repr(value)[1:-1]} if len(value) >= MIN_LENGTH else set()


def register(*values: str | None) -> None:
    """Mask these values for the rest of the process (None and empty values are ignored)."""
    global _ordered
    for value in values:
        if value:
            _registered.update(_forms(value))
    _ordered = tuple(sorted(_registered, key=len, reverse=True))


def expose(value: str) -> None:
    """Mask `value` in this task (and the tasks and threads it starts from now on) for the rest of its life."""
    exposed = _exposed.get()
    forms = _forms(value).difference(exposed)
    if forms:
        _exposed.set(tuple(sorted((*exposed, *forms), key=len, reverse=True)))


def scrub(text: str) -> str:
    """`text` with every known secret replaced by MASK; the same string when it holds none."""
    for value in _ordered:
        if value in text:
            text = text.replace(value, MASK)
    for value in _exposed.get():
        if value in text:
            text = text.replace(value, MASK)
    return text
