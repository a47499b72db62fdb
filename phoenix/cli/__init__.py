"""The `phoenix` command: worker, operator, and the queue tooling a person uses at 3 a.m."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any, Literal, TextIO

from redis.asyncio import Redis
from redis.exceptions import RedisError

from phoenix.arguments import positive_whole, whole
from phoenix.cli import migrate, records, status
from phoenix.cli.ingest import command as ingest
from phoenix.cli.stage import StageUsageError, add_redis_argument, confirm, fail, redis_spec, stage_keys
from phoenix.cli.stage import client as _client
from phoenix.cli.ui import command as ui
from phoenix.errors import ConfigError
from phoenix.keys import DEFAULT_NAMESPACE, StageKeys
from phoenix.operator.options import OperatorOptions
from phoenix.operator.options import add_arguments as add_operator_arguments
from phoenix.producer import BATCH as PRODUCER_BATCH
from phoenix.producer import NotReplicated, Producer, Record
from phoenix.redis_replies import text_range
from phoenix.redis_spec import RedisSpecError
from phoenix.retention import DURATION_PATTERN, duration_ms
from phoenix.stages.data_keys import held_pages
from phoenix.tools import audit, dlq
from phoenix.worker_runtime.ownership import laid_out

# What a dry run lists of the entries it would move, at most.
DRY_RUN_SHOWN = 20
_DELETE_BATCH = 1000  # pages keys deleted by one DEL of a purge


def deadline_of(text: str) -> datetime:
    """`--deadline`: a duration from now (`30m`, `48h`) or an ISO 8601 time with its zone; ValueError otherwise."""
    if re.match(DURATION_PATTERN, text):
        return datetime.now(UTC) + timedelta(milliseconds=duration_ms(text))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"deadline {text[:40]!r} is neither a duration <n><s|m|h|d> (e.g. 30m) nor an ISO 8601 time"
        ) from None
    if when.tzinfo is None:
        raise ValueError(f"deadline {text[:40]!r} needs a time zone (e.g. 2026-12-24T18:00:00Z)")
    return when


def _records_from(lines: Iterable[str]) -> Iterator[Record]:
    """The records of JSON lines (record_id, user_id, data); a bad line raises ValueError naming it."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            if not isinstance(item, dict):
                raise ValueError("not a JSON object")
            unknown = set(item) - {"record_id", "user_id", "data", "traceparent", "deadline"}
            if unknown:
                raise ValueError(f"unknown field(s) {', '.join(sorted(unknown))}")
            if not isinstance(item.get("record_id"), str) or not item["record_id"]:
                raise ValueError("no record_id (a non-empty string)")
            data = item.get("data", {})
            if not isinstance(data, dict):
                raise ValueError("data is not a JSON object")
            deadline = item.get("deadline")
            if deadline is not None and not isinstance(deadline, int | float):
                deadline = deadline_of(str(deadline))
            yield Record(item["record_id"], data, str(item.get("user_id", "")), item.get("traceparent"), deadline)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None


