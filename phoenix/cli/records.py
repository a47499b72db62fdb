"""One record at a time: `phoenix inspect`, `phoenix trace` (the record in each stage of a pipeline), the
runbook's fixes `unlock`, `reclaim` and `reprocess` (each with `--dry-run`, and a question unless `--yes` where it
acts on what may still be alive), and `phoenix audit`, the stage's record of every such repair."""

from __future__ import annotations

import argparse
import json
import sys

import redis.asyncio as aioredis

from phoenix.arguments import positive_whole
from phoenix.cli.stage import (
    StageSettings,
    add_redis_argument,
    add_stage_arguments,
    client,
    confirm,
    fail,
    laid_out_settings,
    stage_settings,
)
from phoenix.keys import StageKeys
from phoenix.tools import audit, repair
from phoenix.tools.inspection import DEFAULT_SCAN_LIMIT, RecordReport, duration, inspect_record
from phoenix.tools.repair import Reclaimed, ReclaimTooEager, ReprocessError, UnlockResult, UnlockStatus
from phoenix.tools.trace import Trace, trace_record
from phoenix.worker_runtime.ownership import laid_out


def add_commands(sub: argparse._SubParsersAction) -> None:
    i = add_stage_arguments(
        sub.add_parser("inspect", help="everything known about one record, and a diagnosis"), timings=True
    )
    i.add_argument("record_id")
    i.add_argument("--json", action="store_true", help="the report as one JSON object")
    i.add_argument(
        "--scan", type=positive_whole, default=DEFAULT_SCAN_LIMIT, help="newest entries of each stream to search"
    )
    i.set_defaults(handler=inspect)

    t = add_redis_argument(sub.add_parser("trace", help="where a record is in a pipeline and where it has been"))
    t.add_argument("record_id")
    t.add_argument("--pipeline", default="", help="the pipeline's name (shown; PIPELINE of its stages)")
    t.add_argument(
        "--stage",
        action="append",
        required=True,
        help="a stage of the pipeline, repeated in the pipeline's order (--stage router --stage parser ...)",
    )
    t.add_argument("--json", action="store_true", help="the trace as one JSON object")
    t.add_argument(
        "--scan", type=positive_whole, default=DEFAULT_SCAN_LIMIT, help="newest entries of each stream to search"
    )
    t.set_defaults(handler=trace)

    u = add_stage_arguments(
        sub.add_parser("unlock", help="release a record's stale lock (refused while its holder is alive)"), timings=True
    )
    u.add_argument("record_id")
    u.add_argument("--force", action="store_true", help="release even though the holder looks alive (asks first)")
    add_safety_arguments(u)
    u.set_defaults(handler=unlock)

    r = add_stage_arguments(
        sub.add_parser("reclaim", help="re-enqueue entries idle on dead consumers now (asks first)"), timings=True
    )
    r.add_argument(
        "--idle-ms",
        type=positive_whole,
        help="minimum idle time of an entry (default: CLAIM_IDLE_MS); at least LOCK_TIMEOUT (or CLAIM_IDLE_MS)",
    )
    add_safety_arguments(r)
    r.set_defaults(handler=reclaim)

    p = add_stage_arguments(sub.add_parser("reprocess", help="clear a record's marker and enqueue it again"))
    p.add_argument("record_id")
    add_safety_arguments(p)
    p.add_argument(
        "--scan", type=positive_whole, default=DEFAULT_SCAN_LIMIT, help="newest entries of each stream to search"
    )
    p.set_defaults(handler=reprocess)

    a = add_stage_arguments(sub.add_parser("audit", help="the stage's repairs: who did what, how many, when"))
    a.add_argument(
        "--count", type=positive_whole, default=audit.DEFAULT_SHOWN, help="the newest N (default %(default)s)"
    )
    a.add_argument("--json", action="store_true", help="one JSON object per line")
    a.set_defaults(handler=show_audit)


def add_safety_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="print what would be done, change nothing")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


async def record_repair(
    redis: aioredis.Redis, settings: StageSettings, action: str, count: int, detail: str, record_id: str = ""
) -> None:
    """Note a repair done by the person running this command in the stage's audit stream."""
    await audit.record(redis, settings.keys.audit, audit.Repair(audit.person(), action, count, detail, record_id))


