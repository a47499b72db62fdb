"""Every key a Lua script of the package touches comes from its KEYS, and the KEYS of one call hash to one slot
(issue 19): what Redis Cluster needs of a script, and what keeps a script from reaching another stage's keys.

Two checks. Static: each redis.call / redis.pcall in the .lua files takes its keys from KEYS, directly or through
a local assigned from KEYS. Live: each script runs through its real caller (a Worker, the repairs, the replays,
billing, the operator's claim and delete) against the embedded Valkey in cluster mode, names from phoenix/keys.py in
a namespace of its own; MONITOR shows every call with its KEYS and every command the script ran inside it, and
the server's own COMMAND GETKEYS names the keys of each of those commands.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.crc import key_slot
from redis.exceptions import ResponseError

import phoenix
from phoenix.keys import StageKeys
from phoenix.operator.redis.ops import Destroyed, destroy
from phoenix.producer import Producer, Record
from phoenix.rate_limits import RateLimit
from phoenix.record_format import DONE, LOCKED
from phoenix.tools import dlq, repair
from phoenix.tools.queue_stats import collect
from phoenix.worker_runtime import ownership
from phoenix.worker_runtime.billing import ApiKeyProvider
from phoenix.worker_runtime.ownership import Claimed
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.worker import Worker
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.key_service import running_key_service
from tests.fixtures.replies import add_entry
from tests.processors import OutcomeProcessor

PACKAGE = Path(str(files(phoenix)))
SCRIPTS = sorted(PACKAGE.rglob("*.lua"))

# Where the keys are among a command's arguments (1: the first after the command's name), for every command the
# scripts call. A command missing here fails the check, so a new one is looked up instead of guessed.
ALL = "all"
KEY_POSITIONS: dict[str, tuple[int, ...] | str] = {
    **{
        command: (1,)
        for command in (
            "EXPIRE",
            "GET",
            "HDEL",
            "HGET",
            "HINCRBY",
            "HKEYS",
            "HMGET",
            "HSET",
            "INCRBY",
            "PEXPIREAT",
            "SET",
            "TYPE",
            "XACK",
            "XADD",
            "XCLAIM",
            "XDEL",
            "XLEN",
            "XPENDING",
            "XRANGE",
            "XTRIM",
            "ZADD",
            "ZRANGE",
            "ZRANGEBYSCORE",
            "ZREM",
            "ZREMRANGEBYSCORE",
        )
    },
    # Every argument is a key.
    "DEL": ALL,
    "EXISTS": ALL,
    # The first argument is not a key: a subcommand (XINFO GROUPS|CONSUMERS <key>, XGROUP CREATE|DESTROY <key>) ...
    "XINFO": (2,),
    "XGROUP": (2,),
    # ... or no key at all: the server's clock.
    "TIME": (),
}

_LONG_BRACKET = re.compile(r"--\[(=*)\[.*?\]\1\]", re.S)
_CALL = re.compile(r"\bredis\.p?call\b")
_NAME = r"[A-Za-z_]\w*"


def _code(text: str) -> str:
    """The script without its comments, strings kept (a `--` inside a quoted string is no comment)."""
    text = _LONG_BRACKET.sub("", text)
    assert "[[" not in text, "long strings are not understood by this check: quote the string instead"
    out, i, quote = [], 0, ""
    while i < len(text):
        c = text[i]
        if quote:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            out.append(c)
        elif text.startswith("--", i):
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def _split_args(code: str, start: int) -> list[str]:
    """The comma-separated expressions from `start` (just after an opening parenthesis) to its closing one, or
    to the end of `code`."""
    args, depth, current, i, quote = [], 0, [], start, ""
    while i < len(code):
        c = code[i]
        if quote:
            if c == "\\":
                current.append(c)
                i += 1
                c = code[i]
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append("".join(current).strip())
                return args
            depth -= 1
        elif c == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            i += 1
            continue
        current.append(c)
        i += 1
    args.append("".join(current).strip())  # unclosed: an assignment's value going on past its line
    return args


def _from_keys(expression: str) -> bool:
    return re.fullmatch(r"KEYS\[[^\[\]]+\]", expression) is not None


def _keys_locals(code: str) -> set[str]:
    """Names only ever assigned an element of KEYS: `local input, output = KEYS[1], KEYS[2]`, `local key =
    KEYS[4 + item]`. A name assigned anything else anywhere in the script is not one."""
    from_keys: set[str] = set()
    otherwise: set[str] = set()
    for names, values in re.findall(
        rf"^[ \t]*(?:local[ \t]+)?({_NAME}(?:[ \t]*,[ \t]*{_NAME})*)[ \t]*=(?!=)(.*)$", code, re.M
    ):
        expressions = _split_args(values, 0)
        for position, name in enumerate(n.strip() for n in names.split(",")):
            expression = expressions[position] if position < len(expressions) else ""
            (from_keys if _from_keys(expression) else otherwise).add(name)
    # A loop over a table of such names: `for _, key in ipairs({input, dlq}) do`.
    for name, elements in re.findall(rf"\bfor\s+{_NAME}\s*,\s*({_NAME})\s+in\s+ipairs\(\{{([^{{}}]*)\}}\)", code):
        items = [e.strip() for e in elements.split(",")]
        (from_keys if all(_from_keys(e) or e in from_keys for e in items) else otherwise).add(name)
    return from_keys - otherwise


def undeclared_keys(text: str) -> list[str]:
    """Each key argument of a Redis command in the script that does not come from KEYS, as `COMMAND arg`."""
    code = _code(text)
    keys_locals = _keys_locals(code)
    found = []
    for match in _CALL.finditer(code):
        rest = code[match.end() :]
        if rest.startswith("("):
            args = _split_args(code, match.end() + 1)
        elif pcall := re.match(r"\s*,", rest):  # pcall(redis.call, 'CMD', ...): the call's arguments follow
            args = _split_args(code, match.end() + pcall.end())
        else:
            found.append("redis.call used other than as a call (an alias?)")
            continue
        literal = re.fullmatch(r"'([A-Za-z]+)'|\"([A-Za-z]+)\"", args[0])
        if literal is None:
            found.append(f"a command named by an expression: {args[0]}")
            continue
        command = (literal[1] or literal[2]).upper()
        positions = KEY_POSITIONS.get(command)
        if positions is None:
            found.append(f"{command} (not in KEY_POSITIONS: say where its keys are)")
            continue
        for position in range(1, len(args)) if isinstance(positions, str) else positions:  # ALL
            key = args[position] if position < len(args) else "(missing)"
            if not (_from_keys(key) or key in keys_locals):
                found.append(f"{command} {key}")
    return found


def test_the_package_has_its_scripts() -> None:
    names = {path.name for path in SCRIPTS}
    assert {"settle.lua", "locks_renew.lua", "repair_reclaim.lua", "claim_keys.lua"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_every_key_a_script_touches_comes_from_keys(script: Path) -> None:
    assert undeclared_keys(script.read_text()) == []


def test_the_check_finds_keys_built_or_passed_outside_keys() -> None:
    """The check itself: concatenation, a key in ARGV, a key read from a value, an alias, an unknown command."""
    assert undeclared_keys(
        """
        local record_prefix, input = ARGV[1], KEYS[1]  -- redis.call('GET', ARGV[9]) in a comment is no call
        local key = record_prefix .. ARGV[2]
        redis.call('GET', key)
        redis.call("DEL", KEYS[2], ARGV[3])
        redis.call('XADD', input, '*', 'a', '--not a comment')
        local other = redis.call('GET', KEYS[1])
        redis.pcall('EXPIRE', other, 5)
        local ok = pcall(redis.call, 'XINFO', 'GROUPS', ARGV[4])
        for _, declared in ipairs({input, KEYS[2]}) do redis.call('TYPE', declared) end
        for _, k in ipairs({input, ARGV[5]}) do redis.call('TYPE', k) end
        local call = redis.call
        redis.call('RENAME', KEYS[1], KEYS[2])
        redis.call('TIME')
        """
    ) == [
        "GET key",
        "DEL ARGV[3]",
        "EXPIRE other",
        "XINFO ARGV[4]",
        "TYPE k",
        "redis.call used other than as a call (an alias?)",
        "RENAME (not in KEY_POSITIONS: say where its keys are)",
    ]


# --- Live: each script through its real caller, on a cluster node, watched with MONITOR ---------------------------

NAMESPACE = "team-b"  # not the default one: the names really come from phoenix/keys.py's scope
_MONITOR_LINE = re.compile(rb"^\d+\.\d+ \[\d+ (?P<client>[^\]]*)\] (?P<args>.*)$", re.S)
_MONITOR_ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"', re.S)
_MONITOR_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)", re.S)
_ESCAPED = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}
_END = b"phoenix-test-monitor-end"


def _unescape(raw: bytes) -> bytes:
    """An argument as MONITOR quotes it (sdscatrepr) back to its bytes."""

    def one(m: re.Match[bytes]) -> bytes:
        escaped = m[1]
        if len(escaped) == 3:
            return bytes([int(escaped[1:], 16)])
        return _ESCAPED.get(escaped, escaped)

    return _MONITOR_ESCAPE.sub(one, raw)


@dataclass
class ScriptCall:
    """One EVALSHA / EVAL as the server received it, and the commands the script ran inside it."""

    sha: str
    keys: list[bytes]
    inner: list[list[bytes]] = field(default_factory=list)
    touched: set[bytes] = field(default_factory=set)  # the keys of `inner`, as COMMAND GETKEYS names them


class ScriptMonitor:
    """Every script call the server runs while the block lasts, read from MONITOR on a connection of its own."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self.calls: list[ScriptCall] = []
        self.strays: list[list[bytes]] = []  # commands of a script seen outside any call: none expected

    async def __aenter__(self) -> ScriptMonitor:
        self._monitor = self._client.monitor()
        await self._monitor.__aenter__()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.echo(_END)  # the last line the reader waits for: everything before it was read
        await asyncio.wait_for(self._reader, 60)
        await self._monitor.__aexit__(*exc)
        await self._name_touched_keys()

    async def _read(self) -> None:
        connection = self._monitor.connection
        assert connection is not None
        current: ScriptCall | None = None
        while True:
            line = await connection.read_response()
            parsed = _MONITOR_LINE.match(line)
            assert parsed is not None, line
            args = [_unescape(a) for a in _MONITOR_ARG.findall(parsed["args"])]
            command = args[0].upper()
            if parsed["client"] == b"lua":
                (current.inner if current is not None else self.strays).append(args)
            elif command in (b"EVALSHA", b"EVAL"):
                sha = args[1].decode() if command == b"EVALSHA" else hashlib.sha1(args[1]).hexdigest()
                current = ScriptCall(sha, args[3 : 3 + int(args[2])])
                self.calls.append(current)
            elif command == b"ECHO" and args[1:] == [_END]:
                return
            else:
                current = None

    async def _name_touched_keys(self) -> None:
        """The server's own answer to which arguments of each inner command are keys."""
        commands = [(call, args) for call in self.calls for args in call.inner]
        for first in range(0, len(commands), 500):
            pipe = self._client.pipeline(transaction=False)
            for _, args in commands[first : first + 500]:
                pipe.command_getkeys(*args)
            replies = await pipe.execute(raise_on_error=False)
            for (call, args), reply in zip(commands[first : first + 500], replies, strict=True):
                if isinstance(reply, ResponseError):
                    assert "no key arguments" in str(reply), (args, reply)
                    continue
                call.touched.update(k.encode() if isinstance(k, str) else k for k in reply)  # redis-py decodes them

    def shas(self) -> set[str]:
        return {call.sha for call in self.calls}


