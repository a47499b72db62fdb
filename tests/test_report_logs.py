"""The workers' and the operator's log lines in `phoenix report`: a real worker's log, written about records whose
every field value is a unique marker, keeps none of them once redacted as the report does (redact_worker_log), and
keeps what joins a line to its record and its trace (message_id, trace_id) and what a person reads first (event,
level, error_type); a real operator's debug log, which quotes a stage's whole body, keeps no literal value of its
spec once redacted (redact_operator_log), and keeps the operator's own sentences.

tests/test_report.py runs the whole report against the API server, which has no kubelet and so no log to give; this
is where its log redaction is proven on the lines a worker really writes."""

from __future__ import annotations

import ast
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from phoenix.cli.report import LOG_FIELDS_KEPT, REDACTED, redact_operator_log, redact_worker_log
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually, wait_until
from tests.fixtures.operator_process import final_stage, kubectl_apply, stage_condition, start_operator, wait_healthy
from tests.fixtures.otlp_receiver import otlp_receiver
from tests.fixtures.processes import free_loopback_port
from tests.fixtures.records import committed
from tests.fixtures.replies import stream_entries
from tests.fixtures.sample_stage import DLQ, IN, OUT
from tests.fixtures.workers import WorkerPool

STAMP = "2026-12-02T08:00:00.123456789Z"  # as the API gives each line with timestamps=true


def marker(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex}"


def as_the_api_gives(log: str) -> str:
    return "".join(f"{STAMP} {line}\n" for line in log.splitlines())


@pytest.mark.timeout(90)
async def test_a_workers_log_keeps_no_record_value_once_redacted(redis: aioredis.Redis, workers: WorkerPool) -> None:
    values: list[str] = []
    ids = {}
    for name, action in (("ok", None), ("bad", "invalid")):
        record_id, user_id, note = marker(f"record-{name}"), marker("user"), marker("note")
        data = {"note": note, **({"action": action} if action else {})}
        await redis.xadd(IN, {"record_id": record_id, "user_id": user_id, "data": json.dumps(data)})
        values += [record_id, user_id, note]
        ids[name] = record_id
    async with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200", "LOG_FORMAT": "json"}
        worker = workers.start("s", OUTPUT_QUEUE=OUT, LOG_LEVEL="info", **env)
        await wait_until(lambda: committed(redis, "s", ids["ok"]), "the good record committed")
        await wait_until(lambda: worker.logged("message_dead_lettered"), "the bad record dead-lettered")
        await wait_until(lambda: stream_entries(redis, DLQ), "the dead letter written")
        worker.stop()
    log = worker.process.log_path.read_text()
    # The worker's own log has them all: the ids on every line about a record, the bad one's in its error text.
    assert all(value in log for value in values[:2] + values[3:5])
    (failure,) = [line for line in worker.events() if line["event"] == "message_dead_lettered"]
    assert ids["bad"] in failure["error"]

    redacted = redact_worker_log(as_the_api_gives(log))
    for value in values:
        assert value not in redacted, f"{value} is in the redacted log"
    lines = [json.loads(line.partition(" ")[2]) for line in redacted.splitlines()]
    assert len(lines) == len(log.splitlines()) and all(line.startswith(STAMP) for line in redacted.splitlines())
    (dead,) = [line for line in lines if line["event"] == "message_dead_lettered"]
    assert dead["error"] == dead["record_id"] == dead["user_id"] == REDACTED
    assert dead["error_type"] == "InvalidInputError" and dead["level"] == "warning"
    assert dead["message_id"] == failure["message_id"] and dead["trace_id"] == failure["trace_id"]
    (done,) = [line for line in lines if line["event"] == "processing_complete"]
    assert done["record_id"] == REDACTED and len(done["trace_id"]) == 32 and done["service"] == "s"
    # A line about no record keeps its error: what the runtime says about Redis, a background job, the processor.
    started = [line for line in lines if line["event"] == "worker_started"]
    assert started and all(REDACTED not in line.values() for line in started), started


@pytest.mark.timeout(120)
def test_an_operators_log_keeps_no_literal_value_of_a_spec_once_redacted(
    kube_cluster: ControlPlane, operator_kubeconfig: Path, kube_namespace: str, redis_url: str
) -> None:
    """With --verbose, kopf writes each stage's whole body and diff into its debug lines: spec.env's literal values
    (which the report redacts everywhere else) among them, and whatever a traceback quotes."""
    value = marker("literal-value")
    documents = final_stage(redis_url, kube_namespace, env=[{"name": "VENDOR_REGION", "value": value}])
    liveness = f"http://127.0.0.1:{free_loopback_port()}/healthz"
    args = [f"--liveness={liveness}", "--all-namespaces", "--log-format=json", "--verbose"]
    process = start_operator(kube_cluster, operator_kubeconfig, args, log_name="operator-report-logs")
    try:
        wait_healthy(process, liveness)
        kubectl_apply(kube_cluster, documents)
        eventually(lambda: stage_condition(kube_cluster, kube_namespace, "router").get("status") == "True", "Ready")
    finally:
        process.stop(15)
    log = process.log_path.read_text()
    assert value in log  # the debug lines quote the body

    redacted = redact_operator_log(as_the_api_gives(log))
    assert value not in redacted
    lines = [json.loads(line.partition(" ")[2]) for line in redacted.splitlines() if "not a JSON line" not in line]
    done = [line for line in lines if line.get("message") == "Handler 'reconcile' succeeded."]
    assert done and done[0]["object"]["name"] == "router" and done[0]["severity"] == "info"
    assert all(line["message"] == REDACTED for line in lines if line.get("severity") == "debug")


