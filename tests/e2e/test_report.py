"""`kubectl phoenix report` on the real cluster, where a kubelet serves the pods' logs: the archive holds the last
lines of the operator's and of every stage's workers' logs (tests/test_report.py checks the rest, and the redaction,
against the bare API server, which has no logs to give)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phoenix.cli.report import REDACTED
from tests.e2e.evidence import OPERATOR_NAMESPACE
from tests.e2e.kubectl import port_forward
from tests.e2e.pipeline import NAMESPACE, Pipeline
from tests.test_report import members

pytestmark = pytest.mark.e2e
STAGES = ("router", "parser", "grouper")


def json_line(line: str) -> dict[str, object]:
    try:
        found = json.loads(line.partition(" ")[2])
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def test_report_has_the_pods_logs(pipeline: Pipeline, tmp_path: Path) -> None:
    archive = tmp_path / "report.tar.gz"
    # The stages' Redis URL names the in-cluster Service: the report reaches it through a port-forward.
    with port_forward(NAMESPACE, "service/redis", 6379) as port:
        plugin = str(Path(sys.executable).parent / "kubectl-phoenix")
        options = ["-n", NAMESPACE, "--tail", "50", "--operator-namespace", OPERATOR_NAMESPACE]
        done = subprocess.run(
            [plugin, "report", *options, "--redis-host", f"127.0.0.1:{port}", "-o", str(archive)],
            env=os.environ,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    files = members(archive)
    assert json.loads(files["summary.json"])["errors"] == [], done.stdout

    def log_lines(namespace: str, role: str) -> dict[str, list[str]]:
        """Each pod the report listed in pods/<namespace>/<role>.json: its containers' log lines."""
        return {
            pod["name"]: [
                line
                for container in pod["containers"]
                for line in files[f"logs/{namespace}/{pod['name']}/{container['name']}.log"].splitlines()
            ]
            for pod in json.loads(files[f"pods/{namespace}/{role}.json"])
        }

    # The stages that have workers now (the parser and grouper scale to zero when idle; the router keeps one). A pod
    # of another test's stage may still be stopping: the report lists it too, and its log is its own stage's.
    workers = log_lines(NAMESPACE, "workers")
    assert any(name.startswith("router-") for name in workers), list(workers)
    for name, lines in workers.items():
        assert 0 < len(lines) <= 50, name
        # Each line as the API gives it with timestamps: "<RFC 3339 time> <the worker's JSON line>"; a Deployment's
        # pod is named "<stage>-<replica set hash>-<suffix>".
        stage = name.rsplit("-", 2)[0]
        assert any(json_line(line).get("service") == stage for line in lines), lines[-3:]
        # Redacted by default: a line about a record names it by message_id, never by its own ids.
        about_records = [json_line(line) for line in lines if "record_id" in json_line(line)]
        for fields in about_records:
            assert fields["record_id"] == fields.get("user_id", REDACTED) == REDACTED, fields
            assert fields.get("message_id") != REDACTED, fields
    operator = log_lines(OPERATOR_NAMESPACE, "operator")
    assert operator and all(operator.values()), list(operator)
    assert {row["stage"] for row in json.loads(files["redis/queue.json"])} == set(STAGES)