def _sha(script: str) -> str:
    return hashlib.sha1((PACKAGE / script).read_text().encode()).hexdigest()


def check_calls(monitor: ScriptMonitor, scripts: set[str], namespace_slot: int | set[int]) -> None:
    """Each of `scripts` (paths under phoenix/) was called and ran; each of their calls has KEYS that hash to one
    slot, the namespace's (or one of the lanes' slots given), and every key its commands touched is among them."""
    allowed = {namespace_slot} if isinstance(namespace_slot, int) else namespace_slot
    by_sha = {_sha(s): s for s in scripts}
    assert monitor.strays == []
    assert monitor.shas() <= {_sha(str(path.relative_to(PACKAGE))) for path in SCRIPTS}, "a script not of the package"
    assert set(by_sha) <= monitor.shas(), f"not called: {[s for h, s in by_sha.items() if h not in monitor.shas()]}"
    ran = {call.sha for call in monitor.calls if call.inner}
    assert set(by_sha) <= ran, f"called but ran nothing: {[s for h, s in by_sha.items() if h not in ran]}"
    problems = []
    for call in (c for c in monitor.calls if c.sha in by_sha):
        name = by_sha[call.sha]
        slots = {key_slot(key) for key in call.keys}
        if len(slots) != 1 or not slots <= allowed:
            problems.append(f"{name}: KEYS {call.keys} hash to slots {sorted(slots)}")
        if undeclared := call.touched - set(call.keys):
            problems.append(f"{name}: touched {sorted(undeclared)} not in its KEYS {call.keys}")
    assert problems == []


