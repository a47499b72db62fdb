"""The one-time move of a stage's data from the v1 key names (keys.LegacyStageKeys, `phoenix:<stage>:...`) to the
v2 layout (keys.StageKeys, `phoenix:{<namespace>}:<stage>:...`), for `phoenix migrate` (docs/durability.md#key-layout).

Every key moves by RENAMENX, which keeps what it holds: a stream its consumer groups and pending entries, a record
key its value and TTL. Nothing is copied, so nothing is lost or doubled, and nothing is merged into a key that
exists. The order keeps a half-done move safe: the record keys (locks and idempotency markers) go first and the
input stream last, so no entry can be read under the new names while its marker is still under the old one; the
ownership marker is written at the end. `LegacyStageKeys.migrating` says a move is under way, so that a run
interrupted anywhere is continued by the next (what has moved is skipped), and only to the same namespace.

A client that does not decode responses: record ids are bytes that need not be UTF-8, and a key must be renamed
by its exact name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from phoenix.errors import PhoenixError
from phoenix.keys import LegacyStageKeys, StageKeys
from phoenix.record_format import lock_holder, locked_by
from phoenix.redis_replies import text

# A live worker touches its group at least every BLOCK_MS (default 5 s) while it reads, and whenever it renews a
# lock; one of its consumers idle for less than this is taken for alive.
DEFAULT_ALIVE_IDLE_MS = 60_000
_BATCH = 500
_NEVER_MERGED = "migrate never merges"


class MigrationRefused(PhoenixError):
    """The stage cannot be moved now; the message says why and what to do, in one line."""


@dataclass(frozen=True)
class Move:
    """One key that exists under its v1 name and moves to its v2 name."""

    what: str
    source: str
    target: str


@dataclass(frozen=True)
class MigrationPlan:
    old: LegacyStageKeys
    new: StageKeys
    records: int  # record keys (locks and markers) under the v1 prefix
    moves: tuple[Move, ...]  # the other v1 keys that exist, in the order they move (the input stream last)
    kept: tuple[str, ...]  # the stage's custom names, which stay as they are
    watched_input: str  # the input stream whose consumers tell whether a worker is alive
    alive_idle_ms: int
    resuming: bool  # an earlier run was interrupted: what it moved is skipped
    refusal: str = ""  # why the move cannot be done now ('' if it can)

    @property
    def owner(self) -> str:
        """The ownership marker's `stage` field: the stage the keys now belong to."""
        return f"{self.new.namespace}/{self.new.name}"

    @property
    def empty(self) -> bool:
        """Nothing under the v1 names, and no move under way: nothing to do."""
        return not (self.records or self.moves or self.resuming)


@dataclass(frozen=True)
class MigrationResult:
    records: int  # record keys moved by this run
    moved: tuple[Move, ...]  # the other keys moved by this run


async def plan_migration(
    client: Redis,
    name: str,
    namespace: str,
    *,
    input: str = "",
    dlq: str = "",
    alive_idle_ms: int = DEFAULT_ALIVE_IDLE_MS,
) -> MigrationPlan:
    """What `migrate` would do now, changing nothing. `input`/`dlq`: the stage's custom INPUT_QUEUE/DLQ_NAME, if it
    set them; those keep their names (only names derived from the stage's name move)."""
    old = LegacyStageKeys(name, custom_dlq=dlq)
    new = StageKeys.for_stage(name, namespace, input=input, dlq=dlq)
    pairs = [("retry set", old.retry, new.retry)]
    kept = []
    if dlq:
        kept.append(f"DLQ {dlq}")
    else:
        pairs.append(("DLQ", old.dlq, new.dlq))
    pairs += [("DLQ trimmed counter", old.dlq_trimmed, new.dlq_trimmed), ("audit stream", old.audit, new.audit)]
    if input:
        kept.append(f"input stream {input}")
    else:
        pairs.append(("input stream (with its consumer groups and pending entries)", old.input, new.input))
    moves = tuple([Move(*pair) for pair in pairs if await client.exists(pair[1])])
    moving_to = await client.get(old.migrating)
    records, locked, conflict = await _survey_records(client, old, new)
    plan = MigrationPlan(
        old, new, records, moves, tuple(kept), input or old.input, alive_idle_ms, resuming=moving_to is not None
    )
    if plan.empty:
        return plan
    laid_out = await client.hget(new.layout, "partitions")
    if laid_out is not None and int(laid_out) > 1:
        # v1 data is of one partition; spreading it over lanes is not migrate's (records would change slots).
        refusal = (
            f"stage {name} of namespace {namespace} is laid out in {int(laid_out)} partitions; phoenix migrate moves "
            "v1 data to a stage of one partition only: migrate it before setting spec.partitions"
        )
    elif moving_to is not None and text(moving_to) != namespace:
        refusal = (
            f"a move of stage {name} to namespace {text(moving_to)} was interrupted: run phoenix migrate again with "
            f"--namespace {text(moving_to)} to finish it"
        )
    else:
        refusal = await _alive(client, plan) or _locked(name, locked) or await _existing(client, plan, conflict)
    return replace(plan, refusal=refusal)


