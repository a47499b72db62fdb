"""manifests/monitoring/: every alert names only metrics Phoenix exports (the operator's, scraped live from a running
operator, and the workers'), and links a runbook section that exists in docs/operations.md."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import redis as sync_redis
import yaml
from prometheus_client.metrics import MetricWrapperBase

from phoenix.keys import StageKeys
from phoenix.worker_runtime import metrics as worker_metrics
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.operator_process import get_stage, kubectl_apply, sample_documents, serving_operator

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "manifests" / "monitoring"
OPERATIONS = REPO / "docs" / "operations.md"
# The series a metric of each type exposes, by suffix.
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count", "_created")}


def alert_rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]


def metric_names(node: Any) -> Iterator[str]:
    """The metric names a PromQL expression selects."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node.name or ""
        return
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None:
            yield from metric_names(child)
    for argument in getattr(node, "args", None) or ():
        yield from metric_names(argument)


def worker_series() -> set[str]:
    """Every series name the worker runtime's metrics expose."""
    names = set()
    for metric in vars(worker_metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for family in metric.describe():
                names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


def github_anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


def test_metric_names_are_read_from_nested_expressions() -> None:
    expr = promql_parser.parse(
        '(sum by (a) (rate(x_total{b="c"}[5m])) or vector(0)) > on(a) max(y) - max_over_time((-z)[1m:])'
    )
    assert set(metric_names(expr)) == {"x_total", "y", "z"}


def test_the_kustomization_lists_every_monitoring_manifest() -> None:
    listed = set(yaml.safe_load((MONITORING / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in MONITORING.glob("*.yaml") if p.name != "kustomization.yaml"}


def test_every_alert_links_a_runbook_section_of_the_operations_doc() -> None:
    headings = {
        github_anchor(line.lstrip("#").strip()) for line in OPERATIONS.read_text().splitlines() if line.startswith("#")
    }
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path.endswith("/docs/operations.md"), url
        assert anchor in headings, f"{rule['alert']}: no section #{anchor} in docs/operations.md"
        assert rule["labels"]["severity"] in {"warning", "critical"}


def test_the_alerts_cover_dlq_age_readiness_and_circuit() -> None:
    used = {name for rule in alert_rules() for name in metric_names(promql_parser.parse(rule["expr"]))}
    assert {
        "phoenix_operator_stage_dlq_length",
        "phoenix_operator_stage_oldest_unfinished_seconds",
        "phoenix_operator_stage_ready",
        "phoenix_circuit_state",
    } <= used


@pytest.mark.timeout(150)
@pytest.mark.kube
def test_every_alert_names_only_exported_metrics(
    kube_cluster: ControlPlane, operator_kubeconfig: Path, kube_namespace: str, redis_url: str
) -> None:
    """Scrape a live operator serving a stage with a backlog and a pending entry, so that every per-stage gauge has
    a series; the alerts may name those and the workers' metrics, nothing else."""
    url = f"{redis_url.rsplit('/', 1)[0]}/11"
    secret, stage = sample_documents(url, kube_namespace)[:2]
    stage["metadata"]["name"] = "metered"
    with (
        sync_redis.Redis.from_url(url, decode_responses=True) as connection,
        serving_operator(
            kube_cluster, operator_kubeconfig, ["--all-namespaces"], log_name="operator-metrics"
        ) as operator,
    ):
        connection.flushdb()
        kubectl_apply(kube_cluster, [secret, stage])
        eventually(
            lambda: ((get_stage(kube_cluster, kube_namespace, "metered") or {}).get("status") or {}).get("streams"),
            "the stage reconciled",
        )
        for i in range(3):
            connection.xadd(StageKeys.for_stage("metered", kube_namespace).input, {"record_id": f"r{i}"})
        connection.xreadgroup(
            "metered-group", "worker-1", {StageKeys.for_stage("metered", kube_namespace).input: ">"}, count=1
        )
        labels = f'namespace="{kube_namespace}",stage="metered"'

        def figures() -> dict[str, float] | None:
            samples = operator.metrics()
            found = {k.partition("{")[0]: v for k, v in samples.items() if k.endswith("{" + labels + "}")}
            return found if found.get("phoenix_operator_stage_pending") == 1 else None

        stage_figures = eventually(figures, "the stage's gauges in /metrics", timeout=30)
        assert stage_figures["phoenix_operator_stage_backlog"] == 2
        assert stage_figures["phoenix_operator_stage_dlq_length"] == 0
        assert stage_figures["phoenix_operator_stage_oldest_unfinished_seconds"] >= 0
        assert stage_figures["phoenix_operator_stage_desired_replicas"] == 1
        assert stage_figures["phoenix_operator_stage_ready"] == 0  # no kubelet here: no pod is ever ready
        samples = operator.metrics()
        assert samples['phoenix_operator_reconciles_total{outcome="success"}'] >= 1
        assert samples["phoenix_operator_reconcile_duration_seconds_count{}"] >= 1
        assert samples["phoenix_operator_leader{}"] == 1
        assert operator.role() == "leader"
    exported = {key.partition("{")[0] for key in samples} | worker_series()
    for rule in alert_rules():
        unknown = set(metric_names(promql_parser.parse(rule["expr"]))) - exported
        assert not unknown, f"{rule['alert']} names metrics nobody exports: {sorted(unknown)}"
