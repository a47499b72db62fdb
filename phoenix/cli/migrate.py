"""`phoenix migrate`: move a stage's data from the v1 key names to the v2 layout of its namespace, once, before
its workers of the new version start (docs/durability.md#key-layout). `--dry-run` lists, a terminal asks, a
script passes `--yes`; the move is recorded in the stage's audit stream."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from phoenix.arguments import whole
from phoenix.cli.records import add_safety_arguments
from phoenix.cli.stage import StageSettings, add_redis_argument, confirm, fail, redis_spec
from phoenix.redis_spec import connect
from phoenix.tools import audit
from phoenix.tools.migrate import (
    DEFAULT_ALIVE_IDLE_MS,
    MigrationPlan,
    MigrationRefused,
    Move,
    migrate,
    plan_migration,
)


def add_command(sub: argparse._SubParsersAction) -> None:
    m = add_redis_argument(
        sub.add_parser("migrate", help="move a stage's data from the v1 key names into its namespace (asks first)")
    )
    m.add_argument("--service", required=True, help="stage name (SERVICE_NAME)")
    m.add_argument("--input", help="the stage's custom INPUT_QUEUE, if it has one: it keeps its name")
    m.add_argument("--dlq", help="the stage's custom DLQ_NAME, if it has one: it keeps its name")
    m.add_argument(
        "--idle-ms",
        type=whole,
        default=DEFAULT_ALIVE_IDLE_MS,
        help="a consumer of the input active more recently than this is a live worker: refused (default %(default)s)",
    )
    add_safety_arguments(m)
    m.set_defaults(handler=run)


def _lines(plan: MigrationPlan, records: int, moves: tuple[Move, ...], done: bool) -> list[str]:
    move, write, go_on = ("moved", "wrote", "continued") if done else ("would move", "would write", "would continue")
    old, new = plan.old, plan.new
    lines = [f"{go_on} the interrupted move of stage {new.name} to namespace {new.namespace}"] * plan.resuming
    if records:
        lines.append(f"{move} {records} record keys (locks and markers) {old.record_prefix}* to {new.record_prefix}*")
    lines += [f"{move} the {m.what} {m.source} to {m.target}" for m in moves]
    lines += [f"kept the custom {k} as it is (only the names derived from the stage's name move)" for k in plan.kept]
    lines.append(f"{write} the ownership marker {new.owner} (stage {plan.owner})")
    return lines


async def run(args: argparse.Namespace) -> int:
    try:  # the names its workers will accept, checked as they check them
        StageSettings(service_name=args.service, key_namespace=args.namespace)
    except ValidationError as exc:
        error = exc.errors()[0]
        option = "--namespace" if error["loc"][0] == "key_namespace" else "--service"
        print(f"phoenix migrate: {option}: {error['msg']}", file=sys.stderr)
        return 2
    # Not the decoding client of the other commands: keys are renamed by their exact bytes (tools/migrate.py).
    async with connect(redis_spec(args), decode_responses=False) as redis:
        plan = await plan_migration(
            redis,
            args.service,
            args.namespace,
            input=args.input or "",
            dlq=args.dlq or "",
            alive_idle_ms=args.idle_ms,
        )
        name, namespace = args.service, args.namespace
        if plan.empty:
            print(f"nothing to migrate: stage {name} has no keys under the v1 names ({plan.old.input}, ...)")
            return 0
        if args.dry_run:
            print("\n".join(_lines(plan, plan.records, plan.moves, done=False)))
            if plan.refusal:
                print(f"would refuse: {plan.refusal}; nothing changed")
            else:
                print(f"would move stage {name} to namespace {namespace}; nothing changed")
            return 0
        if plan.refusal:
            return fail(f"refused: {plan.refusal} (nothing changed)")
        count = plan.records + len(plan.moves)
        if not confirm(f"Move the {count} keys of stage {name} from the v1 names to namespace {namespace}?", args.yes):
            return 1
        try:
            done = await migrate(redis, plan)
        except MigrationRefused as exc:
            return fail(f"refused: {exc} (what moved stays moved; run phoenix migrate again once it is resolved)")
        moved = done.records + len(done.moved)
        detail = f"moved {moved} keys of stage {name} from the v1 names to namespace {namespace}"
        await audit.record(redis, plan.new.audit, audit.Repair(audit.person(), "migrate", moved, detail))
    print("\n".join(_lines(plan, done.records, done.moved, done=True)))
    print(f"migrated stage {name} to namespace {namespace}: start its workers of the new version")
    return 0
