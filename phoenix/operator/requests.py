"""The annotations through which people ask a stage for one-off actions, and how the operator tracks them.

`phoenix.io/restart: <any new value>` rolls the workers; `phoenix.io/replay-dlq: <N|all>` moves DLQ entries
back to the input. Bookkeeping lives in status fields beside the schema's own (status keeps unknown fields):
`handledRestart` is the restart value already acted on; `replayRequest` is a replay being carried out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESTART_ANNOTATION = "phoenix.io/restart"
REPLAY_ANNOTATION = "phoenix.io/replay-dlq"
# On the Deployment: the restart value whose rollout it carries, written in the same patch as the rollout.
HANDLED_RESTART_ANNOTATION = "phoenix.io/restart-handled"
HANDLED_RESTART_FIELD = "handledRestart"
REPLAY_REQUEST_FIELD = "replayRequest"
MAX_REPLAY_COUNT = 10_000_000


class ReplayRequestError(ValueError):
    """The replay annotation's value is neither `all` nor a positive whole number."""


def parse_replay_count(value: str) -> int | None:
    """`all` -> None (no limit); `N` -> N."""
    text = value.strip().lower()
    if text == "all":
        return None
    if not text.isdigit() or not 0 < int(text) <= MAX_REPLAY_COUNT:
        raise ReplayRequestError(
            f"{REPLAY_ANNOTATION} must be `all` or a whole number from 1 to {MAX_REPLAY_COUNT}, got {value!r}"
        )
    return int(text)


def _annotations(body: Mapping[str, Any]) -> Mapping[str, str]:
    return body.get("metadata", {}).get("annotations") or {}


def _status(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return body.get("status") or {}


def restart_request(body: Mapping[str, Any]) -> str | None:
    """The restart value still to be acted on, if any."""
    value = _annotations(body).get(RESTART_ANNOTATION)
    if value is None or value == _status(body).get(HANDLED_RESTART_FIELD):
        return None
    return value


def replay_annotation(body: Mapping[str, Any]) -> str | None:
    return _annotations(body).get(REPLAY_ANNOTATION)


def pending_replay(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A replay recorded in status as begun and not yet finished."""
    return _status(body).get(REPLAY_REQUEST_FIELD) or None


def has_restart_request(body: Mapping[str, Any], **_: Any) -> bool:
    return restart_request(body) is not None


def has_replay_work(body: Mapping[str, Any], **_: Any) -> bool:
    return replay_annotation(body) is not None or pending_replay(body) is not None
