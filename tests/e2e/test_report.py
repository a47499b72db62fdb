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

from tests.e2e.evidence import OPERATOR_NAMESPACE
from tests.e2e.kube import pods, port_forward
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

    def log_of(namespace: str, selector: str) -> list[str]:
        found = []
        for pod in pods(namespace, selector):
            for container in pod["spec"]["containers"]:
                found += files[f"logs/{namespace}/{pod['metadata']['name']}/{container['name']}.log"].splitlines()
        return found

    for stage in STAGES:
        lines = log_of(NAMESPACE, f"phoenix.io/stage={stage}")
        assert 0 < len(lines) <= 50 * len(pods(NAMESPACE, f"phoenix.io/stage={stage}")), stage
        # Each line as the API gives it with timestamps: "<RFC 3339 time> <the worker's JSON line>".
        assert any(json_line(line).get("service") == stage for line in lines), lines[-3:]
    assert log_of(OPERATOR_NAMESPACE, "app.kubernetes.io/name=phoenix-operator")
    assert {row["stage"] for row in json.loads(files["redis/queue.json"])} == set(STAGES)
