"""structlog set-up: one JSON object per line on stdout, the field names the dashboards and runbooks use."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from typing import Any, Protocol

import structlog
from structlog.typing import EventDict


class _LoggedMessage(Protocol):
    record_id: str
    user_id: str
    entry_id: str


#: The message the current task is processing. One variable set per message, instead of binding three
#: structlog context variables, since it is set tens of thousands of times a second and read only per log line.
CURRENT_MESSAGE: ContextVar[_LoggedMessage | None] = ContextVar("phoenix_current_message", default=None)


def add_message_context(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: the ids of the message being processed, on every line logged while it is."""
    message = CURRENT_MESSAGE.get()
    if message is not None:
        event_dict.setdefault("record_id", message.record_id)
        event_dict.setdefault("user_id", message.user_id)
        event_dict.setdefault("message_id", message.entry_id)
    return event_dict


# Built once: json.dumps with any option (JSONRenderer passes `default`) builds a new encoder for every line.
_LINE_ENCODER = json.JSONEncoder(default=repr)


def _encode_line(event_dict: dict[str, Any], **_options: Any) -> str:
    return _LINE_ENCODER.encode(event_dict)


def configure_logging(service: str, level: str = "info", fmt: str = "json") -> None:
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_encode_line) if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            add_message_context,
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.WriteLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