async def _enqueue(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        producer = Producer(
            client,
            None if args.stream else args.service,
            args.namespace,
            stream=args.stream,
            min_replicas_ack=args.min_replicas_ack,
            min_replicas_timeout_ms=args.min_replicas_timeout_ms,
        )
        if args.source is None:
            data = json.loads(args.data) if args.data else {}
            for item in args.field:
                key, _, value = item.partition("=")
                data[key] = value
            record = Record(args.record_id, data, args.user_id, deadline=args.deadline)
            return await _send(producer, [record], print_ids=True)
        return await _enqueue_lines(producer, args.source)


async def _enqueue_lines(producer: Producer, lines: TextIO) -> int:
    """JSON lines in batches: each batch checked whole before it is sent, so a bad line stops the run at a batch
    boundary and says how many went before (sending them again is safe: their record ids make duplicates)."""
    sent = 0
    with lines:
        records = _records_from(lines)
        while True:
            try:
                batch = list(islice(records, PRODUCER_BATCH))
            except ValueError as exc:
                return fail(f"{exc}; {sent} records enqueued before it, nothing after")
            if not batch:
                break
            if (code := await _send(producer, batch, print_ids=False)) != 0:
                return code
            sent += len(batch)
    print(f"{sent} records enqueued")
    return 0


async def _send(producer: Producer, batch: list[Record], *, print_ids: bool) -> int:
    try:
        ids = await producer.send_many(batch)
    except NotReplicated as exc:
        # The entries stay on the primary (Redis cannot take them back); only a failover before they replicate
        # loses them.
        if print_ids:
            print(*exc.entry_ids, sep="\n")
        return fail(str(exc))
    if print_ids:
        print(*ids, sep="\n")
    return 0


async def _dlq_lanes(client: Redis, args: argparse.Namespace) -> list[StageKeys]:
    """The keys of each lane of the stage, as its layout in Redis has it: a dead letter goes back to the input of
    its own lane (the record's partition). One lane, with --dlq/--input applied, for a stage of one partition."""
    (keys,) = await laid_out(client, [stage_keys(args)])
    if keys.partitions == 1:
        return [replace(keys, dlq=args.dlq or keys.dlq, input=getattr(args, "input", None) or keys.input)]
    if args.dlq or getattr(args, "input", None):
        raise StageUsageError(
            f"stage {keys.namespace}/{keys.name} has {keys.partitions} partitions, each with its own DLQ and input: "
            "leave out --dlq and --input"
        )
    return list(keys.lanes)


async def _dlq_list(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        for entry_id, fields in await dlq.oldest(client, await _dlq_lanes(client, args), args.count):
            print(json.dumps({"id": entry_id, **fields}))
    return 0


async def _audit(client: Redis, args: argparse.Namespace, action: str, count: int, detail: str) -> None:
    stream = stage_keys(args).audit
    await audit.record(client, stream, audit.Repair(audit.person(), action, count, detail))


def _streams(lanes: list[StageKeys], which: Literal["dlq", "input"]) -> str:
    """The DLQ or input stream, or how many partitions' when there are several."""
    plural = {"dlq": "DLQs", "input": "inputs"}[which]
    return getattr(lanes[0], which) if len(lanes) == 1 else f"the {plural} of its {len(lanes)} partitions"


async def _dlq_replay(args: argparse.Namespace) -> int:
    limit = None if args.count == "all" else int(args.count)
    async with _client(args) as client:
        lanes = await _dlq_lanes(client, args)
        dlq_streams, input_streams = _streams(lanes, "dlq"), _streams(lanes, "input")
        lengths = [await client.xlen(lane.dlq) for lane in lanes]
        length = sum(lengths)
        wanted = length if limit is None else min(limit, length)
        what = f"{wanted} of the {length} entries of {dlq_streams} (oldest first) back to {input_streams}"
        if args.dry_run:
            shown = 0
            for lane in lanes:
                for entry_id, fields in await text_range(client, lane.dlq, count=min(wanted, DRY_RUN_SHOWN) - shown):
                    record, error = fields.get("record_id", "?"), fields.get("error_type", "?")
                    print(f"would move {entry_id} (record {record}, {error})")
                    shown += 1
                if shown >= min(wanted, DRY_RUN_SHOWN):
                    break
            if wanted > DRY_RUN_SHOWN:
                print(f"... and {wanted - DRY_RUN_SHOWN} more")
            print(f"would move {what}; nothing changed")
            return 0
        if not wanted:
            print(f"nothing to replay: {dlq_streams} {'is' if len(lanes) == 1 else 'are'} empty")
            return 0
        if not confirm(f"Move {what}?", args.yes):
            return 1
        moved = 0
        for lane in lanes:  # each lane's dead letters back to its own input
            if limit is not None and moved >= limit:
                break
            moved += await dlq.replay(client, lane.dlq, lane.input, None if limit is None else limit - moved)
        await _audit(
            client, args, "dlq-replay", moved, f"moved {moved} entries of {dlq_streams} back to {input_streams}"
        )
    print(f"moved {moved} entries back to {input_streams}")
    return 0


async def _dlq_export(args: argparse.Namespace) -> int:
    count, last = 0, None
    async with _client(args) as client:
        lanes = await _dlq_lanes(client, args)
        for p, lane in enumerate(lanes):
            async for entry_id, fields in dlq.entries(client, lane.dlq):
                print(json.dumps({"id": entry_id, **fields, **dlq.lane_fields(lanes, p)}))
                count += 1
                if last is None or dlq.entry_time(entry_id) > dlq.entry_time(last):
                    last = entry_id
    # On stderr, so stdout stays pure JSON lines when redirected to a file.
    print(
        f"exported {count} entries of {_streams(lanes, 'dlq')}"
        + (
            f" through {last}; delete exactly these with: phoenix dlq purge --service {args.service}"
            f"{f' --namespace {args.namespace}' if args.namespace != DEFAULT_NAMESPACE else ''}"
            f"{f' --dlq {args.dlq}' if args.dlq else ''} --through {last}"
            if last
            else ""
        ),
        file=sys.stderr,
    )
    return 0


async def _dlq_purge(args: argparse.Namespace) -> int:
    async with _client(args) as client:
        lanes = await _dlq_lanes(client, args)
        streams = _streams(lanes, "dlq")
        what = f"entries of {streams} up to {args.through}" if args.through else f"every entry of {streams}"
        if not confirm(f"Delete {what}?", args.yes):
            return 1
        deleted = released = 0
        for lane in lanes:
            # The pages the purged records held for the parser go with them (data_keys.held_pages); without
            # --through, what is purged is what was read here: an entry dead-lettered meanwhile stays, pages too.
            held, last = {}, args.through
            async for entry_id, fields in dlq.entries(client, lane.dlq, last=args.through or "+"):
                if key := held_pages(lane.namespace, fields):
                    held[key] = fields.get("record_id", "")
                last = entry_id
            if last is None:
                continue
            # An entry id is its time: through it in every lane is what an export up to it printed.
            deleted += await dlq.purge_through(client, lane.dlq, last)
            released += await _release_pages(client, lane, held)
        pages = f", and the pages of {released} records they held" if released else ""
        await _audit(client, args, "dlq-purge", deleted, f"deleted {what}: {deleted} entries{pages}")
    print(f"deleted {deleted} entries from {streams}{pages}")
    return 0


async def _release_pages(client: Redis, lane: StageKeys, held: dict[str, str]) -> int:
    """Delete the pages keys of `held` (key -> record id) but those of a record the lane has still to parse."""
    waiting = await dlq.waiting_records(client, lane, set(held.values()))
    keys = [key for key, record_id in held.items() if record_id not in waiting]
    return sum([await client.delete(*keys[at : at + _DELETE_BATCH]) for at in range(0, len(keys), _DELETE_BATCH)])


def _deadline(value: str) -> datetime:
    try:
        return deadline_of(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="phoenix", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("worker", help="run one stage worker (configured by environment variables)")
    add_operator_arguments(sub.add_parser("operator", help="run the Kubernetes operator (kopf)"))

    with_redis = add_redis_argument

    e = with_redis(sub.add_parser("enqueue", help="add a record to a stage's input stream"))
    target = e.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--service", help="stage name: writes where its workers read (its input, or its record's partition's)"
    )
    target.add_argument("--stream", help="explicit stream key")
    source = e.add_mutually_exclusive_group(required=True)
    source.add_argument("--record-id", help="one record, its data from --data and --field")
    source.add_argument(
        "--from",
        dest="source",
        type=argparse.FileType("r"),
        metavar="FILE",
        help="JSON lines, one record each: record_id, user_id, data (a JSON object); - for stdin; sent pipelined",
    )
    e.add_argument("--user-id", default="")
    e.add_argument("--data", help="JSON object")
    e.add_argument("--field", action="append", default=[], metavar="KEY=VALUE", help="add a string to data")
    e.add_argument(
        "--deadline",
        type=_deadline,
        metavar="WHEN",
        help="past this the record goes to the DLQ as Expired, unprocessed: a duration from now (30m, 48h) or an "
        "ISO 8601 time with its zone; a line of --from may carry its own",
    )
    e.add_argument(
        "--min-replicas-ack",
        type=whole,
        default=os.environ.get("MIN_REPLICAS_ACK", "0"),
        metavar="N",
        help="wait until N replicas have the entry (WAIT), exit 1 if fewer had it in time (default: $MIN_REPLICAS_ACK)",
    )
    e.add_argument(
        "--min-replicas-timeout-ms",
        type=whole,
        default=os.environ.get("MIN_REPLICAS_TIMEOUT_MS", "1000"),
        metavar="MS",
        help="longest such wait (default: $MIN_REPLICAS_TIMEOUT_MS or 1000)",
    )
    e.set_defaults(handler=_enqueue)

    d = sub.add_parser("dlq", help="list, replay, export or purge a dead-letter stream")
    dsub = d.add_subparsers(dest="dlq_command", required=True)
    dl = with_redis(dsub.add_parser("list"))
    dl.add_argument("--service", required=True)
    dl.add_argument("--dlq", help="explicit DLQ stream (default phoenix:{namespace}:service:dlq)")
    dl.add_argument("--count", type=positive_whole, default=20)
    dl.set_defaults(handler=_dlq_list)
    dr = with_redis(dsub.add_parser("replay", help="move DLQ entries back into the input, atomically (asks first)"))
    dr.add_argument("--service", required=True)
    dr.add_argument("--dlq")
    dr.add_argument("--input")
    dr.add_argument("--count", default="all", help="N or all")
    records.add_safety_arguments(dr)
    dr.set_defaults(handler=_dlq_replay)
    de = with_redis(dsub.add_parser("export", help="every DLQ entry as JSON lines, oldest first"))
    de.add_argument("--service", required=True)
    de.add_argument("--dlq")
    de.set_defaults(handler=_dlq_export)
    dp = with_redis(dsub.add_parser("purge", help="delete DLQ entries (export them first)"))
    dp.add_argument("--service", required=True)
    dp.add_argument("--dlq")
    which = dp.add_mutually_exclusive_group(required=True)
    which.add_argument("--through", metavar="ENTRY_ID", help="up to this entry id, as printed by export")
    which.add_argument("--all", action="store_true", help="every entry, including ones nobody has exported")
    dp.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    dp.set_defaults(handler=_dlq_purge)

    # Listed for --help; main() hands `phoenix report ...` to the kubectl plugin whole, options first included.
    sub.add_parser("report", help="one tar.gz for support: the same command and options as `kubectl phoenix report`")

    status.add_command(sub)
    records.add_commands(sub)
    migrate.add_command(sub)
    ui.add_command(sub)
    ingest.add_command(sub)
    return p


async def _run(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().set_exception_handler(_quiet_reset_writes)
    code: int = await args.handler(args)
    return code


def _quiet_reset_writes(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # A server that resets the connection (a TLS server refusing a client without a certificate) fails asyncio's
    # pending write too, a future nobody awaits: its traceback at exit would follow the one line that already
    # told the error the read got.
    if isinstance(context.get("exception"), ConnectionError) and "never retrieved" in context.get("message", ""):
        return
    loop.default_exception_handler(context)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        from phoenix.cli.kubectl import main as plugin_main

        return plugin_main(argv)
    args = _parser().parse_args(argv)
    if args.command == "worker":
        from phoenix.worker_runtime.app import main as worker_main

        return worker_main()
    if args.command == "operator":
        from phoenix.operator.main import run as run_operator

        return run_operator(OperatorOptions.from_args(args))
    try:
        if hasattr(args, "redis_url"):
            redis_spec(args)  # checked before anything runs: a bad option is one line and exit 2
        return asyncio.run(_run(args))
    except RedisSpecError as exc:
        print(f"phoenix {args.command}: invalid Redis configuration: {exc}", file=sys.stderr)
        return 2
    except StageUsageError as exc:
        return fail(f"phoenix {args.command}: {exc}")
    except ConfigError as exc:  # phoenix ui's and ingest's options
        print(f"phoenix {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except RedisError as exc:
        # redis-py names host and port, never the password.
        return fail(f"phoenix {args.command}: Redis error: {redis_spec(args).explain(exc)}")


if __name__ == "__main__":
    sys.exit(main())
