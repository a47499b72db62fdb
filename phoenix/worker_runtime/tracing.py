"""W3C trace context from stage to stage through the `traceparent` message field.

Works with the OpenTelemetry API alone (the context passes through unchanged) and records a span per message
when an SDK is configured (do that in the processor's `initialize()`); without the `opentelemetry-api` package
it does nothing at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

try:
    from opentelemetry import propagate, trace
except ImportError:  # tracing is optional
    trace = None  # type: ignore[assignment]


class MessageTracing:
    def __init__(self, stage: str) -> None:
        self._stage = stage
        # Decided once, at worker start: asking the API per message costs an environment lookup each time.
        self._recording = trace is not None and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)

    def span(self, record_id: str, traceparent: str | None) -> contextlib.AbstractContextManager[str | None]:
        """Around one processor call; yields the traceparent the forwarded message carries to the next stage."""
        if trace is None or (traceparent is None and not self._recording):
            return contextlib.nullcontext(traceparent)  # nothing to continue, nobody recording
        return self._span(record_id, traceparent)

    @contextlib.contextmanager
    def _span(self, record_id: str, traceparent: str | None) -> Iterator[str | None]:
        parent = propagate.extract({"traceparent": traceparent} if traceparent else {})
        tracer = trace.get_tracer("phoenix.worker_runtime")
        with tracer.start_as_current_span(
            f"{self._stage} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes={"messaging.system": "redis", "phoenix.stage": self._stage, "phoenix.record_id": record_id},
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            yield carrier.get("traceparent", traceparent)