def test_a_processors_fields_and_lines_that_are_not_json_are_redacted() -> None:
    secret_field, trace_text = marker("field"), marker("traceback")
    log = "\n".join(
        [
            json.dumps({"event": "parsed", "level": "info", "message_id": "1-0", "title": secret_field, "n": 3}),
            f"Traceback (most recent call last): ValueError: {trace_text}",
            json.dumps({"event": "redis_unavailable", "level": "warning", "error": "Connection refused"}),
            "",
            "[1, 2]",
        ]
    )
    redacted = redact_worker_log(as_the_api_gives(log)).splitlines()
    assert secret_field not in "".join(redacted) and trace_text not in "".join(redacted)
    parsed, traceback, unavailable, *rest = redacted
    assert json.loads(parsed.partition(" ")[2]) == {
        "event": "parsed",
        "level": "info",
        "message_id": "1-0",
        "title": REDACTED,
        "n": REDACTED,
    }
    assert traceback == f"{STAMP} {REDACTED} (not a JSON line)"
    assert json.loads(unavailable.partition(" ")[2])["error"] == "Connection refused"
    assert rest == [f"{STAMP} {REDACTED} (not a JSON line)"] * 2  # the empty line, then a JSON array


class _Listed:
    def __init__(self, items: list[object]) -> None:
        self.items = items


class _FakeCore:
    """The CoreV1Api calls collect_report makes, answering one running worker pod and one operator pod, each with a
    log line about a record: what a kubelet would give, which tests/test_report.py's bare API server cannot."""

    LINE = json.dumps({"event": "processing_complete", "level": "info", "record_id": "r-secret", "message_id": "1-0"})

    def __init__(self, _api: object) -> None:
        pass

    def list_namespaced_pod(self, ns: str, label_selector: str) -> _Listed:
        role = "worker" if "operator" not in label_selector else "operator"
        pod = {"metadata": {"name": f"{role}-0"}, "spec": {"nodeName": "n1", "containers": [{"name": role}]}}
        return _Listed([pod])

    def read_namespaced_pod_log(self, name: str, ns: str, **_options: object) -> str:
        return f"{STAMP} {self.LINE}\n"

    def list_namespaced_event(self, ns: str) -> _Listed:
        return _Listed([])


class _FakeApps:
    def __init__(self, _api: object) -> None:
        pass

    def list_namespaced_deployment(self, ns: str, label_selector: str) -> _Listed:
        return _Listed([])


class _FakeVersion:
    def __init__(self, _api: object) -> None:
        pass

    def get_code(self) -> object:
        return type("Version", (), {"git_version": "v1.0.0"})()


class _FakeApiClient:
    def sanitize_for_serialization(self, value: object) -> object:
        return value


@pytest.mark.parametrize("redact", [True, False])
def test_the_report_redacts_the_workers_logs_by_default(monkeypatch: pytest.MonkeyPatch, redact: bool) -> None:
    from phoenix.cli import report

    monkeypatch.setattr(report.client, "CoreV1Api", _FakeCore)
    monkeypatch.setattr(report.client, "AppsV1Api", _FakeApps)
    monkeypatch.setattr(report.client, "VersionApi", _FakeVersion)
    options = report.ReportOptions("ns", "phoenix-system", redis=False)
    if not redact:
        options.redact_logs = False  # --unredacted-logs
    api: Any = _FakeApiClient()
    bundle = report.collect_report(api, [], options, lambda _stage: NotImplemented)
    assert bundle.errors == []
    worker_log = bundle.files["logs/ns/worker-0/worker.log"]
    assert ("r-secret" in worker_log) is not redact
    # The operator's lines too, by its own fields (which a worker's line has none of).
    operator_log = bundle.files["logs/phoenix-system/operator-0/operator.log"]
    assert ("r-secret" in operator_log) is not redact


# The worker runtime's log fields the report redacts: a record's ids and error text, and the billing cache's key
# (a user's); adopted_earlier and dropped are harmless but not worth an exception.
REDACTED_RUNTIME_FIELDS = {"record_id", "user_id", "error", "cache_key", "adopted_earlier", "dropped"}


def test_every_field_the_runtime_logs_is_kept_or_redacted_on_purpose() -> None:
    """A field a new log call adds is decided here, not left to the allowlist's default."""
    runtime = Path(__file__).resolve().parents[1] / "phoenix" / "worker_runtime"
    logged = {"duration_seconds", "message_id", "record_id", "user_id", "trace_id", "span_id"}  # processing_complete
    for source in runtime.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            levels = ("debug", "info", "warning", "error", "exception", "critical")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in levels:
                logged |= {keyword.arg for keyword in node.keywords if keyword.arg}
    assert logged - LOG_FIELDS_KEPT - REDACTED_RUNTIME_FIELDS == set()
    assert not LOG_FIELDS_KEPT & REDACTED_RUNTIME_FIELDS