WORKER_SCRIPTS = {
    "worker_runtime/locks_acquire.lua",
    "worker_runtime/locks_renew.lua",
    "worker_runtime/settle.lua",
    "worker_runtime/retry_promote.lua",
    "worker_runtime/trim.lua",
    "worker_runtime/rate_limit.lua",
}
# Run by a partitioned worker whose forwards are relayed (test_a_partitioned_worker_relays_...).
RELAY_SCRIPTS = {"worker_runtime/relay_done.lua", "worker_runtime/relay_write.lua"}
# Run by the worker of a final stage (test_a_final_stage_flushes_its_latencies_...).
FINAL_SCRIPTS = {"worker_runtime/latency_flush.lua"}
DIRECT_SCRIPTS = {
    "worker_runtime/claim_keys.lua",
    "worker_runtime/claim_name.lua",
    "worker_runtime/release_name.lua",
    "worker_runtime/layout_check.lua",
    "operator/redis/delete_owned.lua",
    "tools/dlq_replay.lua",
    "tools/repair_unlock.lua",
    "tools/repair_reclaim.lua",
    "tools/repair_reprocess.lua",
    "tools/queue_check.lua",
    "worker_runtime/billing_delete_if.lua",
    "producer_once.lua",
}


def test_the_live_checks_drive_every_script() -> None:
    assert {
        str(path.relative_to(PACKAGE)) for path in SCRIPTS
    } == WORKER_SCRIPTS | RELAY_SCRIPTS | FINAL_SCRIPTS | DIRECT_SCRIPTS


