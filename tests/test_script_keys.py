"""Every key a Lua script of the package touches comes from its KEYS, and the KEYS of one call hash to one slot
(issue 19): what Redis Cluster needs of a script, and what keeps a script from reaching another stage's keys.

Two checks. Static: each redis.call / redis.pcall in the .lua files takes its keys from KEYS, directly or through
a local assigned from KEYS. Live: each script runs through its real caller (a Worker, the repairs, the replays,
billing, the operator's stream setup) against the embedded Valkey in cluster mode, names from phoenix/keys.py in
a namespace of its own; MONITOR shows every call with its KEYS and every command the script ran inside it, and
the server's own COMMAND GETKEYS names the keys of each of those commands.
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path

import pytest

import phoenix

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
            "INCRBY",
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
            "ZRANGEBYSCORE",
            "ZREM",
        )
    },
    # Every argument is a key.
    "DEL": ALL,
    "EXISTS": ALL,
    # The first argument is not a key: a subcommand (XINFO GROUPS|CONSUMERS|STREAM <key>) ...
    "XINFO": (2,),
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
    from_keys, otherwise = set(), set()
    for names, values in re.findall(
        rf"^[ \t]*(?:local[ \t]+)?({_NAME}(?:[ \t]*,[ \t]*{_NAME})*)[ \t]*=(?!=)(.*)$", code, re.M
    ):
        expressions = _split_args(values, 0)
        for position, name in enumerate(n.strip() for n in names.split(",")):
            expression = expressions[position] if position < len(expressions) else ""
            (from_keys if _from_keys(expression) else otherwise).add(name)
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
        for position in range(1, len(args)) if positions == ALL else positions:
            key = args[position] if position < len(args) else "(missing)"
            if not (_from_keys(key) or key in keys_locals):
                found.append(f"{command} {key}")
    return found


def test_the_package_has_its_scripts() -> None:
    names = {path.name for path in SCRIPTS}
    assert {"settle.lua", "locks_renew.lua", "repair_reclaim.lua", "ensure_stream.lua"} <= names


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
        local call = redis.call
        redis.call('RENAME', KEYS[1], KEYS[2])
        redis.call('TIME')
        """
    ) == [
        "GET key",
        "DEL ARGV[3]",
        "EXPIRE other",
        "XINFO ARGV[4]",
        "redis.call used other than as a call (an alias?)",
        "RENAME (not in KEY_POSITIONS: say where its keys are)",
    ]
