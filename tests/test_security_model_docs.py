"""docs/operator.md's Security model says what the shipped roles and policies grant: its tables are read here and
held against manifests/ (tests/test_helm_chart.py holds the chart to them), so the page promises only what the
objects do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tests.fixtures.docs import DOCS, ROOT, table

OPERATOR_PAGE = DOCS / "operator.md"
MANIFESTS = ROOT / "manifests"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def stage_rules(role: dict[str, Any]) -> dict[str, set[str]]:
    """resource -> verbs, for the rules of the phoenix.io group."""
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        if "phoenix.io" in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault(resource, set()).update(rule["verbs"])
    return granted


def aggregated_into(role: dict[str, Any]) -> set[str]:
    prefix = "rbac.authorization.k8s.io/aggregate-to-"
    return {
        k.removeprefix(prefix) for k, v in role["metadata"]["labels"].items() if k.startswith(prefix) and v == "true"
    }


# The columns of "Who may create stages" after the role's name, in order: the resources whose grants each states.
RESOURCES = ("phoenixstages", "phoenixpipelines")


def documented_roles() -> dict[str, tuple[dict[str, set[str]], set[str]]]:
    """Role name -> (the verbs its row grants on each of RESOURCES, roles its row says it is aggregated into), each
    read before any parenthesis: what those include in turn is Kubernetes's own aggregation."""
    verbs = {"create", "update", "patch", "delete", "deletecollection", "get", "list", "watch"}
    roles = {}
    for name, *grants, into in table(OPERATOR_PAGE, "### Who may create stages"):
        granted = {
            resource: set(re.findall(r"[a-z]+", cell.split("(")[0])) & verbs
            for resource, cell in zip(RESOURCES, grants, strict=True)
        }
        roles[name.strip("`")] = (granted, set(re.findall(r"`(\w+)`", into.split("(")[0])))
    return roles


def test_the_roles_for_people_grant_what_the_security_model_says() -> None:
    shipped = {role["metadata"]["name"]: role for role in documents(MANIFESTS / "rbac" / "stage-roles.yaml")}
    documented = documented_roles()
    assert set(documented) == set(shipped)
    for name, (granted, into) in documented.items():
        for resource, verbs in granted.items():
            assert stage_rules(shipped[name]).get(resource) == verbs, (name, resource)
        assert aggregated_into(shipped[name]) == into, name
    # "not `status`: the operator's alone": the editing role writes no status; the viewing role reads it.
    for resource in RESOURCES:
        assert f"{resource}/status" not in stage_rules(shipped["phoenix-stage-edit"]), resource
        assert stage_rules(shipped["phoenix-stage-view"])[f"{resource}/status"] == {"get", "list", "watch"}, resource


def test_the_operator_gets_secrets_by_name_only_as_the_security_model_says() -> None:
    """ "The operator itself gets only the Secrets its stages name (never list or watch)": in both install modes."""
    for path in (MANIFESTS / "rbac" / "cluster-role.yaml", MANIFESTS / "namespaced" / "role.yaml"):
        (role,) = documents(path)
        secret_verbs = {verb for rule in role["rules"] if "secrets" in rule["resources"] for verb in rule["verbs"]}
        assert secret_verbs == {"get"}, path.name


def _ports(rules: list[dict[str, Any]]) -> set[tuple[int, str]]:
    return {(port["port"], port["protocol"]) for rule in rules for port in rule.get("ports", [])}


def test_the_network_policies_open_what_the_security_model_says() -> None:
    policies = {
        doc["metadata"]["name"]: doc["spec"]
        for path in sorted((MANIFESTS / "network-policy").glob("*-network-policy.yaml"))
        for doc in documents(path)
    }
    rows = {pods.split()[0]: (ingress, egress) for pods, ingress, egress in table(OPERATOR_PAGE, "### NetworkPolicies")}
    assert set(rows) == {"operator", "workers"}
    assert set(policies) == {"phoenix-operator", "phoenix-workers"}
    dns = {(53, "UDP"), (53, "TCP")}
    operator, workers = policies["phoenix-operator"], policies["phoenix-workers"]
    # Ingress: only the metrics port, from the monitoring peers, for both.
    assert _ports(operator["ingress"]) == _ports(workers["ingress"]) == {(8080, "TCP")}
    assert "port 8080" in rows["workers"][0] and "metrics port" in rows["operator"][0]
    # Egress: the API server on 443 and 6443 for the operator alone; Redis and DNS for both; nothing to every address.
    assert {(443, "TCP"), (6443, "TCP")} <= _ports(operator["egress"]) and "443 and 6443" in rows["operator"][1]
    assert not {(443, "TCP"), (6443, "TCP")} & _ports(workers["egress"])
    assert dns <= _ports(operator["egress"]) and dns <= _ports(workers["egress"])
    assert "53 UDP and TCP" in rows["workers"][1]
    for spec in (operator, workers):
        assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
        assert all(rule.get("to") or rule.get("from") for rule in [*spec["ingress"], *spec["egress"]])
