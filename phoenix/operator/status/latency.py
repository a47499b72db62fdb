"""Pure status logic for end-to-end latency: a final stage's status.latency from the buckets read from Redis, and a
pipeline's from its stages' (tools/latency.py does the maths)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from phoenix.crds import LatencyBucket, LatencyStatus, StageLatencyStatus
from phoenix.tools.latency import Buckets, merged, quantile

# Seconds are shown to the millisecond: the buckets are far coarser.
_DIGITS = 3


def _figures(buckets: Buckets) -> dict[str, Any]:
    p50, p99 = quantile(buckets, 0.5), quantile(buckets, 0.99)
    return {
        "count": sum(buckets.values()),
        "p50_seconds": None if p50 is None else round(p50, _DIGITS),
        "p99_seconds": None if p99 is None else round(p99, _DIGITS),
    }


def stage_latency(buckets: Buckets) -> dict[str, Any] | None:
    """status.latency of a stage (wire form), its buckets smallest first; None when it finished nothing."""
    if not buckets:
        return None
    ordered = sorted(buckets.items(), key=lambda item: float(item[0]))
    lines = [LatencyBucket(le=bound, count=count) for bound, count in ordered]
    return StageLatencyStatus(buckets=lines, **_figures(buckets)).to_k8s()


def pipeline_latency(stage_statuses: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """status.latency of a pipeline from its stages' status (only final stages have a latency): their buckets
    merged; None when none finished a record."""
    buckets = merged(
        {
            str(line.get("le")): int(line.get("count") or 0)
            for line in (status.get("latency") or {}).get("buckets") or []
        }
        for status in stage_statuses
    )
    return LatencyStatus(**_figures(buckets)).to_k8s() if buckets else None
