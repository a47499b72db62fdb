"""What an operator sees of a running worker: probes, Prometheus metrics, JSON logs and the Grafana dashboard.

One real `phoenix worker` subprocess (HEALTH_PORT on a free port) runs a processor whose dependency can be switched
off through a Redis key; the scenario drives it through every outcome and records what the worker showed at each
step. It connects as an ACL user with a password, which must never appear in its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from phoenix.keys import StageKeys
from phoenix.worker_runtime import BaseProcessor, RecordNotFoundError
from tests.fixtures.eventually import eventually
from tests.fixtures.processes import LoggedProcess, free_loopback_port

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "manifests" / "grafana" / "phoenix-dashboard.json"
GOOD = [f"ok-{i}" for i in range(1, 4)]
FAILING = [f"fail-{i}" for i in range(1, 6)]
MISSING = "gone-1"
USER = "user-7"


class FlakyDependencyProcessor(BaseProcessor):
    """Fails while the key `{service}:dependency-down` exists, like a processor whose downstream service is down.

    The key is polled in the background, so a failure is raised before process() awaits anything: messages read in
    the same batch then meet the circuit the first failures opened (circuit_open_fast_fail).
    """

    down = False

    async def initialize(self) -> None:
        self._watcher = asyncio.create_task(self._watch(f"{self.settings.service_name}:dependency-down"))

    async def cleanup(self) -> None:
        self._watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watcher

    async def _watch(self, flag: str) -> None:
        while True:
            down = bool(await self.redis.exists(flag))
            if down != self.down:
                self.down = down
                self.logger.warning("dependency_changed", down=down)
            await asyncio.sleep(0.05)

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        if data.get("missing"):
            raise RecordNotFoundError(f"record {record_id} does not exist")
        if self.down:
            raise ConnectionError("dependency is down")
        return {"seen": record_id}


@dataclass
class Probe:
    status: int
    body: str


@dataclass
class Observations:
    service: str
    password: str
    log: str
    exit_code: int | None
    probes: dict[str, Probe] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)  # scrapes by moment: "open", "final"
    metrics_content_type: str = ""

    @property
    def log_lines(self) -> list[str]:
        return self.log.splitlines()

    def events(self, name: str) -> list[dict[str, Any]]:
        return [entry for entry in map(json.loads, self.log_lines) if entry.get("event") == name]


def http_get(port: int, path: str) -> tuple[Probe, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return Probe(response.status, response.read().decode()), response.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        return Probe(err.code, err.read().decode()), err.headers["Content-Type"]
    except OSError:
        return Probe(0, ""), ""


def sample_value(metrics: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


@contextlib.contextmanager
def acl_user(client: redis.Redis, base_url: str) -> Iterator[tuple[str, str]]:
    """A Redis user with a random password; yields (url with credentials, password)."""
    user, password = f"obs-{secrets.token_hex(4)}", f"pw-{secrets.token_hex(16)}"
    client.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    parts = urlsplit(base_url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port}"
    try:
        yield urlunsplit(parts._replace(netloc=netloc)), password
    finally:
        client.execute_command("ACL", "DELUSER", user)


@pytest.fixture(scope="module")
def observed(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observations]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    service = f"obs-{secrets.token_hex(4)}"
    stream, output, dlq = StageKeys.for_stage(service).input, f"{service}:results", StageKeys.for_stage(service).dlq
    port = free_loopback_port()
    with acl_user(client, redis_url) as (url, password):
        env = dict(
            os.environ,
            SERVICE_NAME=service,
            PROCESSOR=f"{__name__}:FlakyDependencyProcessor",
            REDIS_URL=url,
            OUTPUT_QUEUE=output,
            HEALTH_PORT=str(port),
            CONCURRENCY="8",
            CIRCUIT_FAILURE_THRESHOLD="2",
            CIRCUIT_RESET_TIMEOUT="1",
            RETRY_BASE_SECONDS="0.2",
            RETRY_MAX_SECONDS="1",
            RETRY_POLL_INTERVAL="0.1",
            LOG_FORMAT="json",
        )
        log_path = tmp_path_factory.mktemp("observability") / "worker.log"
        worker = LoggedProcess.start("worker", [sys.executable, "-m", "phoenix", "worker"], log_path, env)
        seen = Observations(service, password, "", None)
        flag = f"{service}:dependency-down"

        def logged(event: str, **fields: Any) -> bool:
            return any(
                f'"event":"{event}"' in line and all(json.loads(line).get(k) == v for k, v in fields.items())
                for line in worker.log_tail(100_000).splitlines()
            )

        def enqueue(record_id: str, pipe: redis.client.Pipeline | redis.Redis = client, **data: Any) -> None:
            pipe.xadd(stream, {"record_id": record_id, "user_id": USER, "data": json.dumps(data)})

        def scrape() -> str:
            probe, content_type = http_get(port, "/metrics")
            seen.metrics_content_type = content_type
            return probe.body

        def outcome(name: str) -> float | None:
            return sample_value(scrape(), "phoenix_messages_total", stage=service, outcome=name)

        try:
            seen.probes["healthz"] = eventually(
                lambda: p if (p := http_get(port, "/healthz")[0]).status == 200 else None, "the health endpoint"
            )
            seen.probes["readyz"] = http_get(port, "/readyz")[0]

            for record_id in GOOD:
                enqueue(record_id)
            eventually(lambda: client.xlen(output) == len(GOOD), "the good records to be forwarded")
            enqueue(GOOD[0])  # the same record again: skipped by its idempotency marker
            eventually(lambda: outcome("skipped_duplicate") == 1, "the duplicate to be skipped")
            enqueue(MISSING, missing=True)
            eventually(lambda: client.xlen(dlq) == 1, "the missing record to be dead-lettered")

            client.set(flag, "1")
            eventually(lambda: logged("dependency_changed", down=True), "the processor to see its dependency down")
            # One transaction, so the worker reads all of them in one batch.
            with client.pipeline(transaction=True) as pipe:
                for record_id in FAILING:
                    enqueue(record_id, pipe)
                pipe.execute()
            seen.probes["readyz_open"] = eventually(
                lambda: p if (p := http_get(port, "/readyz")[0]).status == 503 else None,
                "readyz to report the open circuit",
            )
            seen.metrics["open"] = eventually(
                lambda: m if sample_value(m := scrape(), "phoenix_circuit_state", stage=service) == 2 else None,
                "the circuit gauge to show open",
            )
            eventually(lambda: logged("circuit_open_fast_fail"), "a fast failure while open")

            client.delete(flag)
            eventually(
                lambda: client.xlen(output) == len(GOOD) + len(FAILING), "the failed records to be processed", 60
            )
            seen.probes["readyz_closed"] = eventually(
                lambda: p if (p := http_get(port, "/readyz")[0]).status == 200 else None, "readyz after recovery"
            )
            seen.metrics["final"] = scrape()
        finally:
            worker.stop(grace_seconds=30)
            seen.exit_code = worker.popen.returncode
            seen.log = log_path.read_text()
            client.delete(stream, output, dlq, flag, StageKeys.for_stage(service).retry)
            client.close()
    yield seen


@pytest.mark.subprocess
def test_probes(observed: Observations) -> None:
    assert observed.probes["healthz"] == Probe(200, "ok\n")
    assert observed.probes["readyz"] == Probe(200, "ok\n")
    assert observed.probes["readyz_open"] == Probe(503, "circuit open\n")
    assert observed.probes["readyz_closed"] == Probe(200, "ok\n")
    assert observed.metrics_content_type.startswith("text/plain")


@pytest.mark.timeout(60)
def test_outcome_counters(observed: Observations) -> None:
    final, stage = observed.metrics["final"], observed.service

    def count(outcome: str) -> float:
        return sample_value(final, "phoenix_messages_total", stage=stage, outcome=outcome) or 0.0

    assert count("processed") == len(GOOD) + len(FAILING)
    assert count("skipped_duplicate") == 1
    assert count("dead_lettered") == 1
    assert count("retried") >= 2  # the circuit's threshold
    assert count("deferred") >= 1  # fast failures while open
    assert sample_value(final, "phoenix_circuit_state", stage=stage) == 0
    assert sample_value(observed.metrics["open"], "phoenix_circuit_state", stage=stage) == 2


def test_in_flight_gauge_is_zero_once_everything_settled(observed: Observations) -> None:
    assert sample_value(observed.metrics["final"], "phoenix_in_flight_messages", stage=observed.service) == 0


@pytest.mark.parametrize("histogram", ["phoenix_processing_duration_seconds", "phoenix_queue_wait_seconds"])
def test_histograms_have_observations(observed: Observations, histogram: str) -> None:
    final, stage = observed.metrics["final"], observed.service
    observations = sample_value(final, f"{histogram}_count", stage=stage)
    # Every processed message was timed; failed and dead-lettered attempts are timed too.
    assert observations is not None and observations >= len(GOOD) + len(FAILING)
    assert sample_value(final, f"{histogram}_bucket", stage=stage, le="+Inf") == observations
    assert (sample_value(final, f"{histogram}_sum", stage=stage) or 0.0) > 0


def test_logs_are_json_lines_with_the_documented_fields(observed: Observations) -> None:
    assert observed.exit_code == 0, observed.log[-3000:]
    entries = [json.loads(line) for line in observed.log_lines]  # every line is one JSON object
    for entry in entries:
        assert {"timestamp", "level", "event", "service"} <= entry.keys(), entry
        assert entry["service"] == observed.service
        datetime.fromisoformat(entry["timestamp"])

    completes = observed.events("processing_complete")
    for entry in completes:
        assert {"record_id", "user_id", "message_id", "duration_seconds"} <= entry.keys(), entry
        assert entry["user_id"] == USER and entry["level"] == "info" and entry["duration_seconds"] >= 0
    assert sorted(e["record_id"] for e in completes) == sorted(GOOD + FAILING)

    (dead,) = observed.events("message_dead_lettered")
    assert (dead["record_id"], dead["error_type"], dead["level"]) == (MISSING, "RecordNotFoundError", "warning")
    assert observed.events("circuit_open_fast_fail")[0]["record_id"] in FAILING
    assert {e["record_id"] for e in observed.events("processing_failed_will_retry")} <= set(FAILING)
    assert next(e["state"] for e in observed.events("circuit_state_changed")) == "OPEN"


def test_the_redis_password_never_appears(observed: Observations) -> None:
    assert observed.password not in observed.log
    assert all(observed.password not in text for text in observed.metrics.values())
    (started,) = observed.events("worker_started")
    assert ":***@" in started["redis"]


# -- the Grafana dashboard ------------------------------------------------------------------------------------------

_PROMQL_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, labels or durations."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # string literals
    stripped = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", stripped)  # label matchers, range selectors
    stripped = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", stripped)
    names: set[str] = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)\s*(\()?", stripped):
        name, is_call = match.group(1), match.group(2)
        if not is_call and name.lower() not in _PROMQL_KEYWORDS:
            names.add(name)
    return names


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            label_values = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
            assert label_values, query
            queries.append(label_values.group(1))
    return queries


def exported_series_names(metrics: str) -> set[str]:
    """Series names in a scrape, from each family's TYPE (a labelled family with no children yet has no samples)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "gauge": ("",),
        "summary": ("", "_count", "_sum", "_created"),
    }
    names: set[str] = set()
    for family in text_string_to_metric_families(metrics):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def test_promql_metric_names_parser() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le) (rate(phoenix_queue_wait_seconds_bucket{stage=~"$stage"}'
        '[$__rate_interval]))) / on (stage) group_left max by (stage) (up{job="x"}) offset 5m'
    )
    assert promql_metric_names(expr) == {"phoenix_queue_wait_seconds_bucket", "up"}


def test_dashboard_queries_name_only_exported_metrics(observed: Observations) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    exported = exported_series_names(observed.metrics["final"])
    used = set()
    for query in queries:
        names = promql_metric_names(query)
        assert names, f"no metric in {query!r}"
        assert names <= exported, f"{query!r} uses {sorted(names - exported)}, not exported by the worker"
        used |= names
    families = {name for name in exported if name.startswith("phoenix_")}
    # Every metric family the worker exports is on the dashboard.
    assert {re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in families} == {
        re.sub(r"_(total|bucket|count|sum|created)$", "", n) for n in used
    }
    panels = {panel["title"] for panel in dashboard["panels"]}
    assert {
        "Throughput by outcome",
        "Processing duration",
        "Queue wait",
        "In flight",
        "Circuit state",
        "Reclaimed",
        "Lock contention",
        "Billing key cache hit ratio",
        "Trimmed pending",
    } <= panels
