"""Prometheus metrics of one stage worker; every name here is documented in the Grafana dashboard."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Queue waits span milliseconds (hot stream) to hours (backlog after an outage).
_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400)
_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)

MESSAGES = Counter(
    "phoenix_messages",
    "Messages finished by outcome: processed, skipped_duplicate, retried, dead_lettered, deferred.",
    ["stage", "outcome"],
)
PROCESSING_SECONDS = Histogram(
    "phoenix_processing_duration_seconds", "Time spent in the processor per message.", ["stage"],
    buckets=_DURATION_BUCKETS,
)
QUEUE_WAIT_SECONDS = Histogram(
    "phoenix_queue_wait_seconds", "Time from XADD (the stream id's timestamp) to the start of processing.",
    ["stage"], buckets=_WAIT_BUCKETS,
)
IN_FLIGHT = Gauge("phoenix_in_flight_messages", "Messages read and not yet settled.", ["stage"])
CIRCUIT_STATE = Gauge("phoenix_circuit_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", ["stage"])
RECLAIMED = Counter("phoenix_reclaimed_messages", "Entries taken over from idle consumers by XAUTOCLAIM.", ["stage"])
TRIMMED_PENDING = Counter(
    "phoenix_trimmed_pending_messages", "Pending entries found trimmed from the stream and cleared.", ["stage"]
)
LOCK_CONTENTION = Counter(
    "phoenix_lock_contention", "Messages skipped because another worker holds the record's lock.", ["stage"]
)
BILLING_KEY_LOOKUPS = Counter(
    "phoenix_billing_key_lookups", "Per-user API key lookups by result: hit (cached) or miss (fetched).",
    ["stage", "result"],
)
DLQ_TRIMMED = Counter(
    "phoenix_dlq_trimmed_messages", "Dead letters removed from the DLQ because it held more than DLQ_MAXLEN.",
    ["stage"],
)
BACKPRESSURE = Gauge(
    "phoenix_backpressure", "1 while the stage has stopped reading because its output is over OUTPUT_HIGH_WATER.",
    ["stage"],
)
OUTPUT_UNFINISHED = Gauge(
    "phoenix_output_unfinished_messages", "Entries of the output stream the next stage has not acknowledged yet.",
    ["stage"],
)
