"""Every command's options share one set of value types (phoenix/arguments.py): a bad value is a usage error (exit 2)
naming the option and what it accepts, for `phoenix operator` as for the tools."""

from __future__ import annotations

import pytest

from phoenix.cli import main
from phoenix.operator.options import parse_options


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--refresh-interval", "0"], "--refresh-interval: not a number of seconds > 0: '0'"),
        (["--refresh-interval", "soon"], "--refresh-interval: not a number: 'soon'"),
        (["--redis-acl-grace-seconds", "-1"], "--redis-acl-grace-seconds: not a number of seconds >= 0: '-1'"),
        (["--metrics-port", "70000"], "--metrics-port: not a TCP port from 0 to 65535: '70000'"),
        (["--cluster-id=.east"], "--cluster-id: not 1 to 128 letters, digits"),
    ],
)
def test_the_operator_refuses_a_bad_value_saying_what_the_option_accepts(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_options(argv)
    assert stopped.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["dlq", "list", "--service", "s", "--count", "0"], "--count: not a whole number >= 1: '0'"),
        (["status", "--interval", "nan"], "--interval: not a finite number: 'nan'"),
        (["inspect", "r-1", "--service", "s", "--scan", "many"], "--scan: not a whole number >= 0: 'many'"),
    ],
)
def test_the_tools_refuse_a_bad_value_the_same_way(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and says in capsys.readouterr().err


def test_a_good_value_is_parsed() -> None:
    options = parse_options(["--refresh-interval", "2.5", "--metrics-port", "9090", "--cluster-id", "east-1"])
    assert (options.refresh_interval, options.metrics_port, options.cluster_id) == (2.5, 9090, "east-1")
