"""The partitioned key layout (phoenix/keys.py): lanes, stable partitions, slots shared along a pipeline."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from phoenix import keys
from phoenix.keys import StageKeys


def test_one_partition_keeps_the_plain_tag() -> None:
    stage = StageKeys.for_stage("parser", "team")
    assert stage.lanes == (stage,)
    assert stage.lane_of("r1") is stage
    assert stage.input == "phoenix:{team}:parser:input"
    assert keys.partition_of("r1", 1) is None


def test_lanes_carry_the_partition_in_the_tag_and_stage_keys_stay_whole() -> None:
    stage = StageKeys.for_stage("parser", "team", partitions=4)
    lanes = stage.lanes
    assert [lane.input for lane in lanes] == [f"phoenix:{{team~{p}}}:parser:input" for p in range(4)]
    lane = lanes[2]
    per_lane = [lane.input, lane.dlq, lane.retry, lane.record("r"), lane.backpressure, lane.owner, lane.outbox]
    assert {key_slot(k.encode()) for k in per_lane} == {key_slot(b"{team~2}")}
    # The stage as a whole: one audit stream, one layout, whatever lane asks.
    assert lane.audit == stage.audit == "phoenix:{team}:parser:audit"
    assert lane.layout == stage.layout == "phoenix:{team}:parser:layout"
    assert keys.stage_of_input(lane.input) == ("team", "parser")


def test_a_record_keeps_its_partition_through_a_pipeline() -> None:
    router = StageKeys.for_stage("router", "team", partitions=8)
    for record_id in ("a", "doc-17", "ü-9", "x" * 200):
        lane = router.lane_of(record_id)
        nxt = keys.forward_stream("parser", "team", record_id, 8)
        assert key_slot(nxt.encode()) == key_slot(lane.input.encode()), record_id
        assert lane.partition == keys.partition_of(record_id, 8)
    # Stable across processes and releases: CRC-32, not Python's salted hash().
    assert keys.partition_of("doc-17", 8) == 0 and keys.partition_of("doc-1", 8) == 1


def test_partitions_spread_records() -> None:
    counts = [0] * 8
    for i in range(8000):
        counts[keys.partition_of(f"record-{i}", 8) or 0] += 1
    assert min(counts) > 800, counts


def test_partitioned_stage_cannot_name_its_streams() -> None:
    with pytest.raises(ValueError, match="derives its input"):
        StageKeys.for_stage("parser", "team", input="jobs", partitions=2)
    with pytest.raises(ValueError, match="at least 1"):
        StageKeys.for_stage("parser", "team", partitions=0)


def test_status_pattern_tells_namespaces_apart() -> None:
    pattern = keys.input_streams_pattern("team")
    assert pattern == "phoenix:{team[}~]*:input"


@pytest.mark.parametrize("target", ["results", "{team}:results", "a{b}c", "{a{b}c", "a{b", "é{ü}"])
def test_a_relay_marker_is_in_its_targets_slot_and_names_its_outbox_entry(target: str) -> None:
    lane = StageKeys.for_stage("parser", "team", partitions=4).lanes[2]
    marker = lane.relay_marker(target, "1700000000000-3")
    assert key_slot(marker.encode()) == key_slot(target.encode())
    assert marker.endswith(":_relayed:team/parser/2:1700000000000-3")
    whole = StageKeys.for_stage("parser", "team")
    assert whole.relay_marker(target, "1-0").endswith(":_relayed:team/parser:1-0")


@pytest.mark.parametrize("target", ["a}b", "{}", "{}x", "x{}{y}"])
def test_a_target_hashed_whole_with_a_closing_brace_has_no_marker_in_its_slot(target: str) -> None:
    """No tag, or an empty one (`{}`), and a `}`: the marker's tag would end there. The relay refuses such a
    target (tests/test_worker_partitions.py)."""
    marker = StageKeys.for_stage("parser", "team").relay_marker(target, "1-0")
    assert key_slot(marker.encode()) != key_slot(target.encode())
