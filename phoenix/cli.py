"""The `phoenix` command: worker, operator, and the queue tooling a person uses at 3 a.m."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence

import redis.asyncio as aioredis

from phoenix.operator.options import OperatorOptions
from phoenix.operator.options import add_arguments as add_operator_arguments
from phoenix.worker_runtime import dlq
from phoenix.worker_runtime.queue_stats import StageQueues, collect

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


def _stage_queues(service: str) -> StageQueues:
    return StageQueues(service, f"phoenix:{service}:input", f"{service}-group", f"phoenix:{service}:dlq")


def _client(args: argparse.Namespace) -> aioredis.Redis:
    return aioredis.Redis.from_url(args.redis_url, decode_responses=True)


async def _enqueue(args: argparse.Namespace) -> int:
    stream = args.stream or _stage_queues(args.service).input
    fields = {"record_id": args.record_id, "user_id": args.user_id}
    data = json.loads(args.data) if args.data else {}
    for item in args.field:
        key, _, value = item.partition("=")
        data[key] = value
    fields["data"] = json.dumps(data)
    async with _client(args) as client:
        entry_id = await client.xadd(stream, fields)
    print(entry_id)
    return 0


async def _dlq_list(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        entries = await client.xrange(args.dlq or _stage_queues(args.service).dlq, count=args.count)
    for entry_id, fields in entries:
        print(json.dumps({"id": entry_id, **fields}))
    return 0


async def _dlq_replay(args: argparse.Namespace) -> int:
    q = _stage_queues(args.service)
    limit = None if args.count == "all" else int(args.count)
    async with _client(args) as client:
        moved = await dlq.replay(client, args.dlq or q.dlq, args.input or q.input, limit)
    print(f"moved {moved} entries back to {args.input or q.input}")
    return 0


async def _discover_services(client: aioredis.Redis) -> list[str]:
    names = {key.split(":")[1] async for key in client.scan_iter(match="phoenix:*:input", _type="stream")}
    return sorted(names)


async def _status(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        services = args.service or await _discover_services(client)
        stages = [_stage_queues(s) for s in services]
        stats = await collect(client, stages)
    print(format_status_table(services, [s.as_status() for s in stats]))
    return 0


def format_status_table(names: Sequence[str], rows: Sequence[dict[str, object]]) -> str:
    header = ("STAGE", "LENGTH", "PENDING", "LAG", "OLDEST(s)", "DLQ", "CONSUMERS")
    lines = [header]
    for name, row in zip(names, rows, strict=True):
        cells = [row[k] for k in ("length", "pending", "lag", "oldestPendingSeconds", "dlqLength", "consumers")]
        lines.append((name, *("-" if c is None else str(c) for c in cells)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="phoenix", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", help="run one stage worker (configured by environment variables)")
    add_operator_arguments(sub.add_parser("operator", help="run the Kubernetes operator (kopf)"))

    def with_redis(sp: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sp.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
                        help="default: $REDIS_URL")
        return sp

    e = with_redis(sub.add_parser("enqueue", help="add a record to a stage's input stream"))
    target = e.add_mutually_exclusive_group(required=True)
    target.add_argument("--service", help="stage name: writes to phoenix:{service}:input")
    target.add_argument("--stream", help="explicit stream key")
    e.add_argument("--record-id", required=True)
    e.add_argument("--user-id", default="")
    e.add_argument("--data", help="JSON object")
    e.add_argument("--field", action="append", default=[], metavar="KEY=VALUE", help="add a string to data")

    d = sub.add_parser("dlq", help="inspect or replay a dead-letter stream")
    dsub = d.add_subparsers(dest="dlq_command", required=True)
    dl = with_redis(dsub.add_parser("list"))
    dl.add_argument("--service", required=True)
    dl.add_argument("--dlq", help="explicit DLQ stream (default phoenix:{service}:dlq)")
    dl.add_argument("--count", type=int, default=20)
    dr = with_redis(dsub.add_parser("replay", help="move DLQ entries back into the input, atomically"))
    dr.add_argument("--service", required=True)
    dr.add_argument("--dlq")
    dr.add_argument("--input")
    dr.add_argument("--count", default="all", help="N or all")

    st = with_redis(sub.add_parser("status", help="queue length, pending, lag, oldest pending, DLQ per stage"))
    st.add_argument("--service", action="append", help="stage name (repeatable); default: every phoenix:*:input")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "worker":
        from phoenix.worker_runtime.app import main as worker_main

        return worker_main()
    if args.command == "operator":
        from phoenix.operator.main import run as run_operator

        return run_operator(OperatorOptions.from_args(args))
    handlers = {"enqueue": _enqueue, "status": _status}
    handler = handlers.get(args.command) or {"list": _dlq_list, "replay": _dlq_replay}[args.dlq_command]
    return asyncio.run(handler(args))


if __name__ == "__main__":
    sys.exit(main())
