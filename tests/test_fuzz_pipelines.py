"""Generated pipeline graphs (names repeated or not, edges by output.stage and by named outputs, inside, outside or
to a stage with its own input, self edges and cycles) through the models (phoenix/crds/pipeline.py) and through the
real API server's CEL rules (a server-side dry run): wherever a CEL rule can see the fault, both refuse; a longer
cycle, which CEL cannot follow, is admitted by the API server and refused by the models (the operator then shows it
as a condition: tests/test_operator_pipeline.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from kubernetes import client
from pydantic import ValidationError

from phoenix.crds import API_VERSION, GROUP, VERSION
from phoenix.crds.pipeline import PIPELINE_KIND, PIPELINE_PLURAL, PhoenixPipeline
from tests.fixtures.admission import refused_by_the_api_server
from tests.fixtures.cluster_objects import ensure_namespace
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.fuzzing import FUZZ_SCALE, fuzz_settings

pytestmark = [pytest.mark.fuzz, pytest.mark.kube]

NAMESPACE = "fuzz-pipelines"
NAMES = ("a", "b", "c", "d", "e")
OUTSIDE = "zz"  # never a stage of the generated pipelines
REDIS = {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}}


@pytest.fixture(scope="module")
def namespace(kube_cluster: ControlPlane) -> Iterator[str]:
    ensure_namespace(kube_cluster, NAMESPACE)
    yield NAMESPACE


def _target(draw: st.DrawFn, name: str, others: list[str]) -> str:
    """Mostly another stage of the pipeline, now and then the stage itself or a name outside the pipeline."""
    pick = draw(st.integers(0, 9))
    return OUTSIDE if pick == 0 else name if pick == 1 or not others else draw(st.sampled_from(others))


@st.composite
def pipeline_entries(draw: st.DrawFn) -> list[dict[str, Any]]:
    """1 to 5 stages, their names mostly unique (a repeated one now and then), each with no output, a stream, or an
    output.stage that is mostly another stage of the pipeline (so that cycles come up), now and then itself or a
    name outside it; now and then a stage with its own input."""
    names = list(draw(st.permutations(NAMES)))[: draw(st.integers(1, len(NAMES)))]
    if len(names) > 1 and draw(st.integers(0, 5)) == 0:
        names[-1] = names[0]
    # A ring (each stage to the next, the last to the first) makes the longer cycles that random edges rarely do.
    ring = len(names) > 1 and draw(st.integers(0, 3)) == 0
    entries = []
    for i, name in enumerate(names):
        spec: dict[str, Any] = {"processor": "router", "image": "phoenix:1", "redis": REDIS}
        others = [other for other in names if other != name]

        output = "ring" if ring else draw(st.sampled_from(["none", "stream", "stage", "stage", "named", "named"]))
        if output == "stage":
            spec["output"] = {"stage": _target(draw, name, others)}
        elif output == "named":  # a router's named outputs (spec.outputs), one to three of them
            targets = [_target(draw, name, others) for _ in range(draw(st.integers(1, 3)))]
            spec["outputs"] = [{"name": f"out{j}", "stage": stage} for j, stage in enumerate(targets)]
        elif output == "ring":
            spec["output"] = {"stage": names[(i + 1) % len(names)]}
        elif output == "stream":
            spec["output"] = {"stream": "elsewhere:in"}
        if draw(st.integers(0, 9)) == 0:
            spec["input"] = f"custom:{name}"
        entries.append({"name": name, "spec": spec})
    return entries


def _targets(entry: dict[str, Any]) -> list[str]:
    spec = entry["spec"]
    if "outputs" in spec:
        return [output["stage"] for output in spec["outputs"]]
    stage = (spec.get("output") or {}).get("stage")
    return [] if stage is None else [stage]


def faults_cel_sees(entries: list[dict[str, Any]]) -> bool:
    """Repeated names, an edge to no stage of the pipeline or to one with its own input, a self edge."""
    names = [entry["name"] for entry in entries]
    own_input = {entry["name"] for entry in entries if "input" in entry["spec"]}
    edges = [(entry["name"], target) for entry in entries for target in _targets(entry)]
    return len(set(names)) != len(names) or any(
        target not in names or target in own_input or target == name for name, target in edges
    )


def has_cycle(entries: list[dict[str, Any]]) -> bool:
    """A cycle, by a walk from each stage along every edge (every name unique and every edge inside:
    faults_cel_sees is False), independently of the models' graph code."""
    next_of = {entry["name"]: _targets(entry) for entry in entries}
    for start in next_of:
        frontier, seen = list(next_of[start]), set()
        while frontier:
            current = frontier.pop()
            if current == start:
                return True
            if current not in seen:
                seen.add(current)
                frontier += next_of[current]
    return False


def refused_by_the_models(body: dict[str, Any]) -> str | None:
    try:
        PhoenixPipeline.model_validate(body)
    except ValidationError as exc:
        return str(exc)
    return None


@pytest.mark.timeout(120 * FUZZ_SCALE)
@fuzz_settings(60)
@given(entries=pipeline_entries())
def test_the_models_and_cel_refuse_the_same_graphs_and_the_models_also_longer_cycles(
    kube_api: client.ApiClient, namespace: str, entries: list[dict[str, Any]]
) -> None:
    body = {
        "apiVersion": API_VERSION,
        "kind": PIPELINE_KIND,
        "metadata": {"name": "generated", "namespace": namespace},
        "spec": {"stages": entries},
    }
    custom = client.CustomObjectsApi(kube_api)
    by_api_server = refused_by_the_api_server(
        custom.create_namespaced_custom_object, GROUP, VERSION, namespace, PIPELINE_PLURAL, body=body
    )
    by_models = refused_by_the_models(body)
    cel_sees = faults_cel_sees(entries)
    cycle = not cel_sees and has_cycle(entries)
    event("CEL fault" if cel_sees else "longer cycle" if cycle else "a DAG")
    assert (by_api_server is not None) == cel_sees, by_api_server
    assert (by_models is not None) == (cel_sees or cycle), by_models
