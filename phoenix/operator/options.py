"""Command-line options of `phoenix operator` (kept free of kopf imports so `phoenix --help` stays fast)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

DEFAULT_REFRESH_SECONDS = 10.0


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: tuple[str, ...]  # empty: every namespace
    liveness: str | None
    refresh_interval: float
    verbose: bool
    log_format: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OperatorOptions:
        return cls(
            namespaces=tuple(args.namespace or ()),
            liveness=args.liveness,
            refresh_interval=args.refresh_interval,
            verbose=args.verbose,
            log_format=args.log_format,
        )


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _default_log_format() -> str:
    return "json" if os.environ.get("LOG_FORMAT", "").lower() == "json" else "full"


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", metavar="NS", help="serve this namespace (repeatable; kopf globs "
        "like `team-*` work); default: all namespaces",
    )  # fmt: skip
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="serve every namespace (the default)")
    parser.add_argument("--liveness", metavar="URL", help="serve kopf's health endpoint, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument(
        "--refresh-interval", type=_positive, metavar="SECONDS",
        default=float(os.environ.get("PHOENIX_REFRESH_INTERVAL", DEFAULT_REFRESH_SECONDS)),
        help=f"seconds between status refreshes of all stages (default ${{PHOENIX_REFRESH_INTERVAL}} or "
        f"{DEFAULT_REFRESH_SECONDS:g})",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format", choices=("json", "full", "plain"), default=_default_log_format(),
        help="default: json when $LOG_FORMAT is json (as for workers), else full",
    )  # fmt: skip
    return parser


def parse_options(argv: list[str] | None = None) -> OperatorOptions:
    parser = add_arguments(argparse.ArgumentParser(prog="phoenix operator", description="The Phoenix operator."))
    return OperatorOptions.from_args(parser.parse_args(argv))