STAGE = StageKeys.for_stage("scripts", NAMESPACE)
NEXT = StageKeys.for_stage("scripts-next", NAMESPACE)  # the next stage of one pipeline: the same slot


async def _add(client: aioredis.Redis, record_id: str, **data: object) -> str:
    return await add_entry(client, STAGE.input, {"record_id": record_id, "user_id": "u1", "data": json.dumps(data)})


@pytest.mark.timeout(90)
@pytest.mark.subprocess
async def test_a_worker_calls_its_scripts_with_their_keys_declared_in_one_slot(
    cluster: aioredis.Redis, cluster_url: str
) -> None:
    """Forward, forward nothing, retry then dead-letter, dead-letter at once, a malformed entry, a duplicate and a
    long job (its lock renewed), then trims: every script the worker runs, on a cluster node."""
    monitor_client = aioredis.Redis.from_url(cluster_url, decode_responses=False)
    async with ScriptMonitor(monitor_client) as monitor:
        for i in range(3):
            await _add(cluster, f"f{i}")
        await _add(cluster, "nothing", action="none")
        await _add(cluster, "flaky", action="fail")
        await _add(cluster, "bad", action="invalid")
        await _add(cluster, "long", action="sleep:1.5")
        await cluster.xadd(STAGE.input, {"user_id": "u1", "data": "{}"})  # no record_id: malformed
        async with running_worker(
            cluster_url,
            "scripts",
            OutcomeProcessor,
            key_namespace=NAMESPACE,
            output_queue=NEXT.input,
            max_attempts=2,
            # Far above the rate: every scope's buckets in each call (all under the namespace's tag).
            rate_limits=[
                RateLimit(rate=10_000),
                RateLimit(rate=10_000, scope="user"),
                RateLimit(rate=10_000, scope="downstream", downstream="llm", cost="tokens"),
            ],
        ) as worker:
            await wait_until(lambda: drained(worker), "the first entries settled", 60)
            await wait_until(lambda: cluster.xlen(STAGE.dlq), "dead letters", 60)
            await _add(cluster, "f0")  # committed already: the claim finds its marker
            await wait_until(
                lambda: _settled(cluster, worker, dead=3, forwarded=4), "a duplicate skipped, three dead letters", 60
            )
            await wait_until(lambda: _trimmed(cluster), "the input trimmed", 60)
    await monitor_client.aclose()

    check_calls(monitor, WORKER_SCRIPTS, key_slot(STAGE.input.encode()))
    # The commits named every record key they wrote in KEYS: the one call shape that carries many record keys.
    settled = {key for call in monitor.calls if call.sha == _sha("worker_runtime/settle.lua") for key in call.keys}
    for record in ("f0", "f1", "f2", "nothing", "flaky", "bad", "long"):
        assert STAGE.record(record).encode() in settled
    renewed = [call for call in monitor.calls if call.sha == _sha("worker_runtime/locks_renew.lua") and call.inner]
    assert any(STAGE.record("long").encode() in call.keys for call in renewed)


