"""The PrometheusRule's alerts evaluated by Prometheus's own rule engine: `promtool check rules` on the rule file
taken from the PrometheusRule's spec, `promtool test rules` on tests/alerts/prometheus-rule.test.yaml (series in,
alert out, with the `for:`, the labels and the annotations), and proof that those unit tests catch a broken rule:
each rule is broken in a copy (threshold, comparison, `for:`, severity, grouping) and the copy must fail its test.
The Grafana dashboard's queries are parsed by promtool too (as recording rules with Grafana's variables filled in).

promtool is built by `make promtool` (hack/build-promtool.sh, part of `make test`); PROMTOOL_BIN overrides where.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_observability import DASHBOARD, dashboard_queries

pytestmark = pytest.mark.promtool
REPO = Path(__file__).resolve().parents[1]
RULE_MANIFEST = REPO / "manifests" / "monitoring" / "prometheus-rule.yaml"
UNIT_TESTS = REPO / "tests" / "alerts" / "prometheus-rule.test.yaml"
# The unit tests' rule_files entry: the spec is written there, beside a copy of the unit tests.
RULE_FILE = "phoenix-rules.yaml"
# The trailing comparison of an alert's expression: `... > 900`, `... == 0`.
COMPARISON = re.compile(r"\s(>|<|==)\s*([0-9.]+)\s*$")

Rules = dict[str, Any]


def promtool_path() -> Path:
    return Path(os.environ.get("PROMTOOL_BIN", REPO / ".cache" / "promtool" / "bin")) / "promtool"


@pytest.fixture(scope="session")
def promtool() -> Path:
    path = promtool_path()
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no promtool at {path}: build it with `make promtool` (hack/build-promtool.sh)")
    return path


def rule_spec() -> Rules:
    """The rule file Prometheus gets from the PrometheusRule: its spec (the groups)."""
    return yaml.safe_load(RULE_MANIFEST.read_text())["spec"]


def alerts(spec: Rules) -> list[dict[str, Any]]:
    return [rule for group in spec["groups"] for rule in group["rules"] if "alert" in rule]


def run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def check_rules(promtool: Path, spec: Rules, workdir: Path) -> subprocess.CompletedProcess[str]:
    (workdir / RULE_FILE).write_text(yaml.safe_dump(spec, sort_keys=False))
    return run(promtool, "check", "rules", "--lint=all", "--lint-fatal", RULE_FILE, cwd=workdir)


def unit_tests(promtool: Path, spec: Rules, workdir: Path) -> subprocess.CompletedProcess[str]:
    (workdir / RULE_FILE).write_text(yaml.safe_dump(spec, sort_keys=False))
    (workdir / UNIT_TESTS.name).write_text(UNIT_TESTS.read_text())
    return run(promtool, "test", "rules", UNIT_TESTS.name, cwd=workdir)


def test_promtool_checks_the_rule_file(promtool: Path, tmp_path: Path) -> None:
    result = check_rules(promtool, rule_spec(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alerts(rule_spec()))} rules found" in result.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases = yaml.safe_load(UNIT_TESTS.read_text())["tests"]
    checks = [check for case in cases for check in case.get("alert_rule_test", ())]
    for rule in alerts(rule_spec()):
        own = [check for check in checks if check["alertname"] == rule["alert"]]
        assert any(check["exp_alerts"] for check in own), f"{rule['alert']}: no unit test expects it to fire"
        assert any(not check["exp_alerts"] for check in own), f"{rule['alert']}: no unit test expects it quiet"
        for check in own:
            for expected in check["exp_alerts"]:
                # The annotations (summary, runbook link) are rendered from these labels; all are checked.
                assert expected["exp_labels"]["severity"] == rule["labels"]["severity"]
                assert set(expected["exp_annotations"]) == set(rule["annotations"])


def test_promtool_unit_tests_pass(promtool: Path, tmp_path: Path) -> None:
    result = unit_tests(promtool, rule_spec(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _minutes(duration: str) -> int:
    match = re.fullmatch(r"(\d+)m", duration)
    assert match, f"for: {duration!r} (the mutations below step whole minutes, the unit tests' evaluation interval)"
    return int(match.group(1))


def _comparison(rule: dict[str, Any]) -> re.Match[str]:
    match = COMPARISON.search(rule["expr"])
    assert match, f"{rule['alert']}: no trailing comparison with a number in {rule['expr']!r}"
    return match


def later_for(rule: dict[str, Any]) -> None:
    rule["for"] = f"{_minutes(rule['for']) + 1}m"


def earlier_for(rule: dict[str, Any]) -> None:
    rule["for"] = f"{_minutes(rule['for']) - 1}m"


def inclusive_comparison(rule: dict[str, Any]) -> None:
    """`> 900` becomes `>= 900`, `< 1` `<= 1`, `== 0` `!= 0`: the threshold's boundary off by one."""
    match = _comparison(rule)
    op = {">": ">=", "<": "<=", "==": "!="}[match.group(1)]
    rule["expr"] = rule["expr"][: match.start()] + f" {op} {match.group(2)}"


