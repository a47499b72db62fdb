"""`phoenix status`: the queue dashboard, once, redrawn (--watch) or as JSON for scripts (--json)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from phoenix.arguments import seconds
from phoenix.cli.stage import add_redis_argument, client
from phoenix.console import TableDisplay, format_columns
from phoenix.keys import DEFAULT_NAMESPACE, StageKeys, input_streams_pattern, stage_of_input
from phoenix.tools.queue_stats import collect_lanes, summed
from phoenix.worker_runtime.ownership import laid_out

_COLUMNS = {
    "LENGTH": "length",
    "PENDING": "pending",
    "LAG": "lag",
    "OLDEST(s)": "oldestUnfinishedSeconds",
    "DLQ": "dlqLength",
    "CONSUMERS": "consumers",
}


def add_command(sub: argparse._SubParsersAction) -> None:
    st = sub.add_parser("status", help="length, pending, lag, oldest unfinished, DLQ per stage")
    add_redis_argument(st, every_namespace=True)
    st.add_argument(
        "--service",
        action="append",
        help="stage name (repeatable), of --namespace, else of default; default: every stage found",
    )
    st.add_argument("--partitions", action="store_true", help="a row per partition of each partitioned stage")
    st.add_argument("--json", action="store_true", help="one JSON array of stages (one per snapshot with --watch)")
    st.add_argument("--watch", action="store_true", help="refresh until Ctrl-C (redrawn on a terminal)")
    st.add_argument("--interval", type=seconds, default=2.0, help="seconds between refreshes with --watch")
    st.set_defaults(handler=status)


async def _discover(redis: aioredis.Redis, namespace: str | None) -> list[StageKeys]:
    """Every stage with a default input stream (of any partition), in `namespace` (None: in every namespace)."""
    pattern = input_streams_pattern(namespace)
    found = {stage_of_input(key) async for key in redis.scan_iter(match=pattern, _type="stream")}
    return [StageKeys.for_stage(name, ns) for ns, name in sorted(f for f in found if f is not None)]


async def snapshot(
    redis: aioredis.Redis, services: Sequence[str] | None, namespace: str | None = None, partitions: bool = False
) -> list[dict[str, object]]:
    """[{"namespace": ns, "stage": name, "partitions": K, "length": ..., ...}] for the given stages (of
    `namespace`, default `default`), or every stage found (in `namespace`, or in every namespace when None),
    summed over their partitions; with `partitions`, a stage of several partitions also has a row per partition
    (`partition`: p) after its own."""
    if services:
        stages = [StageKeys.for_stage(s, namespace or DEFAULT_NAMESPACE) for s in services]
    else:
        stages = await _discover(redis, namespace)
    stages = await laid_out(redis, stages)
    rows: list[dict[str, object]] = []
    for keys, lanes in zip(stages, await collect_lanes(redis, stages), strict=True):
        stage = {"namespace": keys.namespace, "stage": keys.name, "partitions": keys.partitions}
        rows.append({**stage, **summed(lanes).as_status()})
        if partitions and keys.partitions > 1:
            rows += [{**stage, "partition": p, **lane.as_status()} for p, lane in enumerate(lanes)]
    return rows


def format_status_table(rows: Sequence[dict[str, object]]) -> list[str]:
    lanes = any("partition" in row for row in rows)
    lines = [("NAMESPACE", "STAGE", *(["PARTITION"] if lanes else []), *_COLUMNS)]
    for row in rows:
        cells = ("-" if row[k] is None else str(row[k]) for k in _COLUMNS.values())
        # The stage's own row, summed, shows its partition count; a partition's row its number.
        lane = [f"#{row['partition']}" if "partition" in row else f"({row['partitions']})"] if lanes else []
        lines.append((str(row["namespace"]), str(row["stage"]), *lane, *cells))
    return format_columns(lines)


async def status(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        if not args.watch:
            rows = await snapshot(redis, args.service, args.namespace, args.partitions)
            print(json.dumps(rows) if args.json else "\n".join(format_status_table(rows)))
            return 0
        display = TableDisplay(sys.stdout, time.monotonic())
        try:
            while True:
                rows = await snapshot(redis, args.service, args.namespace, args.partitions)
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
