"""One record at a time: `phoenix inspect`, and the runbook's fixes `unlock`, `reclaim` and `reprocess`."""

from __future__ import annotations

import argparse
import json

from phoenix.cli.stage import add_stage_arguments, client, confirm, fail, stage_settings
from phoenix.worker_runtime import repair
from phoenix.worker_runtime.inspection import DEFAULT_SCAN_LIMIT, RecordReport, duration, inspect_record
from phoenix.worker_runtime.repair import ReprocessError, UnlockStatus


def add_commands(sub: argparse._SubParsersAction) -> None:
    i = add_stage_arguments(
        sub.add_parser("inspect", help="everything known about one record, and a diagnosis"), timings=True
    )
    i.add_argument("record_id")
    i.add_argument("--json", action="store_true", help="the report as one JSON object")
    i.add_argument("--scan", type=int, default=DEFAULT_SCAN_LIMIT, help="newest entries of each stream to search")
    i.set_defaults(handler=inspect)

    u = add_stage_arguments(
        sub.add_parser("unlock", help="release a record's stale lock (refused while its holder is alive)"), timings=True
    )
    u.add_argument("record_id")
    u.add_argument("--force", action="store_true", help="release even though the holder looks alive")
    u.set_defaults(handler=unlock)

    r = add_stage_arguments(
        sub.add_parser("reclaim", help="re-enqueue entries idle on dead consumers now"), timings=True
    )
    r.add_argument("--idle-ms", type=int, help="minimum idle time of an entry (default: CLAIM_IDLE_MS)")
    r.set_defaults(handler=reclaim)

    p = add_stage_arguments(sub.add_parser("reprocess", help="clear a record's marker and enqueue it again"))
    p.add_argument("record_id")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.add_argument("--scan", type=int, default=DEFAULT_SCAN_LIMIT, help="newest entries of each stream to search")
    p.set_defaults(handler=reprocess)


def format_report(r: RecordReport) -> list[str]:
    lines = [f"record {r.record_id} of stage {r.service} ({r.input_stream}, group {r.group})"]
    if not r.group_exists:
        lines.append("  group: does not exist (no worker has started on this input yet)")
    else:
        alive = sorted(c.name for c in r.consumers.values() if c.alive)
        lines.append(
            f"  group: lag {r.lag if r.lag is not None else '-'}, consumers alive: {', '.join(alive) or 'none'}"
        )
    lines.append("  input entries:" + ("" if r.entries else " none"))
    for e in r.entries:
        detail = ""
        if e.state == "pending":
            owner = r.consumers.get(e.consumer or "")
            life = "alive" if owner and owner.alive else "dead"
            detail = f" by {e.consumer} ({life}), {e.deliveries} deliveries, idle {duration(e.idle_seconds or 0)}"
        retry = f", retry {e.retry_count}" if e.retry_count else ""
        lines.append(f"    {e.entry_id}  age {duration(e.age_seconds)}  {e.state}{detail}{retry}")
    if r.lock:
        lines.append(f"  lock:   {r.lock.key} held by {r.lock.holder}, expires in {duration(r.lock.ttl_seconds)}")
    else:
        lines.append("  lock:   none")
    if r.marker:
        lines.append(
            f"  marker: {r.marker.key} committed by entry {r.marker.committed_by}, expires in "
            f"{duration(r.marker.ttl_seconds)}"
        )
    else:
        lines.append("  marker: none")
    lines.append("  retry:  " + ("none" if not r.retries else ""))
    for w in r.retries:
        lines.append(
            f"    attempt {w.attempt} due {w.due_at} (in {duration(w.due_in_seconds)}); last error: "
            f"{w.last_error or '-'}"
        )
    lines.append("  DLQ:    " + ("none" if not r.dead_letters else ""))
    for d in r.dead_letters:
        lines.append(f"    {d.entry_id}  {d.failed_at}  {d.error_type}: {d.error} (attempts {d.attempts})")
    if r.forwarded:
        lines.append("  forwarded to the next stage:")
        lines += [f"    {f.stream} {f.entry_id}  age {duration(f.age_seconds)}" for f in r.forwarded]
    lines.append(f"diagnosis: {r.diagnosis}")
    return lines


async def inspect(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        report = await inspect_record(redis, stage_settings(args), args.record_id, args.scan)
    print(json.dumps(report.as_dict()) if args.json else "\n".join(format_report(report)))
    return 0


async def unlock(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        result = await repair.unlock(redis, stage_settings(args), args.record_id, force=args.force)
    idle = (
        "is not in the consumer group"
        if result.holder_idle_seconds is None
        else (f"idle {duration(result.holder_idle_seconds)}")
    )
    if result.status is UnlockStatus.NOT_LOCKED:
        print(f"{result.key} is not locked: nothing to release")
        return 0
    if result.status is UnlockStatus.CHANGED:
        return fail(f"{result.key} changed while checking (released or taken again): nothing released; look again")
    if result.status is UnlockStatus.HOLDER_ALIVE:
        return fail(
            f"refused: {result.key} is held by {result.holder}, which is alive ({idle}); "
            "pass --force to release it anyway"
        )
    print(f"released {result.key} held by {result.holder} ({idle})")
    return 0


async def reclaim(args: argparse.Namespace) -> int:
    settings = stage_settings(args)
    async with client(args) as redis:
        done = await repair.reclaim(redis, settings, args.idle_ms)
    for r in done:
        where = (
            f"{r.entry_id} (record {r.record_id or '?'}, {r.consumer}, idle {duration(r.idle_seconds)}, "
            f"{r.deliveries} deliveries)"
        )
        if r.status == "moved":
            lock = "; released its lock" if r.lock_released else ""
            print(f"re-enqueued {where} as {r.new_entry_id}{lock}")
        elif r.status == "poison":
            print(f"left {where}: the next worker reclaim dead-letters it (MAX_DELIVERIES={settings.max_deliveries})")
        elif r.status == "wide":
            print(f"left {where}: too wide to copy; the next worker reclaim dead-letters it (MAX_ENTRY_FIELDS)")
        elif r.status == "trimmed":
            print(f"acknowledged {where}: it was trimmed from the stream, nothing left to process")
        else:
            print(f"left {where}: a worker touched it meanwhile")
    moved = sum(r.status == "moved" for r in done)
    idle_ms = settings.claim_idle_ms if args.idle_ms is None else args.idle_ms
    print(f"reclaimed {moved} of {len(done)} entries idle over {idle_ms} ms in {settings.input_queue}")
    return 0


async def reprocess(args: argparse.Namespace) -> int:
    settings = stage_settings(args)
    async with client(args) as redis:
        try:
            plan = await repair.plan_reprocess(redis, settings, args.record_id, args.scan)
            marker = f"delete {plan.record_key} (committed by {plan.committed_by}) and " if plan.committed_by else ""
            take = " and remove it from the DLQ" if plan.source == "dlq" else ""
            question = (
                f"Reprocess {args.record_id}: {marker}add a copy of {plan.source} entry "
                f"{plan.source_entry_id} to {settings.input_queue}{take}?"
            )
            if not confirm(question, args.yes):
                return fail("nothing changed")
            new_id, marker_deleted = await repair.reprocess(redis, settings, plan)
        except ReprocessError as exc:
            return fail(str(exc))
    cleared = f"deleted {plan.record_key}; " if marker_deleted else ""
    print(
        f"{cleared}enqueued {args.record_id} as {new_id} in {settings.input_queue} (from {plan.source} entry "
        f"{plan.source_entry_id})"
    )
    return 0
