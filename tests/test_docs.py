"""README's "Add a stage", followed literally: its module, its commands, its promised output.

The code blocks are found by their `<!-- docs-test: add-a-stage ... -->` markers. The only substitutions are the ones
a reader makes: their Redis (here the test Valkey) in `REDIS_URL` and a free port for `HEALTH_PORT`.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.metrics import MetricWrapperBase

from phoenix.crds.definition import custom_resource_definition
from phoenix.stages.grouper import GrouperSettings
from phoenix.stages.parser import ParserSettings
from phoenix.stages.router import RouterSettings
from phoenix.worker_runtime import metrics
from phoenix.worker_runtime.billing import BillingSettings
from phoenix.worker_runtime.settings import WorkerSettings
from phoenix.worker_runtime.tracing import READ_VARIABLES
from tests.fixtures.docs import DOCS, README, marked_block, table
from tests.fixtures.eventually import eventually
from tests.fixtures.processes import LoggedProcess, free_loopback_port
from tests.fixtures.replies import stream_entries_now

BIN = Path(sys.executable).parent  # the phoenix console script lives next to the interpreter
PLACEHOLDER = "..."


def shell_commands(code: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped."""
    joined = code.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


def split_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=value words (or `export NAME=value`) and the command after them."""
    env: dict[str, str] = {}
    words = argv[1:] if argv[0] == "export" else argv
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def matches(documented: dict[str, Any], logged: dict[str, Any]) -> bool:
    return all(key in logged and (value == PLACEHOLDER or logged[key] == value) for key, value in documented.items())


def test_readme_blocks_parse() -> None:
    assert split_env(["export", "A=1"]) == ({"A": "1"}, [])
    assert split_env(["A=1", "B=x y", "phoenix", "worker"]) == ({"A": "1", "B": "x y"}, ["phoenix", "worker"])
    assert shell_commands("A=1 \\\n  b c  # note\n\n# only a comment\nd 'e f'\n") == [["A=1", "b", "c"], ["d", "e f"]]


@pytest.mark.timeout(90)
@pytest.mark.subprocess
def test_add_a_stage_as_documented(tmp_path: Path, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()  # a marker of an earlier run would make doc-1 a duplicate
    args, module = marked_block("add-a-stage")
    named = re.fullmatch(r"file=(\S+)", args)
    assert named, args
    file_name = named[1]
    (tmp_path / file_name).write_text(module)

    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "PYTHONPATH")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"  # `phoenix` as after `source .venv/bin/activate`
    worker_argv: list[str] = []
    for argv in shell_commands(marked_block("add-a-stage commands")[1]):
        assignments, command = split_env(argv)
        env.update(assignments)
        if command:
            worker_argv = command
    assert worker_argv == ["phoenix", "worker"]
    documented_url = env["REDIS_URL"]
    env.update(REDIS_URL=redis_url, HEALTH_PORT=str(free_loopback_port()))
    output_stream = env["OUTPUT_QUEUE"]

    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        # Run in the directory of the module, as documented: PYTHONPATH=. is relative to it.
        popen = subprocess.Popen(
            [str(BIN / "phoenix"), *worker_argv[1:]],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    worker = LoggedProcess("wordcount worker", popen, log_path)
    try:
        ((*enqueue_argv,),) = shell_commands(marked_block("add-a-stage enqueue")[1])
        assert enqueue_argv[:2] == ["phoenix", "enqueue"]
        enqueued = subprocess.run(
            [str(BIN / "phoenix"), *enqueue_argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert enqueued.returncode == 0, enqueued.stderr
        assert re.fullmatch(r"\d+-\d+\n", enqueued.stdout)  # the entry id

        documented = [json.loads(line) for line in marked_block("add-a-stage output")[1].splitlines() if line]

        def all_logged() -> bool:
            if not worker.alive:
                raise worker.failure("exited early")
            logged = [json.loads(line) for line in worker.log_tail(10_000).splitlines() if line.startswith("{")]
            return all(any(matches(doc, entry) for entry in logged) for doc in documented)

        eventually(all_logged, f"the documented log lines (README's REDIS_URL {documented_url} -> test Valkey)", 60)
        ((_, fields),) = stream_entries_now(client, output_stream)
    finally:
        worker.stop()
        client.close()
    words = next(doc for doc in documented if doc["event"] == "words_counted")
    result = {k: words[k] for k in ("words", "unique", "top_word")}
    # entered_at: when `phoenix enqueue` wrote the record, carried on.
    expected = {"record_id": words["record_id"], "user_id": words["user_id"], "data": fields["data"]}
    assert fields == {**expected, "entered_at": fields["entered_at"]} and fields["entered_at"].isdigit()
    assert json.loads(fields["data"]) == result
    assert worker.popen.returncode == 0


def test_entry_point_snippet_names_the_documented_class() -> None:
    text = README.read_text()
    snippet = re.search(r'```toml\n(\[project\.entry-points\."phoenix\.processors"\]\n.*?)```', text, re.DOTALL)
    assert snippet, "README.md has no phoenix.processors entry point example"
    entry_points = tomllib.loads(snippet[1])["project"]["entry-points"]["phoenix.processors"]
    args, module = marked_block("add-a-stage")
    for target in entry_points.values():
        module_name, _, class_name = target.partition(":")
        assert f"file={module_name}.py" == args
        assert re.search(rf"^class {class_name}\(BaseProcessor\):", module, re.MULTILINE)


@pytest.mark.parametrize(
    "command", ["make demo", "make test", "make e2e", "make bench", "make bench-operator", "make manifests"]
)
def test_documented_make_targets_exist(command: str) -> None:
    makefile = (README.parent / "Makefile").read_text()
    assert command in README.read_text()
    assert re.search(rf"^{command.split()[1]}:", makefile, re.MULTILINE)


def _code(cell: str) -> str:
    return cell.strip("`")


def test_every_worker_variable_is_documented_once() -> None:
    documented = [_code(row[0]) for row in table(DOCS / "configuration.md", "## Configuring the worker")]
    variables = [*WorkerSettings.model_fields, *BillingSettings.model_fields]
    assert sorted(documented) == sorted(name.upper() for name in variables)


def test_every_example_stage_variable_is_documented_once() -> None:
    documented = [_code(row[0]) for row in table(DOCS / "configuration.md", "### The example stages")]
    variables = [*RouterSettings.model_fields, *ParserSettings.model_fields, *GrouperSettings.model_fields]
    assert sorted(documented) == sorted(name.upper() for name in variables)


def test_every_tracing_variable_the_worker_reads_is_documented_once() -> None:
    documented = [_code(row[0]) for row in table(DOCS / "configuration.md", "### Traces (OTEL_*)")]
    assert len(documented) == len(set(documented)) and all(name.startswith("OTEL_") for name in documented)
    assert set(READ_VARIABLES) <= set(documented)


def _spec_fields(node: dict[str, Any], path: str = "") -> list[str]:
    found = []
    for name, prop in (node.get("properties") or {}).items():
        found.append(f"{path}{name}")
        if name != "resources":  # Kubernetes' own ResourceRequirements, explained in its row
            found += _spec_fields(prop, f"{path}{name}.")
    return found


def test_every_stage_field_is_documented_once() -> None:
    documented = [_code(row[0]) for row in table(DOCS / "configuration.md", "## PhoenixStage fields")]
    schema = custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert documented == _spec_fields(schema["properties"]["spec"])


def _value_keys(node: dict[str, Any], path: str = "") -> list[str]:
    found = []
    for name, value in node.items():
        # A map with keys of its own is a group; an empty one, a list, a scalar or Kubernetes' resources is a value.
        if isinstance(value, dict) and value and name != "resources":
            found += _value_keys(value, f"{path}{name}.")
        else:
            found.append(f"{path}{name}")
    return found


def test_every_chart_value_is_documented_once() -> None:
    documented = [_code(row[0]) for row in table(DOCS / "configuration.md", "## Helm chart values")]
    values = yaml.safe_load((README.parent / "charts" / "phoenix" / "values.yaml").read_text())
    assert documented == _value_keys(values)


def test_every_worker_metric_is_documented_with_its_type() -> None:
    rows = table(DOCS / "observability.md", "- `/metrics`: Prometheus, all labelled by `stage`:")
    documented = {_code(row[0]): row[1] for row in rows}
    defined = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            labels = [label for label in metric._labelnames if label != "stage"]
            name = metric._name + ("_total" if metric._type == "counter" else "")
            defined[name + (f"{{{','.join(labels)}}}" if labels else "")] = metric._type
        elif isinstance(metric, metrics.StageHistogram):  # the hot path's own lock-free histogram
            labels = [label for label in metric.labelnames if label != "stage"]
            defined[metric._name + (f"{{{','.join(labels)}}}" if labels else "")] = "histogram"
    assert documented == defined


ARCHITECTURE = DOCS / "architecture.md"


def test_the_architecture_picture_is_the_enforced_layers() -> None:
    """Each layer of .importlinter's layers contract stands on a line of its own in the picture, top to bottom."""
    contracts = configparser.ConfigParser()
    contracts.read(README.parent / ".importlinter")
    layers = [line.split("|") for line in contracts["importlinter:contract:layers"]["layers"].split("\n") if line]
    _, picture = marked_block("layers", ARCHITECTURE)
    lines = [set(line.split()) for line in picture.splitlines()]
    found: list[int] = []
    for layer in layers:
        names = {module.strip().removeprefix("phoenix.") for module in layer}
        line = next((number for number, words in enumerate(lines) if names <= words), None)
        assert line is not None, f"no line of the picture holds the layer {sorted(names)}"
        found.append(line)
    assert found == sorted(found), "the picture's layers are not in the contract's order"


