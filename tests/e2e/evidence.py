"""What a run of the e2e suite leaves behind: one directory per run with pytest's junit XML (hack/e2e.sh), and for
each failed test the cluster as it was at the failure, so that a failure seen once can be read afterwards.

A failed test's directory (`<run>/failures/<test>/`) holds: the pods of every namespace, Events, the stages
(`kubectl get phx -o yaml`), ScaledObjects and HPAs, the stages' queue state (`phoenix status --json` through a
port-forward to the pipeline's Valkey), and the logs of the workers, the operator and KEDA (current and previous
containers). `summary.txt` in the run directory lists the failures with their first line; the suite prints it at
the end (tests/e2e/conftest.py).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.kubectl import OPERATOR_NAMESPACE, REPO_ROOT, kubectl_binary, kubectl_json, port_forward
from tests.e2e.pipeline import NAMESPACE as PIPELINE_NAMESPACE

# The namespaces the suite works in besides the pipeline's.
KEDA_NAMESPACE = "keda"
_STARTED = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
# Each command is bounded: collecting evidence must never hang a run that already failed.
_COMMAND_TIMEOUT = 60


def run_path() -> Path:
    """PHOENIX_E2E_REPORT_DIR (hack/e2e.sh sets it per run), else .cache/e2e/runs/<this session's start>."""
    return Path(os.environ.get("PHOENIX_E2E_REPORT_DIR", REPO_ROOT / ".cache" / "e2e" / "runs" / _STARTED))


def run_dir() -> Path:
    """run_path(), created: only when something is written to it."""
    directory = run_path()
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def failure_dir(nodeid: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.removeprefix("tests/e2e/"))
    return run_dir() / "failures" / name


def _output(argv: list[str], env: dict[str, str] | None = None) -> str:
    """A command's output, or what went wrong with it: one missing view must not stop the rest of the collection."""
    try:
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=_COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"(timed out after {_COMMAND_TIMEOUT} s)\n"
    except OSError as exc:  # e.g. no kubectl
        return f"({argv[0]}: {exc})\n"
    return result.stdout + (f"(exited {result.returncode}: {result.stderr.strip()})\n" if result.returncode else "")


def _kubectl_text(*args: str) -> str:
    return _output([kubectl_binary(), *args])


def _queue_state() -> str:
    """`phoenix status --json` of every stage in the pipeline's Valkey; the password goes by environment only."""
    try:
        secret = kubectl_json("get", "secret", "-n", PIPELINE_NAMESPACE, "phoenix-redis")
        password = base64.b64decode(secret["data"]["password"]).decode()
        with port_forward(PIPELINE_NAMESPACE, "service/redis", 6379) as port:
            status = "import sys; from phoenix.cli import main; sys.exit(main())"
            url = f"redis://:{password}@127.0.0.1:{port}/0"
            return _output([sys.executable, "-c", status, "status", "--json"], env={**os.environ, "REDIS_URL": url})
    except Exception as exc:  # whatever it is, it belongs to the evidence rather than being a second failure
        return f"(queue state unavailable: {type(exc).__name__}: {exc})\n"


def _logs(namespace: str, selector: str) -> str:
    parts = []
    for previous in (False, True):
        args = ["logs", "-n", namespace, "-l", selector, "--all-containers", "--prefix", "--tail=-1"]
        args += ["--timestamps", "--max-log-requests=20", *(["--previous"] if previous else [])]
        parts.append(f"===== kubectl {' '.join(args)}\n{_kubectl_text(*args)}")
    return "\n".join(parts)


def collect(directory: Path) -> None:
    """The cluster's state now, one file per view, into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "pods.txt": _kubectl_text("get", "pods", "-A", "-o", "wide"),
        "events.txt": _kubectl_text("get", "events", "-A", "--sort-by=.lastTimestamp"),
        "describe-pods.txt": _kubectl_text("describe", "pods", "-n", PIPELINE_NAMESPACE),
        "stages.yaml": _kubectl_text("get", "phoenixstage", "-A", "-o", "yaml"),
        "stages.txt": _kubectl_text("get", "phoenixstage", "-A", "-o", "wide"),
        "autoscaling.yaml": _kubectl_text("get", "scaledobject,hpa,deployment", "-n", PIPELINE_NAMESPACE, "-o", "yaml"),
        "queue-state.json": _queue_state(),
        "logs-workers.txt": _logs(PIPELINE_NAMESPACE, "phoenix.io/stage"),
        "logs-operator.txt": _logs(OPERATOR_NAMESPACE, "app.kubernetes.io/name=phoenix-operator"),
        "logs-keda.txt": _logs(KEDA_NAMESPACE, "app.kubernetes.io/name"),
    }
    for name, text in files.items():
        (directory / name).write_text(text)


# The evidence already collected, by error: a session fixture's error fails every later test the same way.
_collected: dict[str, Path] = {}


def record_failure(nodeid: str, when: str, message: str) -> Path:
    """Collects a failed test's evidence (once per distinct failure) and adds it to the run's summary; returns
    where the evidence is."""
    lines = message.splitlines()
    # pytest marks the exception's own lines with "E "; the last line names the exception otherwise.
    reason = next((line[1:].strip() for line in lines if line.startswith("E ")), lines[-1] if lines else "")
    directory = _collected.get(reason)
    if directory is None:
        directory = _collected[reason] = failure_dir(nodeid)
        collect(directory)
        (directory / "failure.txt").write_text(message)
    with (run_dir() / "summary.txt").open("a") as summary:
        summary.write(f"FAILED {nodeid} ({when}): {reason[:300]}\n    evidence: {directory}\n")
    return directory