def threshold_off(rule: dict[str, Any]) -> None:
    """The number compared against an order of magnitude off: 900 -> 9010, 0 -> 10, 1 -> 20."""
    match = _comparison(rule)
    rule["expr"] = rule["expr"][: match.start()] + f" {match.group(1)} {float(match.group(2)) * 10 + 10:g}"


def other_severity(rule: dict[str, Any]) -> None:
    rule["labels"]["severity"] = {"warning": "critical", "critical": "warning"}[rule["labels"]["severity"]]


def lost_namespace(rule: dict[str, Any]) -> None:
    """Grouped by stage only: the alert (and its summary, runbook text) no longer says which namespace."""
    rule["expr"] = rule["expr"].replace("by (namespace, stage)", "by (stage)")


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "later for": later_for,
    "earlier for": earlier_for,
    "inclusive comparison": inclusive_comparison,
    "threshold off": threshold_off,
    "other severity": other_severity,
    "lost namespace": lost_namespace,
}
CASES = [
    (rule["alert"], name)
    for rule in alerts(rule_spec())
    for name in MUTATIONS
    if name != "lost namespace" or "by (namespace, stage)" in rule["expr"]
]


@pytest.mark.parametrize(("alert", "mutation"), CASES, ids=[f"{a}-{m.replace(' ', '-')}" for a, m in CASES])
def test_a_broken_rule_fails_its_unit_test(promtool: Path, tmp_path: Path, alert: str, mutation: str) -> None:
    spec = copy.deepcopy(rule_spec())
    (rule,) = [r for r in alerts(spec) if r["alert"] == alert]
    before = copy.deepcopy(rule)
    MUTATIONS[mutation](rule)
    assert rule != before
    checked = check_rules(promtool, spec, tmp_path)
    assert checked.returncode == 0, f"the broken copy must still be a valid rule file: {checked.stdout}"
    result = unit_tests(promtool, spec, tmp_path)
    assert result.returncode != 0, f"{alert} with {mutation} ({rule}) still passes:\n{result.stdout}"
    # promtool names the alert whose expectation failed.
    assert f"alertname: {alert}" in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_operator_scrape_keeps_the_stages_namespace() -> None:
    """The unit tests feed the per-stage gauges with the stage's `namespace`, as the operator exports them. Prometheus
    gives every target a `namespace` label of its own (the operator pod's) and, unless the PodMonitor honors the
    scraped labels, renames the metric's to exported_namespace: the alerts would then all name phoenix-system. No
    promtool command scrapes, so this is checked on the PodMonitor."""
    monitor = yaml.safe_load((RULE_MANIFEST.parent / "operator-pod-monitor.yaml").read_text())
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert endpoints and all(endpoint.get("honorLabels") is True for endpoint in endpoints)
    grouped = {rule["alert"] for rule in alerts(rule_spec()) if "phoenix_operator_stage_" in rule["expr"]}
    assert grouped and all("by (namespace, stage)" in r["expr"] for r in alerts(rule_spec()) if r["alert"] in grouped)


def grafana_expanded(query: str) -> str:
    """A dashboard query as Grafana sends it: a multi-value $stage as a regex, $__rate_interval as a duration."""
    return query.replace("$__rate_interval", "2m").replace("$stage", "parser|grouper")


def test_promtool_parses_every_dashboard_query(promtool: Path, tmp_path: Path) -> None:
    queries = dashboard_queries(json.loads(DASHBOARD.read_text()))
    assert queries
    spec: dict[str, Any] = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"phoenix:dashboard_query_{i}", "expr": grafana_expanded(q)}
                    for i, q in enumerate(queries)
                ],
            }
        ]
    }
    result = check_rules(promtool, spec, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout
    # And a query promtool rejects is caught, so the check above is not vacuous.
    spec["groups"][0]["rules"].append({"record": "phoenix:broken", "expr": "sum by (stage) (rate(x_total[2m])"})
    assert check_rules(promtool, spec, tmp_path).returncode != 0