def test_the_architecture_page_names_only_files_and_tests_that_exist() -> None:
    """Its paths and test names are the checklists' steps: a file moved or a test renamed must move them too."""
    text = ARCHITECTURE.read_text()
    paths = re.findall(r"`((?:phoenix|tests|docs|hack|manifests|charts)/[\w./-]*)`", text)
    assert paths and [path for path in paths if not (README.parent / path).exists()] == []
    defined = {
        name
        for path in (README.parent / "tests").rglob("test_*.py")
        for name in re.findall(r"def (test_\w+)", path.read_text())
    }
    named = set(re.findall(r"`(test_\w+)`", text))
    assert named and named - defined == set()


def _layout_mentions() -> tuple[set[Path], set[Path]]:
    """DEVELOPMENT.md's Layout block read as a tree: (the modules it names, the packages whose modules it lists one by
    one). An entry is the first word of a line, indented two spaces a level; a file named in the description of a
    package's line is that package's, in the description of a module's line its sibling."""
    text = (README.parent / "DEVELOPMENT.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    named: set[Path] = set()
    listed: set[Path] = set()
    stack: list[tuple[int, Path]] = []
    home: Path | None = None
    for line in block.splitlines():
        entry = line.strip().split(" ")[0].rstrip(",")
        depth = len(line) - len(line.lstrip())
        if entry and depth >= 10 and not entry.endswith((".py", "/")):
            entry = ""  # a description's continuation: its files are the line above's
        if not entry:
            if home is not None:
                for word in re.findall(r"(?<![\w/.])(\w+\.py)\b", line):
                    named.add(home / word)
            continue
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if not stack and entry != "phoenix/":
            home = None
            continue  # manifests/, docs/, ...: not the package
        parent = stack[-1][1] if stack else README.parent
        path = parent / entry.rstrip("/")
        home = path if entry.endswith("/") else parent
        if entry.endswith("/"):
            stack.append((depth, path))
        for word in re.findall(r"(?<![\w/.])(\w+\.py)\b", line):
            named.add(home / word)
            listed.add(home)
    return named, listed


def test_the_development_layout_names_every_module_it_lists_and_only_modules_that_exist() -> None:
    """A package whose modules the Layout names one by one names all of them; every module it names exists."""
    named, listed = _layout_mentions()
    assert README.parent / "phoenix" in listed  # the block was read
    missing = sorted(
        str(module.relative_to(README.parent))
        for package in listed
        for module in package.glob("*.py")
        if module.name not in ("__init__.py", "__main__.py") and module not in named
    )
    assert missing == [], "DEVELOPMENT.md's Layout does not name these modules"
    assert sorted(str(p.relative_to(README.parent)) for p in named if not p.exists()) == []


def test_the_redis_acl_users_commands_are_the_documented_ones() -> None:
    """docs/operator.md lists the commands a namespace's Redis ACL user is given: exactly acl.USER_COMMANDS."""
    from phoenix.operator.redis.acl import USER_COMMANDS

    _, documented = marked_block("redis-acl-commands", DOCS / "operator.md")
    assert documented.split() == [f"+{command}" for command in USER_COMMANDS]


def test_the_readme_is_what_a_newcomer_reads_first_and_links_every_page() -> None:
    """Under 250 lines (what it is, the two commands, one picture, where to go next): the rest lives in docs/, and
    every page there is linked from the README's table, so nothing moved out of it is out of reach."""
    text = README.read_text()
    assert len(text.splitlines()) < 250
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)", text))
    assert {f"docs/{page.name}" for page in DOCS.glob("*.md")} - linked == set()
