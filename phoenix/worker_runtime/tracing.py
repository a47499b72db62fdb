"""OpenTelemetry traces: a span per record and stage, one per batch write, and one per operator reconcile.

The standard environment configures them (configure_tracing): OTEL_EXPORTER_OTLP_ENDPOINT (or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or OTEL_TRACES_EXPORTER=otlp|console) turns export on, OTEL_SERVICE_NAME,
OTEL_TRACES_SAMPLER, OTEL_BSP_* and the exporter's own OTEL_EXPORTER_OTLP_* are read by the SDK. Unset, nothing is
configured and the worker's only cost per message is the `recording` flag it checks. A processor may still configure
an SDK of its own in `initialize()`: MessageTracing is built after it and records into it.

Per record and stage (docs/observability.md): one span, `{stage} process` (CONSUMER, parent: the traceparent the
entry carries, so the next stage continues the trace), from when the worker took the record up to its durable write
(the queue wait before it and the processor's time attributes), and per batch write a `{stage} settle`
span linked to every record's span. A failed attempt's retry and dead letter carry its span's traceparent: the next
attempt, or a DLQ replay, is its child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from phoenix.errors import ConfigError

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR = TraceContextTextMapPropagator()
except ImportError:  # tracing is optional (the `tracing` extra)
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.sampling import Sampler
    from opentelemetry.trace import Span, TracerProvider

    from phoenix.worker_runtime.messages import Message
    from phoenix.worker_runtime.settings import WorkerSettings

_SCOPE = "phoenix"
# Any of these set means export was asked for (the SDK's own default exporter, otlp, would be on otherwise).
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_HEADERS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
# Every variable Phoenix itself reads (the SDK and exporter read more): docs/configuration.md documents each.
READ_VARIABLES = ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_SERVICE_NAME", *_ENDPOINTS, *_PROTOCOLS, *_HEADERS)
# The workers' sampling without OTEL_TRACES_SAMPLER: what keeps tracing's cost small beside a fast stage's own
# (docs/performance.md, "Tracing", has the measurement and the arithmetic).
WORKER_SAMPLE_RATIO = 0.01
# The one-word outcome on a record's spans, by outcomes.Disposition's value.
_OUTCOMES = {"C": "commit", "D": "dlq", "R": "retry", "L": "leave", "S": "duplicate"}


class TracingConfigError(ConfigError):
    """The OTEL_* environment asks for something this installation cannot do; the text names the variable."""


def _exporter_name(env: Mapping[str, str]) -> str:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "none"
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        return named
    return "otlp" if any(env.get(name) for name in _ENDPOINTS) else "none"


def configure_tracing(
    default_service: str, env: Mapping[str, str] | None = None, default_ratio: float | None = None
) -> Callable[[], None] | None:
    """Install the SDK's tracer provider and exporter when the environment asks for export; returns the shutdown
    (it flushes the spans not yet sent), or None when nothing was configured. Raises TracingConfigError.

    `default_ratio`: without OTEL_TRACES_SAMPLER, the traces started here are sampled at that ratio (and a trace
    begun upstream keeps its decision: parentbased_traceidratio), rather than the SDK's always_on."""
    env = os.environ if env is None else env
    exporter_name = _exporter_name(env)
    if exporter_name == "none":
        return None
    if exporter_name not in ("otlp", "console"):
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER={exporter_name}: only otlp, console and none are supported")
    protocols = [(name, env[name]) for name in _PROTOCOLS if env.get(name)]
    if exporter_name == "otlp" and protocols and protocols[0][1] != "http/protobuf":
        raise TracingConfigError(f"{protocols[0][0]}={protocols[0][1]}: only http/protobuf is supported")
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        raise TracingConfigError(
            "tracing is configured (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER) but the OpenTelemetry SDK "
            "is not installed: install phoenix-streams[tracing]"
        ) from None
    exporter: SpanExporter
    if exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # endpoint, headers, timeout, compression: its OTEL_EXPORTER_OTLP_* variables
    else:
        exporter = ConsoleSpanExporter()
    # The sampler comes from OTEL_TRACES_SAMPLER(_ARG) (or default_ratio), the batching from OTEL_BSP_*: the SDK
    # reads them itself.
    sampler = default_sampler(env, default_ratio)
    service = env.get("OTEL_SERVICE_NAME") or default_service

    class HashedOnce(Resource):
        """The OTLP encoder hashes the resource of every span it exports, and a Resource's hash is a JSON dump of
        its attributes (5 us a span); this one's attributes never change, so it is hashed once."""

        def __init__(self, resource: Resource) -> None:
            super().__init__(resource.attributes, resource.schema_url)
            self._hash = super().__hash__()

        def __hash__(self) -> int:
            return self._hash

    provider = TracerProvider(resource=HashedOnce(Resource.create({SERVICE_NAME: service})), sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider.shutdown


def default_sampler(env: Mapping[str, str], default_ratio: float | None) -> Sampler | None:
    """parentbased_traceidratio at `default_ratio` when OTEL_TRACES_SAMPLER is unset; else None (the SDK's own)."""
    if default_ratio is None or env.get("OTEL_TRACES_SAMPLER"):
        return None
    from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

    return ParentBasedTraceIdRatio(default_ratio)


def otlp_header_values(env: Mapping[str, str] | None = None) -> list[str]:
    """The values of OTEL_EXPORTER_OTLP_(TRACES_)HEADERS (`name=value,...`, URL-encoded): credentials, as a rule."""
    env = os.environ if env is None else env
    values = []
    for name in _HEADERS:
        for pair in env.get(name, "").split(","):
            if (value := pair.partition("=")[2].strip()) != "":
                values += [value, urllib.parse.unquote(value)]
    return values


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def traceparent_of(span: Span) -> str:
    """The W3C traceparent naming `span` as the parent (what the next stage, a retry or a dead letter carries)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id a W3C traceparent names (`00-<trace id>-<span id>-<flags>`); None when absent or malformed."""
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or parts[1] == "0" * 32:
        return None
    try:
        int(parts[1], 16)
    except ValueError:
        return None
    return parts[1]


def _parent(traceparent: str | None) -> Any:
    """The context a traceparent names; None (a new trace) when absent or malformed."""
    if not traceparent:
        return None
    return _PROPAGATOR.extract({"traceparent": traceparent})


def log_ids() -> dict[str, str] | None:
    """trace_id and span_id of the current span, for a log line; None outside a recorded span."""
    if trace is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


class TraceIdsFilter(logging.Filter):
    """For stdlib logging (the operator's kopf lines): trace_id and span_id on a record written inside a span, as
    log.add_trace_context does for the workers' structlog lines; a JSON formatter writes them as fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (ids := log_ids()) is not None:
            record.trace_id, record.span_id = ids["trace_id"], ids["span_id"]
        return True


@dataclass(slots=True)
class RecordTrace:
    """A record's span, carried on its Outcome to the settle, where it ends."""

    span: Span
    traceparent: str  # the span's: what the forwarded entry, a retry or a dead letter carries
    started_ns: int

    @property
    def ids(self) -> dict[str, str]:
        """trace_id and span_id, for the record's log lines (cut from the traceparent: no call into the SDK)."""
        return {"trace_id": self.traceparent[3:35], "span_id": self.traceparent[36:52]}


class TracedOutcome(Protocol):
    """What the spans read of a record's outcome (outcomes.Outcome, which sits above this module and carries the
    RecordTrace to the settle)."""

    duplicate: bool
    trace: RecordTrace | None

    @property
    def disposition(self) -> StrEnum: ...


class MessageTracing:
    """The worker's spans. `recording` is decided once, when the worker is built: False without a configured SDK,
    and then no method but `traceparent` passing is ever called.

    One span per record, `{stage} process`, from its take-up to its durable write, and one `{stage} settle` per
    batch write: each span the Python SDK makes and encodes costs tens of microseconds, so the queue wait is an
    attribute, so is the processor's time, and the stage's constant attributes are the tracer's (the
    instrumentation scope's), encoded once per export rather than once per span."""

    def __init__(self, settings: WorkerSettings, provider: TracerProvider | None = None) -> None:
        self._stage = stage = settings.service_name
        self.recording: bool = False
        if trace is None:
            return
        provider = provider or trace.get_tracer_provider()
        self.recording = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
        # The messaging semantic conventions, the same for every span of this stage.
        scope = {
            "messaging.system": "redis",
            "messaging.destination.name": settings.input_queue,
            "messaging.consumer.group.name": settings.consumer_group,
            "messaging.operation.type": "process",
            "phoenix.stage": stage,
        }
        self._tracer = provider.get_tracer(_SCOPE, attributes=scope)
        self._process_name, self._settle_name = f"{stage} process", f"{stage} settle"
        self._error = trace.Status(trace.StatusCode.ERROR)

    def begin(self, m: Message, read_at: float) -> RecordTrace:
        """The record's span from `read_at` on; its queue wait (the entry id's time to `read_at`) an attribute.

        The message's raw fields take the span's traceparent, so that its retry or dead letter, made from them,
        continues this attempt."""
        span = self._tracer.start_span(
            self._process_name,
            _parent(m.traceparent),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.message.id": m.entry_id,
                "phoenix.record_id": m.record_id,
                "phoenix.attempt": m.retry_count + 1,
                "phoenix.queue_wait_ms": max(0, int(read_at * 1000) - m.enqueued_at_ms),
            },
            start_time=(start := _ns(read_at)),
        )
        traceparent = traceparent_of(span)
        m.raw[b"traceparent"] = traceparent.encode()
        return RecordTrace(span, traceparent, start)

    def current(self, record: RecordTrace) -> contextlib.AbstractContextManager[Any]:
        """The record's span as the current span (the processor's own spans and log lines are inside it)."""
        return trace.use_span(record.span, end_on_exit=False)

    def processed(self, record: RecordTrace, outcome: TracedOutcome) -> None:
        """The processor returned and the outcome is decided: the time it took an attribute (an event would cost
        three times as much), the span carried by the outcome to the settle."""
        record.span.set_attribute("phoenix.process_ms", round((time.time_ns() - record.started_ns) / 1e6, 3))
        outcome.trace = record

    def duplicate(self, m: Message, outcome: TracedOutcome) -> None:
        """A record the claim found committed already: its span runs from the claim to the acknowledgement."""
        outcome.trace = self.begin(m, time.time())

    def given_up(self, outcome: TracedOutcome) -> None:
        """An outcome that came after its record was given up past its timeout (and settled otherwise): its span
        ends now, `phoenix.outcome=given_up`."""
        if (record := outcome.trace) is not None:
            record.span.set_attribute("phoenix.outcome", "given_up")
            record.span.set_status(self._error)
            record.span.end()

    @contextlib.contextmanager
    def settling(self, batch: Sequence[TracedOutcome]) -> Iterator[None]:
        """Around one batch write: its settle span (current while it lasts), linked to every record's span; once
        written, each record's span ends there with the final outcome."""
        # The sampled ones: a batch of records not sampled gets no span either.
        records = [(o, o.trace) for o in batch if o.trace is not None and o.trace.span.is_recording()]
        if not records:
            yield
            return
        settle = self._tracer.start_span(
            self._settle_name,
            context=None,
            kind=trace.SpanKind.PRODUCER,
            attributes={"messaging.batch.message_count": len(batch)},
            links=[trace.Link(r.span.get_span_context()) for _, r in records],
        )
        # Current during the write: its lines (replicas_behind, settle_failed, an item's fallback) carry its ids.
        try:
            with trace.use_span(settle, end_on_exit=False):
                yield
        finally:
            now = time.time_ns()
            settle.end(end_time=now)
        for o, record in records:
            value = o.disposition.value
            span = record.span
            span.set_attribute("phoenix.outcome", "duplicate" if o.duplicate else _OUTCOMES[value])
            if value in ("R", "D"):
                span.set_status(self._error)
            span.end(end_time=now)


@contextlib.contextmanager
def operation_span(name: str, attributes: Mapping[str, str | int]) -> Iterator[None]:
    """A span around one operator operation (a reconcile); an exception marks it failed. Nothing without an SDK."""
    if trace is None:
        yield
        return
    with trace.get_tracer(_SCOPE).start_as_current_span(name, attributes=attributes):
        yield