@pytest.mark.timeout(90)
async def test_a_partitioned_worker_relays_and_calls_its_scripts_per_lane_each_in_one_slot(
    cluster: aioredis.Redis, cluster_url: str
) -> None:
    """PARTITIONS=3 with a plain output stream on a cluster node: every script call (claims, commits to the outbox,
    retries, trims, the relay's acknowledgement) has the keys of one lane, in that lane's slot; the relay's writes
    (relay_write.lua) those of the output, in its slot."""
    stage = StageKeys.for_stage("scripts", NAMESPACE, partitions=3)
    output = "scripts-plain-output"  # a slot of its own: the commits go to each lane's outbox
    records = [f"r{i}" for i in range(30)]
    monitor_client = aioredis.Redis.from_url(cluster_url, decode_responses=False)
    async with ScriptMonitor(monitor_client) as monitor:
        for record in records:
            action = "fail" if record == "r1" else ""
            fields = {"record_id": record, "user_id": "u1", "data": json.dumps({"action": action})}
            await add_entry(cluster, stage.lane_of(record).input, fields)
        async with running_worker(
            cluster_url,
            "scripts",
            OutcomeProcessor,
            key_namespace=NAMESPACE,
            partitions=3,
            output_queue=output,
            max_attempts=2,
        ) as worker:
            await wait_until(lambda: drained(worker), "every lane drained", 60)
            await wait_until(lambda: _count(cluster, output, len(records) - 1), "the outboxes relayed", 60)
            await wait_until(lambda: _count(cluster, stage.lane_of("r1").dlq, 1), "the failing record dead", 60)
            # trim.lua runs every TRIM_INTERVAL: a fast drain can end before the first, so wait for each lane's.
            for lane in stage.lanes:
                await wait_until(lambda lane=lane: _at_most(cluster, lane.input, 1), f"{lane.input} trimmed", 60)
    await monitor_client.aclose()
    lane_slots = {key_slot(lane.input.encode()) for lane in stage.lanes}
    assert len(lane_slots) == 3
    lane_scripts = WORKER_SCRIPTS - {"worker_runtime/locks_renew.lua", "worker_runtime/rate_limit.lua"} | {
        "worker_runtime/relay_done.lua"
    }
    check_calls(monitor, lane_scripts, lane_slots)
    # The relay's writes to the plain output, each with its marker: in the output's slot.
    check_calls(monitor, {"worker_runtime/relay_write.lua"}, key_slot(output.encode()))
    done = [call for call in monitor.calls if call.sha == _sha("worker_runtime/relay_done.lua") and call.inner]
    assert {call.keys[0] for call in done} <= {lane.outbox.encode() for lane in stage.lanes}


