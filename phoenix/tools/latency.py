"""End-to-end latency quantiles from bucket counts, as Prometheus's histogram_quantile computes them: the buckets
of a final stage's windows (worker_runtime/latency.py) merged, over windows and over a pipeline's final stages, then
the quantile interpolated linearly inside the bucket its rank falls in. Its resolution is the bucket's width: the
figure is exact only for latencies spread evenly through each bucket, and always inside the bucket that holds the
exact quantile."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from phoenix.keys import LATENCY_BUCKETS

# A bucket's upper bound as Prometheus writes it (`0.5`, `1.0`, `+Inf`) -> the observations in that bucket alone
# (not cumulative).
Buckets = Mapping[str, int]


def merged(counts: Iterable[Buckets]) -> dict[str, int]:
    """The buckets of every window or stage in `counts` added up, by upper bound; empty buckets left out."""
    total: dict[str, int] = {}
    for buckets in counts:
        for bound, count in buckets.items():
            if count > 0:
                total[bound] = total.get(bound, 0) + count
    return total


def parse_hash(reply: Mapping[Any, Any]) -> dict[str, int]:
    """A window's hash (HGETALL) as buckets; a field that is no number, or a count that is no whole number, is not
    one of ours and left out."""
    found: dict[str, int] = {}
    for field, value in reply.items():
        bound = field.decode() if isinstance(field, bytes) else field
        count = value.decode() if isinstance(value, bytes) else value
        if isinstance(bound, str) and isinstance(count, str) and _bound(bound) is not None and count.isdigit():
            found[bound] = int(count)
    return found


def _bound(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 and not math.isnan(value) else None


def quantile(buckets: Buckets, q: float, layout: Sequence[float] = LATENCY_BUCKETS) -> float | None:
    """The q-quantile (0 <= q <= 1) of the observations in `buckets`, None when there are none. The rank q x total
    falls in the first bucket whose cumulative count reaches it; inside it the value is interpolated linearly from
    the bucket's lower bound to its upper bound. A bucket's lower bound is the next smaller bound of the `layout`
    (empty buckets are not stored) or of `buckets`, 0 for the first. A rank in the +Inf bucket gives the largest
    finite bound: the figure then means "at least"."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, not {q}")
    ordered = sorted((bound, count) for text, count in buckets.items() if (bound := _bound(text)) and count > 0)
    total = sum(count for _, count in ordered)
    if not total:
        return None
    bounds = sorted({*layout, *(bound for bound, _ in ordered)} - {math.inf})
    rank = q * total
    cumulative = 0
    for upper, count in ordered:
        below = bisect_left(bounds, upper)  # the finite bounds smaller than `upper`
        lower = bounds[below - 1] if below else 0.0
        if cumulative + count >= rank:
            if math.isinf(upper):
                return lower
            return min(upper, lower + (upper - lower) * max(0.0, rank - cumulative) / count)  # no rounding past it
        cumulative += count
    raise AssertionError("unreachable: the last bucket's cumulative count is the total, at least the rank")