async def migrate(client: Redis, plan: MigrationPlan) -> MigrationResult:
    """Carry out a plan without a refusal: every step below, in order. Raises MigrationRefused when a worker has
    come alive or a v2 key has appeared since the plan; what has moved stays moved, and a run of a new plan
    continues from there."""
    await begin(client, plan)
    records = await move_records(client, plan)
    moved = await move_keys(client, plan)
    await finish(client, plan)
    return MigrationResult(records, moved)


async def begin(client: Redis, plan: MigrationPlan) -> None:
    """Check again that no worker is alive and mark the move as under way (to the plan's namespace)."""
    if refusal := await _alive(client, plan):
        raise MigrationRefused(refusal)
    if not await client.set(plan.old.migrating, plan.new.namespace, nx=True) and not plan.resuming:
        raise MigrationRefused(f"another phoenix migrate of stage {plan.new.name} has started meanwhile: let it finish")


async def move_records(client: Redis, plan: MigrationPlan) -> int:
    """Rename every record key (lock or marker) to the new prefix; returns how many moved. A key gone meanwhile
    (an expired marker, or moved by an interrupted run) is skipped."""
    old_prefix, new_prefix = plan.old.record_prefix.encode(), plan.new.record_prefix.encode()
    moved = 0
    async for keys in _scan(client, plan.old.record_prefix + "*"):
        pipe = client.pipeline(transaction=False)
        targets = [new_prefix + key.removeprefix(old_prefix) for key in keys]
        for key, target in zip(keys, targets, strict=True):
            pipe.renamenx(key, target)
        for key, target, done in zip(keys, targets, await pipe.execute(raise_on_error=False), strict=True):
            moved += _renamed(done, key.decode(errors="backslashreplace"), target.decode(errors="backslashreplace"))
    return moved


async def move_keys(client: Redis, plan: MigrationPlan) -> tuple[Move, ...]:
    """Rename the plan's other keys, in order (the input stream last); returns those this call moved."""
    moved = []
    for move in plan.moves:
        done: object
        try:
            done = await client.renamenx(move.source, move.target)
        except ResponseError as exc:
            done = exc
        if _renamed(done, move.source, move.target):
            moved.append(move)
    return tuple(moved)


async def finish(client: Redis, plan: MigrationPlan) -> None:
    """Write the ownership marker and end the move, in one transaction. A marker that already names this stage (the
    operator adopted it) is kept; one naming another stage refuses."""
    held = await client.hget(plan.new.owner, "stage")
    if held is not None and text(held) != plan.owner:
        raise MigrationRefused(
            f"{plan.new.owner} names stage {text(held)}: the keys are another stage's, so this one cannot own them; "
            f"{_NEVER_MERGED}"
        )
    async with client.pipeline(transaction=True) as pipe:
        if held is None:
            pipe.hset(plan.new.owner, mapping={"stage": plan.owner, "uid": ""})
        pipe.delete(plan.old.migrating)
        await pipe.execute()