@pytest.mark.timeout(90)
async def test_a_final_stage_flushes_its_latencies_under_the_stages_own_tag(
    cluster: aioredis.Redis, cluster_url: str
) -> None:
    """PARTITIONS=2, no output: the latency windows are the stage's as a whole, in the namespace's slot, written
    in one call per flush whatever the lane a record came from."""
    stage = StageKeys.for_stage("scripts", NAMESPACE, partitions=2)
    records = [f"r{i}" for i in range(10)]
    monitor_client = aioredis.Redis.from_url(cluster_url, decode_responses=False)
    async with ScriptMonitor(monitor_client) as monitor:
        for record in records:
            fields = {"record_id": record, "user_id": "u1", "data": "{}"}
            await add_entry(cluster, stage.lane_of(record).input, fields)
        async with running_worker(cluster_url, "scripts", OutcomeProcessor, key_namespace=NAMESPACE, partitions=2) as w:
            await wait_until(lambda: drained(w), "every lane drained", 60)
    await monitor_client.aclose()
    check_calls(monitor, FINAL_SCRIPTS, key_slot(STAGE.input.encode()))
    [window] = [key async for key in cluster.scan_iter(match=f"{stage.pattern.removesuffix('*')}latency:*")]
    assert sum(int(count) for count in (await cluster.hgetall(window)).values()) == len(records)


async def _count(client: aioredis.Redis, stream: str, count: int) -> bool:
    return await client.xlen(stream) >= count


async def _at_most(client: aioredis.Redis, stream: str, count: int) -> bool:
    return await client.xlen(stream) <= count  # XTRIM MINID keeps the group's last delivered entry


async def _settled(client: aioredis.Redis, worker: Worker, *, dead: int, forwarded: int) -> bool:
    return (
        await drained(worker)
        and await client.xlen(STAGE.dlq) == dead
        and await client.xlen(NEXT.input) == forwarded
        and await client.zcard(STAGE.retry) == 0
    )


async def _trimmed(client: aioredis.Redis) -> bool:
    """trim.lua ran after everything was acknowledged: the input holds nothing the group still needs."""
    return await client.xlen(STAGE.input) <= 1  # XTRIM MINID keeps the group's last delivered entry


async def test_repairs_replays_billing_and_the_operator_call_their_scripts_with_their_keys_declared(
    cluster: aioredis.Redis, cluster_url: str
) -> None:
    settings = WorkerSettings(
        service_name=STAGE.name,
        processor="tests.processors:OutcomeProcessor",
        redis_url=cluster_url,
        key_namespace=NAMESPACE,
        claim_idle_ms=1,  # dead-1 is dead a millisecond after its read
    )
    monitor_client = aioredis.Redis.from_url(cluster_url, decode_responses=False)
    async with ScriptMonitor(monitor_client) as monitor, running_key_service() as key_service:
        # The operator claims the stage's keys, creating its streams and group.
        assert await ownership.claim(cluster, STAGE, "uid-1", adopt=True) == Claimed(group=True, dlq=True)
        # Two entries delivered to a consumer that died holding their records' locks.
        await _add(cluster, "a")
        await _add(cluster, "b")
        await cluster.xreadgroup(STAGE.consumer_group, "dead-1", {STAGE.input: ">"}, count=2)
        for record in ("a", "b"):
            await cluster.set(STAGE.record(record), LOCKED + "dead-1:0123456789ab")
        assert (await repair.unlock(cluster, settings, "a", force=True)).status == "released"
        await asyncio.sleep(0.01)
        reclaimed = await repair.reclaim(cluster, settings, await repair.plan_reclaim(cluster, settings))
        assert [(r.record_id, r.status, r.lock_released) for r in reclaimed] == [
            ("a", "moved", False),
            ("b", "moved", True),
        ]
        # A committed record processed again.
        await cluster.set(STAGE.record("c"), DONE + "1-0")
        await cluster.xadd(STAGE.dlq, {"record_id": "c", "user_id": "u1", "data": "{}", "error": "gone"})
        plan = await repair.plan_reprocess(cluster, settings, "c")
        assert (await repair.reprocess(cluster, settings, plan))[1] is True
        # DLQ replays: by hand, and the operator's once-only one.
        for record in ("d", "e"):
            await cluster.xadd(STAGE.dlq, {"record_id": record, "user_id": "u1", "data": "{}", "error": "gone"})
        assert await dlq.replay(cluster, STAGE.dlq, STAGE.input, 1) == 1
        assert await dlq.replay(cluster, STAGE.dlq, STAGE.input, None, ledger=STAGE.replay_ledger("r1")) == 1
        # The operator's queue figures, checked against the ids of a stream with a backlog.
        [stats] = await collect(cluster, [STAGE])
        assert stats.lag and stats.disagreements == ()
        # Billing: a fetch under the single-fetch guard, which is released with the compare-and-delete script.
        provider = ApiKeyProvider(
            cluster,
            stage=STAGE.name,
            namespace=NAMESPACE,
            billing_url=key_service.url,
            master_key=SecretStr(key_service.master_key),
        )
        try:
            assert await provider.key_for("u1") is not None
        finally:
            await provider.aclose()
        # The HTTP ingest's send: the record's marker and its input, in one call.
        assert [s.new for s in await Producer(cluster, STAGE.name, NAMESPACE).send_once([Record("i")], 60)] == [True]
        # deletionPolicy Delete: the record keys, the ledger, then the streams, the retry set and the marker.
        destroyed = await destroy(cluster, STAGE, "uid-1")
        assert isinstance(destroyed, Destroyed) and destroyed.streams == [STAGE.input, STAGE.dlq]
        # A stream named by a stage of the namespace (in the namespace's slot here): claimed, then given up.
        named = StageKeys.for_stage("named", NAMESPACE, output=f"{{{NAMESPACE}}}:results")
        await ownership.claim_names(cluster, named, "cluster-1")
        assert await ownership.release_names(cluster, named, named.claimed_streams, "cluster-1") == [named.output]
    await monitor_client.aclose()

    check_calls(monitor, DIRECT_SCRIPTS, key_slot(STAGE.input.encode()))
    reclaim = _sha("tools/repair_reclaim.lua")
    reclaim_keys = [c.keys for c in monitor.calls if c.sha == reclaim and c.inner]  # a NOSCRIPT attempt runs nothing
    assert reclaim_keys == [[STAGE.input.encode(), STAGE.record("a").encode(), STAGE.record("b").encode()]]


