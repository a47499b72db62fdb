"""JSON of records and log lines: orjson where it agrees with the json module, json where it would not."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import structlog

from phoenix.worker_runtime import jsoncodec
from phoenix.worker_runtime import log as log_module


def test_compact_output_and_the_documented_native_types() -> None:
    moment = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    assert jsoncodec.dumps({"a": 1, "at": moment, "tags": {"x"}}, str) == (
        '{"a":1,"at":"2026-12-01T09:30:00+00:00","tags":"{\'x\'}"}'
    )
    assert jsoncodec.dumps({"nan": math.nan}, str) == '{"nan":null}'


@pytest.mark.parametrize(
    "value",
    [{"id": 123456789012345678901234567890}, {"f": 0.1234567890123456789012}, {1: "non-str key"}],
)
def test_what_orjson_would_change_is_written_and_read_by_json(value: dict) -> None:
    text = jsoncodec.dumps(value, str)
    assert text == json.dumps(value, separators=(",", ":"))
    assert jsoncodec.loads(text.encode()) == json.loads(text)


def test_integers_past_64_bits_keep_every_digit() -> None:
    assert jsoncodec.loads(b'{"id": 123456789012345678901234567890}') == {"id": 123456789012345678901234567890}
    # 19 digits already leave orjson's 64-bit range when negative; found after other text and numbers.
    text = b'{"note": "12 pages, 2026", "n": -9999999999999999999}'
    assert jsoncodec.loads(text) == {"note": "12 pages, 2026", "n": -9999999999999999999}


def test_input_only_json_reads_is_read_and_bad_input_names_the_json_error() -> None:
    assert math.isnan(jsoncodec.loads(b'{"x": NaN}')["x"])
    with pytest.raises(json.JSONDecodeError, match="Expecting property name enclosed in double quotes"):
        jsoncodec.loads(b"{bad")


@pytest.fixture
def json_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(log_module, "_json_output", None)  # restored after the test, as structlog is
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def test_batched_info_lines_are_the_lines_structlog_writes(json_logging: None, capsys: pytest.CaptureFixture) -> None:
    log_module.configure_logging("s", "info", "json")
    structlog.contextvars.bind_contextvars(user_id="from-context")  # a line's own field wins, in both paths
    fields = {"record_id": "r1", "message_id": "1-0", "user_id": "u", "duration_seconds": 0.25}
    structlog.get_logger("phoenix.worker").info("processing_complete", **fields)
    log_module.log_info_lines([{"event": "processing_complete", **fields}, {"event": "duplicate_discarded", **fields}])
    single, *batched = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert [line["event"] for line in batched] == ["processing_complete", "duplicate_discarded"]
    for line in batched:
        assert line.keys() == single.keys()
        assert {k: v for k, v in line.items() if k not in ("event", "timestamp")} == {
            k: v for k, v in single.items() if k not in ("event", "timestamp")
        }
        assert line["timestamp"].endswith("Z") and line["timestamp"] >= single["timestamp"]
    assert single["user_id"] == "u"
