"""Secret values masked out of every error string the runtime stores (DLQ, retry entries) or logs.

A processor's exception text is the processor's business and may quote anything it had: the Redis URL with its
password, the billing master key, the user's API key. Two kinds of known secrets are masked:

- the process's own (`register`): the Redis passwords (RedisSpec.secrets), BILLING_MASTER_KEY, BILLING_CACHE_KEY,
  the password of BILLING_URL, OPENAI_API_KEY, and the variables MASKED_ENV names (those the operator took from
  Secrets: spec.env's secretKeyRef, spec.pod.envFrom's secretRef);
- the users' API keys a task has put in scope (`expose`, by `billing.api_key_scope`), held in a context variable,
  so each message's task masks exactly the keys its processor call was given (every user of a batch) and nothing
  grows with the number of users. The error strings must be built in the message's task, as the worker's outcome
  methods do (dead_letter_fields, retry_member, the failure's log line).

Each value is also masked as JSON and `repr` escape it, the forms it takes inside a log line. A value of MIN_LENGTH
characters or more is masked wherever it occurs. A shorter one (a PIN, a short password) is masked too, but only as a
whole token, where neither the character before nor the one after is a letter, digit or `_`: masked inside other
words it would garble ordinary text everywhere ("1234" inside every timestamp and entry id, "on" inside
"connection"), while the places a secret is quoted (`password=1234`, `:1234@`, `'1234'`) do set it apart. A value
of MIN_LENGTH characters and more is, if a secret at all, too rare inside other words for that to matter.

The cost per line stays flat: one substring search per known form (a C memchr/memcmp scan), and the regular
expression of a short value runs only on a line that holds it.
"""

from __future__ import annotations

import json
import re
from contextvars import ContextVar
from functools import lru_cache

MASK = "***"
MIN_LENGTH = 8

# The known forms: those masked wherever they are, longest first (so that a value containing another one is masked
# whole), then the short ones, each with the pattern that finds it as a whole token.
_Masks = tuple[tuple[str, ...], tuple[tuple[str, re.Pattern[str]], ...]]

_registered: set[str] = set()
_ordered: _Masks = ((), ())
_exposed: ContextVar[_Masks] = ContextVar("phoenix_exposed_secrets", default=((), ()))


def _forms(value: str) -> set[str]:
    return {value, json.dumps(value)[1:-1], repr(value)[1:-1]}


@lru_cache(maxsize=1024)
def _token(form: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(form)}(?!\w)")


def _masks(forms: set[str]) -> _Masks:
    longest_first = sorted(forms, key=len, reverse=True)
    return (
        tuple(form for form in longest_first if len(form) >= MIN_LENGTH),
        tuple((form, _token(form)) for form in longest_first if len(form) < MIN_LENGTH),
    )


def _known(masks: _Masks) -> set[str]:
    anywhere, tokens = masks
    return {*anywhere, *(form for form, _ in tokens)}


def register(*values: str | None) -> None:
    """Mask these values for the rest of the process (None and empty values are ignored)."""
    global _ordered
    for value in values:
        if value:
            _registered.update(_forms(value))
    _ordered = _masks(_registered)


def expose(value: str) -> None:
    """Mask `value` in this task (and the tasks and threads it starts from now on) for the rest of its life."""
    exposed = _known(_exposed.get())
    if value and not _forms(value) <= exposed:
        _exposed.set(_masks(exposed | _forms(value)))


def _masked(text: str, masks: _Masks) -> str:
    anywhere, tokens = masks
    for form in anywhere:
        if form in text:
            text = text.replace(form, MASK)
    for form, token in tokens:
        if form in text:
            text = token.sub(MASK, text)
    return text


def scrub(text: str) -> str:
    """`text` with every known secret replaced by MASK; the same string when it holds none."""
    return _masked(_masked(text, _ordered), _exposed.get())


_USER_INFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]*@")


def without_user_info(text: str) -> str:
    """`text` with the user info of every URL in it (`scheme://user:password@host`) shown as `scheme://***@host`:
    for a value echoed from a configuration that is not known to be secret."""
    return _USER_INFO.sub(rf"\g<scheme>{MASK}@", text)