async def test_a_partitioned_stages_claim_and_delete_call_their_scripts_one_slot_each(
    cluster: aioredis.Redis, cluster_url: str
) -> None:
    """A stage of 4 partitions: the layout checked under the stage-wide tag, each lane claimed and deleted by its
    own calls under its own tag, every call's KEYS in one slot."""
    stage = StageKeys.for_stage("lanes", NAMESPACE, partitions=4)
    monitor_client = aioredis.Redis.from_url(cluster_url, decode_responses=False)
    async with ScriptMonitor(monitor_client) as monitor:
        assert await ownership.claim(cluster, stage, "uid-p", adopt=True) == Claimed(group=True, dlq=True)
        for lane in stage.lanes:
            await cluster.set(lane.record("r"), DONE + "1-0")
        destroyed = await destroy(cluster, stage, "uid-p")
        assert isinstance(destroyed, Destroyed) and len(destroyed.streams) == 8
    await monitor_client.aclose()
    scripts = {
        _sha(s): s
        for s in ("worker_runtime/claim_keys.lua", "worker_runtime/layout_check.lua", "operator/redis/delete_owned.lua")
    }
    calls = [c for c in monitor.calls if c.sha in scripts and c.inner]
    slots = {key_slot(stage.input.encode()), *(key_slot(lane.input.encode()) for lane in stage.lanes)}
    assert len(slots) == 5  # four lanes and the stage as a whole, each its own slot
    for call in calls:
        assert len({key_slot(key) for key in call.keys}) == 1, (scripts[call.sha], call.keys)
        assert call.touched <= set(call.keys), (scripts[call.sha], call.touched - set(call.keys))
    called: dict[str, set[int]] = {scripts[c.sha]: set() for c in calls}
    for call in calls:
        called[scripts[call.sha]].add(key_slot(call.keys[0]))
    assert called == {
        "worker_runtime/layout_check.lua": {key_slot(stage.layout.encode())},
        "worker_runtime/claim_keys.lua": slots - {key_slot(stage.layout.encode())},
        "operator/redis/delete_owned.lua": slots,
    }
