"""The end-to-end latency quantiles of a pipeline's status (tools/latency.py), against exact quantiles: of the raw
latencies (the estimate lies in the bucket holding the exact one) and of the bucketed data spread evenly through
each bucket (the estimate is that distribution's quantile, found here by bisecting its distribution function). The
buckets are made as the worker makes them: its histogram's counts, named by their `le` labels, split over windows
and stages and merged."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from phoenix.keys import LATENCY_BUCKETS
from phoenix.operator.status.latency import pipeline_latency, stage_latency
from phoenix.tools.latency import Buckets, merged, parse_hash, quantile
from phoenix.worker_runtime.metrics import StageHistogramChild
from tests.fixtures.fuzzing import fuzz_settings

BOUNDS = (*LATENCY_BUCKETS, math.inf)
LARGEST = LATENCY_BUCKETS[-1]
latencies = st.lists(
    st.floats(min_value=0, max_value=2 * LARGEST, allow_nan=False) | st.sampled_from(LATENCY_BUCKETS),
    min_size=1,
    max_size=300,
)
quantiles = st.floats(min_value=0, max_value=1, exclude_min=True) | st.sampled_from([0.5, 0.9, 0.99, 1.0])


def bucketed(values: list[float]) -> dict[str, int]:
    """What a worker's flush writes for these latencies: its histogram's non-empty buckets by `le` label."""
    histogram = StageHistogramChild(BOUNDS)
    for value in values:
        histogram.observe(value)
    return {floatToGoString(b): n for b, n in zip(BOUNDS, histogram.counts, strict=True) if n}


def bucket_of(value: float) -> tuple[float, float]:
    """The (lower, upper] bounds of the bucket holding `value`."""
    lower = 0.0
    for upper in BOUNDS:
        if value <= upper:
            return lower, upper
        lower = upper
    raise AssertionError(value)


@pytest.mark.fuzz
@fuzz_settings(300)
@given(values=latencies, q=quantiles, split=st.integers(min_value=0, max_value=300))
def test_the_estimate_lies_in_the_bucket_of_the_exact_quantile(values: list[float], q: float, split: int) -> None:
    # Two windows (or two final stages) of the same records, merged: as if counted in one.
    buckets = merged([bucketed(values[:split]), bucketed(values[split:])])
    assert buckets == bucketed(values)
    exact = sorted(values)[math.ceil(q * len(values)) - 1]  # the smallest value with at least q of all at or below
    estimate = quantile(buckets, q)
    lower, upper = bucket_of(exact)
    assert estimate is not None
    if math.isinf(upper):
        assert estimate == LARGEST  # beyond the largest bound: "at least a day"
    else:
        assert lower <= estimate <= upper


def spread_quantile(buckets: Buckets, q: float) -> float:
    """The q-quantile of the bucketed data spread evenly through each bucket: the smallest x whose distribution
    function reaches q, by bisection of that function."""
    lowers = dict(zip(LATENCY_BUCKETS, (0.0, *LATENCY_BUCKETS[:-1]), strict=True))
    spans = [(lowers[float(le)], float(le), n) for le, n in buckets.items()]
    total = sum(n for _, _, n in spans)

    def share_at_or_below(x: float) -> float:
        return sum(n * min(1.0, max(0.0, (x - lo) / (hi - lo))) for lo, hi, n in spans) / total

    lo, hi = 0.0, float(LARGEST)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if share_at_or_below(mid) >= q else (mid, hi)
    return hi


@pytest.mark.fuzz
@fuzz_settings(300)
@given(
    counts=st.lists(
        st.integers(min_value=0, max_value=50), min_size=len(LATENCY_BUCKETS), max_size=len(LATENCY_BUCKETS)
    ),
    q=quantiles,
)
def test_the_estimate_is_the_quantile_of_the_data_spread_evenly_through_its_buckets(
    counts: list[int], q: float
) -> None:
    buckets = {floatToGoString(b): n for b, n in zip(LATENCY_BUCKETS, counts, strict=True) if n}
    if not buckets:
        assert quantile(buckets, q) is None
        return
    assert quantile(buckets, q) == pytest.approx(spread_quantile(buckets, q), rel=1e-9, abs=1e-6)


def test_the_quantile_of_nothing_is_unknown_and_q_is_a_fraction() -> None:
    assert quantile({}, 0.99) is None
    with pytest.raises(ValueError, match="between 0 and 1"):
        quantile({"1.0": 1}, 99)


def test_a_window_hash_keeps_only_bucket_counts() -> None:
    reply = {b"0.5": b"3", b"+Inf": b"1", b"junk": b"2", b"1.0": b"-4", b"nan": b"1"}
    assert parse_hash(reply) == {"0.5": 3, "+Inf": 1}


def test_the_status_carries_count_p50_p99_and_the_buckets_a_pipeline_merges() -> None:
    router = stage_latency({})
    parser = stage_latency({"1.0": 2, "0.5": 2})
    grouper = stage_latency({"120.0": 1, "1.0": 1})
    assert router is None
    assert parser == {
        "windowSeconds": 360,
        "count": 4,
        "p50Seconds": 0.5,
        "p99Seconds": 0.99,  # rank 3.96 of 4: 0.5 + 0.5 x 1.96 / 2
        "buckets": [{"le": "0.5", "count": 2}, {"le": "1.0", "count": 2}],
    }
    # The pipeline: every final stage's buckets merged (a stage without latency adds nothing).
    statuses: list[dict[str, Any]] = [{"latency": parser}, {"latency": grouper}, {}]
    assert pipeline_latency(statuses) == {
        "windowSeconds": 360,
        "count": 6,
        "p50Seconds": 0.667,  # rank 3 of 6: the first of the three in (0.5, 1]
        "p99Seconds": 116.4,  # rank 5.94: in (60, 120], 94 % of the way
    }
    assert pipeline_latency([{}, {"queue": {}}]) is None