def format_report(r: RecordReport) -> list[str]:
    lines = [f"record {r.record_id} of stage {r.service} ({r.input_stream}, group {r.group})"]
    if r.trace_ids:  # where to look it up in the tracing backend (docs/observability.md)
        lines.append("  trace:  " + ", ".join(r.trace_ids))
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


def format_repairs(repairs: list[audit.Repair]) -> list[str]:
    """The audit entries about a record, below its report (none: no lines)."""
    return ["repairs:", *(f"  {audit.format_repair(r)}" for r in repairs)] if repairs else []


async def inspect_with_repairs(
    redis: aioredis.Redis, settings: StageSettings, record_id: str, scan: int
) -> tuple[RecordReport, list[audit.Repair]]:
    """The record's report and the repairs that named it (from the stage's audit stream)."""
    report = await inspect_record(redis, settings, record_id, scan)
    return report, await audit.of_record(redis, settings.keys.audit, record_id, audit.AUDIT_MAXLEN)


def render_inspection(report: RecordReport, repairs: list[audit.Repair], as_json: bool) -> str:
    if as_json:
        return json.dumps({**report.as_dict(), "repairs": [r.as_dict() for r in repairs]})
    return "\n".join([*format_report(report), *format_repairs(repairs)])


async def inspect(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        found = await inspect_with_repairs(redis, await laid_out_settings(redis, args), args.record_id, args.scan)
    print(render_inspection(*found, args.json))
    return 0


def render_trace(found: Trace, as_json: bool) -> str:
    """One line per stage in the pipeline's order, then where the record is now."""
    if as_json:
        return json.dumps(found.as_dict())
    name = f" in pipeline {found.pipeline}" if found.pipeline else ""
    width = max(len(s.stage) for s in found.stages)
    lines = [f"record {found.record_id}{name}"]
    lines += [f"  {s.stage:<{width}}  {s.text}" for s in found.stages]
    lines.append(f"now: {found.now}")
    return "\n".join(lines)


async def trace(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        # Each stage as its layout in Redis has it (a partitioned one: the record's partition of it).
        keys = await laid_out(redis, [StageKeys.for_stage(name, args.namespace) for name in args.stage])
        stages = [StageSettings(service_name=k.name, key_namespace=k.namespace, partitions=k.partitions) for k in keys]
        found = await trace_record(redis, args.pipeline, stages, args.record_id, args.scan)
    print(render_trace(found, args.json))
    return 0


async def show_audit(args: argparse.Namespace) -> int:
    settings = stage_settings(args)
    async with client(args) as redis:
        repairs = await audit.recent(redis, settings.keys.audit, args.count)
    if args.json:
        for r in repairs:
            print(json.dumps(r.as_dict()))
    elif not repairs:
        print(f"no repairs recorded in {settings.keys.audit}")
    else:
        print("\n".join(audit.format_repair(r) for r in repairs))
    return 0


def _holder(result: UnlockResult) -> str:
    idle = (
        "is not in the consumer group"
        if result.holder_idle_seconds is None
        else f"idle {duration(result.holder_idle_seconds)}"
    )
    return f"{result.holder} ({idle})"


async def unlock(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        settings = await laid_out_settings(redis, args)
        preview = await repair.unlock_preview(redis, settings, args.record_id)
        if preview.status is UnlockStatus.NOT_LOCKED:
            print(f"{preview.key} is not locked: nothing to release")
            return 0
        alive = preview.status is UnlockStatus.HOLDER_ALIVE
        if args.dry_run:
            if alive and not args.force:
                print(f"would refuse: {preview.key} is held by {_holder(preview)}, which is alive; nothing changed")
            else:
                print(f"would release {preview.key} held by {_holder(preview)}; nothing changed")
            return 0
        # Without --force a live holder's lock is refused by the script itself: only a forced release asks.
        if args.force and not confirm(f"Release {preview.key} held by {_holder(preview)}?", args.yes):
            return 1
        result = await repair.unlock(redis, settings, args.record_id, force=args.force)
        if result.status is UnlockStatus.RELEASED:
            forced = ", forced" if args.force else ""
            detail = f"released {result.key} held by {_holder(result)}{forced}"
            await record_repair(redis, settings, "unlock", 1, detail, args.record_id)
    if result.status is UnlockStatus.NOT_LOCKED:
        print(f"{result.key} is not locked: nothing to release")
        return 0
    if result.status is UnlockStatus.CHANGED:
        return fail(f"{result.key} changed while checking (released or taken again): nothing released; look again")
    if result.status is UnlockStatus.HOLDER_ALIVE:
        return fail(f"refused: {result.key} is held by {_holder(result)}, which is alive; pass --force to release it")
    print(f"released {result.key} held by {_holder(result)}")
    return 0


def _reclaim_line(r: Reclaimed, settings: StageSettings, planned: bool) -> str:
    where = (
        f"{r.entry_id} (record {r.record_id or '?'}, {r.consumer}, idle {duration(r.idle_seconds)}, "
        f"{r.deliveries} deliveries)"
    )
    if r.status == "moved":
        lock = f"; {'release' if planned else 'released'} its lock" if r.lock_released else ""
        as_new = "" if planned else f" as {r.new_entry_id}"
        return f"{'would re-enqueue' if planned else 're-enqueued'} {where}{as_new}{lock}"
    leave = "would leave" if planned else "left"
    if r.status == "alive":
        return (
            f"{leave} {where}: {r.consumer} is alive (CLAIM_IDLE_MS={settings.claim_idle_ms}), it may be processing it"
        )
    if r.status == "poison":
        return f"{leave} {where}: the next worker reclaim dead-letters it (MAX_DELIVERIES={settings.max_deliveries})"
    if r.status == "wide":
        return f"{leave} {where}: too wide to copy; the next worker reclaim dead-letters it (MAX_ENTRY_FIELDS)"
    if r.status == "trimmed":
        return f"acknowledged {where}: it was trimmed from the stream, nothing left to process"
    return f"left {where}: a worker touched it meanwhile"


async def reclaim(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        settings = await laid_out_settings(redis, args)
        try:
            plan = await repair.plan_reclaim(redis, settings, args.idle_ms)
        except ReclaimTooEager as exc:
            print(f"phoenix reclaim: --idle-ms: {exc}; nothing changed", file=sys.stderr)
            return 2
        keys = settings.keys
        inputs = keys.input if keys.partitions == 1 else f"the inputs of its {keys.partitions} partitions"
        where = f"idle over {plan.min_idle_ms} ms in {inputs}"
        if args.dry_run:
            for r in plan.entries:
                print(_reclaim_line(r, settings, planned=True))
            print(f"would reclaim {plan.movable} of {len(plan.entries)} entries {where}; nothing changed")
            return 0
        if not plan.movable:
            print(f"nothing to reclaim: none of the {len(plan.entries)} entries {where} can be re-enqueued")
            return 0
        if not confirm(f"Re-enqueue {plan.movable} entries {where}?", args.yes):
            return 1
        done = await repair.reclaim(redis, settings, plan)
        moved = sum(r.status == "moved" for r in done)
        if moved:
            await record_repair(redis, settings, "reclaim", moved, f"re-enqueued {moved} entries {where}")
    for r in done:
        print(_reclaim_line(r, settings, planned=False))
    print(f"reclaimed {moved} of {len(done)} entries {where}")
    return 0


async def reprocess(args: argparse.Namespace) -> int:
    async with client(args) as redis:
        settings = await laid_out_settings(redis, args)
        try:
            plan = await repair.plan_reprocess(redis, settings, args.record_id, args.scan)
            marker = f"delete {plan.record_key} (committed by {plan.committed_by}) and " if plan.committed_by else ""
            take = " and remove it from the DLQ" if plan.source == "dlq" else ""
            lane_input = settings.keys.lane_of(args.record_id).input  # the record's partition of the stage
            what = f"{marker}add a copy of {plan.source} entry {plan.source_entry_id} to {lane_input}{take}"
            if args.dry_run:
                print(f"would reprocess {args.record_id}: {what}; nothing changed")
                return 0
            question = f"Reprocess {args.record_id}: {what}?"
            if not confirm(question, args.yes):
                return 1
            new_id, marker_deleted = await repair.reprocess(redis, settings, plan)
        except ReprocessError as exc:
            return fail(str(exc))
        cleared = f"deleted {plan.record_key}; " if marker_deleted else ""
        done = (
            f"{cleared}enqueued {args.record_id} as {new_id} in {lane_input} (from {plan.source} entry "
            f"{plan.source_entry_id})"
        )
        await record_repair(redis, settings, "reprocess", 1, done, args.record_id)
    print(done)
    return 0
