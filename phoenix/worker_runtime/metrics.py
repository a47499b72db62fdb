"""Prometheus metrics of one stage worker; every name here is documented in the Grafana dashboard."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from phoenix.keys import LATENCY_BUCKETS

# Queue waits span milliseconds (hot stream) to hours (backlog after an outage).
_WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 14400)
_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)


class StageHistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds  # each bucket's upper bound, the last one +Inf
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket with value <= le
        self.sum += value


class StageHistogram(Collector):
    """A histogram labelled by stage (and `labelnames` after it), exported like prometheus_client's Histogram (same
    series and `le` labels).

    Observed twice per message from the event loop: a list bump here, where the library's Histogram takes two
    locks and walks its buckets in Python. Scrapes read a copy of the counts, so a scrape in another thread
    sees every bucket at most one observation behind.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], labelnames: Sequence[str] = ()) -> None:
        self._name, self._documentation = name, documentation
        self.labelnames = ("stage", *labelnames)
        self._bounds = (*buckets, math.inf)
        self._children: dict[tuple[str, ...], StageHistogramChild] = {}
        REGISTRY.register(self)

    def labels(self, stage: str, *values: str) -> StageHistogramChild:
        key = (stage, *values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self._name} is labelled by {', '.join(self.labelnames)}")
        return self._children.setdefault(key, StageHistogramChild(self._bounds))

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self.labelnames)
        for key, child in list(self._children.items()):
            cumulative, buckets = 0, []
            for bound, count in zip(self._bounds, list(child.counts), strict=True):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(list(key), buckets, child.sum)
        yield family


MESSAGES = Counter(
    "phoenix_messages",
    "Messages finished by outcome: processed, skipped_duplicate, retried, dead_lettered, deferred, throttled.",
    ["stage", "outcome"],
)
PROCESSING_SECONDS = StageHistogram(
    "phoenix_processing_duration_seconds", "Time spent in the processor per message.", _DURATION_BUCKETS
)
QUEUE_WAIT_SECONDS = StageHistogram(
    "phoenix_queue_wait_seconds",
    "Time from XADD (the stream id's timestamp) to the start of processing.",
    _WAIT_BUCKETS,
)
PIPELINE_LATENCY_SECONDS = StageHistogram(
    "phoenix_pipeline_latency_seconds",
    "From the record's entry into the pipeline (entered_at) to its commit at a final stage, once per record.",
    LATENCY_BUCKETS,  # the operator reads them back from Redis (worker_runtime/latency.py)
    ["pipeline"],
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
    "phoenix_billing_key_lookups",
    "Per-user API key lookups by result: hit (cached) or miss (fetched).",
    ["stage", "result"],
)
DLQ_TRIMMED = Counter(
    "phoenix_dlq_trimmed_messages",
    "Dead letters removed from the DLQ because it held more than DLQ_MAXLEN.",
    ["stage"],
)
BACKPRESSURE = Gauge(
    "phoenix_backpressure",
    "1 while the stage has stopped reading because its output is over OUTPUT_HIGH_WATER.",
    ["stage"],
)
OUTPUT_UNREAD = Gauge(
    "phoenix_output_unread",
    "1 while no consumer group reads the output stream: it is trimmed only by OUTPUT_RETENTION, if set.",
    ["stage"],
)
OUTPUT_RETENTION_TRIMMED = Counter(
    "phoenix_output_retention_trimmed_messages",
    "Entries removed from an output stream that no consumer group reads, to keep it to OUTPUT_RETENTION.",
    ["stage"],
)
OUTPUT_UNFINISHED = Gauge(
    "phoenix_output_unfinished_messages",
    "Entries of the output stream the next stage has not acknowledged yet.",
    ["stage"],
)
LEAKED_THREADS = Gauge(
    "phoenix_leaked_threads",
    "run_blocking threads still running after their call was cancelled; /healthz fails at MAX_LEAKED_THREADS.",
    ["stage"],
)
OUTBOX_BACKLOG = Gauge(
    "phoenix_outbox_backlog_messages",
    "Committed results in the stage's outboxes not yet relayed to their streams (a forward to another slot).",
    ["stage"],
)
OUTBOX_RELAYED = Counter(
    "phoenix_outbox_relayed_messages",
    "Committed results the relay moved from the stage's outboxes to their streams.",
    ["stage"],
)
