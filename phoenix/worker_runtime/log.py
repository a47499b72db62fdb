"""structlog set-up: one JSON object per line on stdout, the field names the dashboards and runbooks use."""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

import structlog
from structlog.typing import EventDict

from phoenix.worker_runtime import jsoncodec
from phoenix.worker_runtime.scrub import scrub
from phoenix.worker_runtime.tracing import log_ids

_log = structlog.get_logger("phoenix.worker")


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


def add_trace_context(_logger: Any, _method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: trace_id and span_id of the span the line is written in (a record's process span, a
    reconcile), so that a line and its trace can be found from each other."""
    if (ids := log_ids()) is not None:
        for key, value in ids.items():
            event_dict.setdefault(key, value)
    return event_dict


def scrub_line(_logger: Any, _method: str, line: Any) -> str:
    """structlog processor after the renderer (so `line` is the rendered str): known secrets masked out of the
    whole line, wherever they are (an error, a traceback, a repr), so that no field needs to be known in advance."""
    return scrub(line)


def _encode_line(event_dict: dict[str, Any], **_options: Any) -> str:
    return jsoncodec.dumps(event_dict, repr)


# Where configure_logging sends JSON lines; None until then, or when the format is not JSON.
_json_output: TextIO | None = None


def log_info_lines(lines: list[dict[str, Any]]) -> None:
    """Log many info lines at once, each `{"event": ..., **fields}`, as `log.info(event, **fields)` would.

    For the one line per finished message: at LOG_LEVEL=info that is tens of thousands of lines a second, and
    structlog's processor chain and a flushed write per line cost more than the rest of a message's handling.
    With JSON output the lines are built here the way the chain builds them (structlog's context variables, level,
    an ISO UTC timestamp, taken once for the batch) and written with one write.
    """
    if _json_output is None:
        for fields in lines:
            _log.info(fields.pop("event"), **fields)
        return
    # As in the chain: a line's own fields win over context variables; level and timestamp are set over both.
    context = structlog.contextvars.get_contextvars()
    stamp = {"level": "info", "timestamp": datetime.now(tz=UTC).isoformat().replace("+00:00", "Z")}
    # Not scrubbed, unlike the chain's lines: these carry ids and timings only, and masking would cost a tenth of a
    # message's handling when a Redis password is set.
    _json_output.write("".join(jsoncodec.dumps({**context, **fields, **stamp}, repr) + "\n" for fields in lines))
    _json_output.flush()


# The level from which stdlib `logging` lines (a processor's, its libraries') are written: Python's own default
# (its last-resort handler writes WARNING and above), so that libraries' info chatter stays out as before.
STDLIB_LEVEL = logging.WARNING


def _stdlib_to_json(pre_chain: list[structlog.typing.Processor], renderer: structlog.typing.Processor) -> None:
    """stdlib `logging` lines as the worker's own JSON lines on stdout, with the same fields (the message's ids,
    trace_id and span_id, service, level, timestamp) and `logger`, instead of plain text on stderr."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*pre_chain, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
                scrub_line,
            ],
        )
    )
    handler.set_name("phoenix-json")
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if h.get_name() != "phoenix-json"] + [handler]
    root.setLevel(STDLIB_LEVEL)


def configure_logging(service: str, level: str = "info", fmt: str = "json") -> None:
    global _json_output
    _json_output = sys.stdout if fmt == "json" else None
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_encode_line) if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    pre_chain: list[structlog.typing.Processor] = [
        add_message_context,
        add_trace_context,
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    if fmt == "json":
        _stdlib_to_json(pre_chain, renderer)
    structlog.configure(
        processors=[*pre_chain, structlog.processors.format_exc_info, renderer, scrub_line],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=structlog.WriteLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