def _renamed(reply: object, source: str, target: str) -> bool:
    """A RENAMENX's reply: True when it moved the key, False when the key was already gone."""
    if isinstance(reply, ResponseError):
        if "no such key" in str(reply).lower():
            return False
        raise reply
    if not reply:
        raise MigrationRefused(f"both {source} and {target} exist: {_NEVER_MERGED}; find out which is right")
    return True


async def _scan(client: Redis, pattern: str) -> AsyncIterator[list[bytes]]:
    cursor: int | None = None
    while cursor != 0:
        cursor, keys = await client.scan(cursor or 0, match=pattern, count=_BATCH)
        if keys:
            yield [key.encode() if isinstance(key, str) else key for key in keys]


async def _survey_records(
    client: Redis, old: LegacyStageKeys, new: StageKeys
) -> tuple[int, list[tuple[str, str]], str]:
    """(how many v1 record keys, the locked ones with their holder, the first whose v2 name exists too or '')."""
    count, locked, conflict = 0, [], ""
    new_prefix = new.record_prefix.encode()
    async for keys in _scan(client, old.record_prefix + "*"):
        count += len(keys)
        targets = [new_prefix + key.removeprefix(old.record_prefix.encode()) for key in keys]
        pipe = client.pipeline(transaction=False)
        pipe.mget(keys)
        for target in targets:
            pipe.exists(target)
        values, *exist = await pipe.execute()
        for key, value in zip(keys, values, strict=True):
            if token := locked_by(None if value is None else text(value)):
                locked.append((key.decode(errors="backslashreplace"), lock_holder(token)))
        if not conflict and any(exist):
            conflict = targets[exist.index(1)].decode(errors="backslashreplace")
    return count, locked, conflict


async def _alive(client: Redis, plan: MigrationPlan) -> str:
    """Why a worker of the stage looks alive: a consumer of its input active within alive_idle_ms ('' if none)."""
    stream = plan.watched_input
    try:
        groups = await client.xinfo_groups(stream)
    except ResponseError:  # no such stream
        return ""
    for group in groups:
        for consumer in await client.xinfo_consumers(stream, group["name"]):
            if int(consumer["idle"]) < plan.alive_idle_ms:
                return (
                    f"consumer {text(consumer['name'])} of group {text(group['name'])} on {stream} was active "
                    f"{int(consumer['idle'])} ms ago: a worker of stage {plan.new.name} is alive; scale the stage "
                    f"to 0 (or stop its workers), wait {plan.alive_idle_ms // 1000} s and run again"
                )
    return ""


def _locked(name: str, locked: list[tuple[str, str]]) -> str:
    if not locked:
        return ""
    key, holder = locked[0]
    return (
        f"{len(locked)} record keys are locked ({key} by {holder}): a worker of stage {name} is processing, or was "
        f"killed less than its LOCK_TIMEOUT ago; stop the workers and let the locks expire (or release them with "
        f"phoenix unlock), then run again"
    )


async def _existing(client: Redis, plan: MigrationPlan, record_conflict: str) -> str:
    """Why keys under the new names stop the move: on a first run any key of the stage under the new names (a
    worker or operator of the new version made it); on a continued run a key whose both names exist."""
    if not plan.resuming:
        async for keys in _scan(client, plan.new.pattern):
            return (
                f"{keys[0].decode(errors='backslashreplace')} already exists: stage {plan.new.name} has keys in "
                f"namespace {plan.new.namespace} already (a worker or operator of the new version made them) and "
                f"{_NEVER_MERGED}; stop what writes them and, if they hold nothing you need, delete "
                f"{plan.new.pattern}, then run again"
            )
    for move in plan.moves:
        if await client.exists(move.target):
            return f"both {move.source} and {move.target} exist: {_NEVER_MERGED}; find out which is right"
    if record_conflict:
        return f"{record_conflict} exists under both names: {_NEVER_MERGED}; find out which is right"
    return ""
