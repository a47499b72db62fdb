"""`python -m phoenix.demo` end to end: real worker processes, an embedded or the session Valkey, the sample PDFs."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import redis

from phoenix.keys import DEFAULT_NAMESPACE
from phoenix.stages.data_keys import grouped_key

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("router", "parser", "grouper")
SAMPLE_COUNT = 5  # phoenix.stages.samples writes five reports
COPIES = 2


def demo_argv(work_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "phoenix.demo", "--work-dir", str(work_dir), "--copies", str(COPIES), *extra]


def run_demo(work_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    # stdout is a pipe, so the demo prints snapshots instead of redrawing.
    return subprocess.run(demo_argv(work_dir, *extra), cwd=ROOT, capture_output=True, text=True, timeout=300)


def columns(lines: Sequence[str]) -> list[dict[str, str]]:
    """Rows of a left-aligned text table, cut at the header's column starts (cells may be empty or spaced)."""
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+(?: \S+)*", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return [
        {name: line[a:b].strip() for name, a, b in zip(names, starts, [*starts[1:], None], strict=True)}
        for line in lines[1:]
    ]


def final_queue_table(stdout: str) -> dict[str, dict[str, str]]:
    block = stdout.split("(final)\n", 1)[1].split("\n\n", 1)[0]
    return {row["STAGE"]: row for row in columns(block.splitlines())}


def biomarker_table(stdout: str) -> list[dict[str, str]]:
    block = stdout.split("\nBIOMARKER", 1)[1].split("\n\n", 1)[0]
    return columns(("BIOMARKER" + block).splitlines())


def workers_using(url: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "worker" in (proc.info["cmdline"] or []) and proc.environ().get("REDIS_URL") == url:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def accepts_connections(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.timeout(90)
@pytest.mark.subprocess
def test_demo_drains_the_pipeline_and_prints_grouped_biomarkers(tmp_path: Path) -> None:
    result = run_demo(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout  # not a terminal: no cursor movement

    table = final_queue_table(result.stdout)
    assert list(table) == list(STAGES)
    for stage in STAGES:
        row = table[stage]
        assert (row["BACKLOG"], row["IN-FLIGHT"], row["DLQ"]) == ("0", "0", "0"), row
        assert row["DONE"] == str(SAMPLE_COUNT * COPIES), row
    assert "Grouped biomarkers of record" in result.stdout and "(02-diabetes-follow-up.pdf" in result.stdout

    rows = biomarker_table(result.stdout)
    groups = [row["BIOMARKER"] for row in rows if row["BIOMARKER"]]
    assert groups == ["HbA1c", "Fasting glucose", "Total cholesterol", "LDL-C", "HDL-C", "Triglycerides", "Creatinine"]
    measured = [(r["REPORTED AS"], r["VALUE"], r["AS CANONICAL"], r["FLAG"]) for r in rows]
    assert ("Glycated hemoglobin", "57 mmol/mol", "7.37 %", "H") in measured
    assert ("LDL-C", "3.9 mmol/L", "150.81 mg/dL", "H") in measured
    assert ("Creatinine", "97 umol/L", "1.1 mg/dL", "H") in measured
    assert ("HDL Cholesterol", "52 mg/dL", "52 mg/dL", "normal") in measured

    # Everything it started is gone: the workers, and the embedded Valkey.
    started = re.search(r"Started embedded Valkey at (\S+)", result.stdout)
    assert started, result.stdout
    url = started.group(1)
    assert workers_using(url) == []
    assert not accepts_connections(url)
    for stage in STAGES:
        events = [json.loads(line)["event"] for line in (tmp_path / "logs" / f"{stage}.log").read_text().splitlines()]
        assert events.count("processing_complete") == SAMPLE_COUNT * COPIES
        assert events[-1] == "worker_exit"


@pytest.mark.timeout(120)
@pytest.mark.subprocess
def test_demo_runs_against_your_own_redis(tmp_path: Path, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    result = run_demo(tmp_path, "--redis-url", redis_url)
    assert result.returncode == 0, result.stderr
    assert "Using Redis at" in result.stdout and "embedded" not in result.stdout
    grouped = client.keys(grouped_key(DEFAULT_NAMESPACE, "demo-*"))
    assert len(grouped) == SAMPLE_COUNT * COPIES  # the results stay in your Redis
    # Every record reached the grouper once (its input is trimmed as it is acknowledged: count what was read).
    [group] = client.xinfo_groups("phoenix:{default}:grouper:input")
    assert (group["entries-read"], group["lag"], group["pending"]) == (SAMPLE_COUNT * COPIES, 0, 0)
    assert workers_using(redis_url) == []
    client.flushdb()
    client.close()


@pytest.mark.timeout(150)
@pytest.mark.subprocess
def test_interrupt_stops_workers_and_valkey(tmp_path: Path) -> None:
    argv = demo_argv(tmp_path)
    # Enough work to still be running when interrupted, on a loaded machine too (400 copies once finished first).
    argv[argv.index("--copies") + 1] = "2000"
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    url, seen = "", []
    for line in proc.stdout:
        seen.append(line)
        if match := re.search(r"Started embedded Valkey at (\S+)", line):
            url = match.group(1)
        if line.startswith("router") and line.split()[3] != "0":  # the router has finished some records
            break
    proc.send_signal(signal.SIGINT)
    out, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen[-8:]) + out[-2000:] + stderr[-2000:]
    assert "Interrupted: workers stopped." in stderr
    assert url and workers_using(url) == []
    assert not accepts_connections(url)
