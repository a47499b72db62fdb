"""`phoenix status`: the queue dashboard, once, redrawn (--watch) or as JSON for scripts (--json)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from phoenix.cli.stage import add_redis_argument, client
from phoenix.console import TableDisplay, format_columns
from phoenix.keys import ALL_INPUT_STREAMS, StageKeys, stage_of_input
from phoenix.worker_runtime.queue_stats import StageQueues, collect

_COLUMNS = {
    "LENGTH": "length",
    "PENDING": "pending",
    "LAG": "lag",
    "OLDEST(s)": "oldestUnfinishedSeconds",
    "DLQ": "dlqLength",
    "CONSUMERS": "consumers",
}


def add_command(sub: argparse._SubParsersAction) -> None:
    st = add_redis_argument(sub.add_parser("status", help="length, pending, lag, oldest unfinished, DLQ per stage"))
    st.add_argument("--service", action="append", help="stage name (repeatable); default: every phoenix:*:input")
    st.add_argument("--json", action="store_true", help="one JSON array of stages (one per snapshot with --watch)")
    st.add_argument("--watch", action="store_true", help="refresh until Ctrl-C (redrawn on a terminal)")
    st.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes with --watch")
    st.set_defaults(handler=status)


def stage_queues(service: str) -> StageQueues:
    return StageQueues.of(StageKeys.for_stage(service))


async def _discover_services(redis: aioredis.Redis) -> list[str]:
    names = {stage_of_input(key) async for key in redis.scan_iter(match=ALL_INPUT_STREAMS, _type="stream")}
    return sorted(names)


async def snapshot(redis: aioredis.Redis, services: Sequence[str] | None) -> list[dict[str, object]]:
    """[{"stage": name, "length": ..., ...}] for the given stages, or every stage found."""
    names = services or await _discover_services(redis)
    stats = await collect(redis, [stage_queues(s) for s in names])
    return [{"stage": name, **st.as_status()} for name, st in zip(names, stats, strict=True)]


def format_status_table(rows: Sequence[dict[str, object]]) -> list[str]:
    lines = [("STAGE", *_COLUMNS)]
    for row in rows:
        lines.append((str(row["stage"]), *("-" if row[k] is None else str(row[k]) for k in _COLUMNS.values())))
    return format_columns(lines)


async def status(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        if not args.watch:
            rows = await snapshot(redis, args.service)
            print(json.dumps(rows) if args.json else "\n".join(format_status_table(rows)))
            return 0
        display = TableDisplay(sys.stdout, time.monotonic())
        try:
            while True:
                rows = await snapshot(redis, args.service)
                if args.json:
                    print(json.dumps(rows), flush=True)
                else:
                    # Ages move every second; a plain-lines log prints when the counts change.
                    display.show(format_status_table(rows), [_counts(row) for row in rows])
                await asyncio.sleep(args.interval)
        except (KeyboardInterrupt, asyncio.CancelledError):
            return 0


def _counts(row: dict[str, object]) -> tuple[object, ...]:
    return tuple(v for k, v in row.items() if not k.startswith("oldest"))
