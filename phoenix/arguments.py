"""The value types of every command-line option, for `phoenix`'s commands and `phoenix operator` alike: a bad value
is a usage error that says what the option accepts (argparse applies them to an environment default too)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable


def whole(text: str) -> int:
    """A whole number >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number >= 0: {text!r}")
    return int(text)


def positive_whole(text: str) -> int:
    """A whole number >= 1."""
    if (value := whole(text)) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {text!r}")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def seconds(text: str) -> float:
    """A duration in seconds, > 0."""
    if (value := _number(text)) <= 0:
        raise argparse.ArgumentTypeError(f"not a number of seconds > 0: {text!r}")
    return value


def seconds_or_zero(text: str) -> float:
    """A duration in seconds, >= 0 (0 usually turning the thing off)."""
    if (value := _number(text)) < 0:
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 to 65535 (0: off, for a server port)."""
    if (value := whole(text)) > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port from 0 to 65535: {text!r}")
    return value


def matching(pattern: str, accepts: str) -> Callable[[str], str]:
    """Text matching `pattern` whole; `accepts` says what that is, in the error."""

    def check(text: str) -> str:
        if not re.fullmatch(pattern, text):
            raise argparse.ArgumentTypeError(f"{accepts}: {text!r}")
        return text

    return check
