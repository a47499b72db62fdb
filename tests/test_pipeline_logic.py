"""A PhoenixPipeline without a cluster: the models' refusals (each with its one message), the graph's cycles, the
pause's order from the stages' status, the status summed from the stages', and the stages built and patched."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client
from pydantic import ValidationError

from phoenix.crds import API_VERSION, DeletionPolicy
from phoenix.crds.pipeline import PIPELINE_KIND, PhoenixPipelineSpec, find_cycle
from phoenix.kube_names import PIPELINE_LABEL
from phoenix.operator.builders import Owner
from phoenix.operator.builders.pipeline import owned_by, pipeline_stage, stage_changes, wanted_stage_spec
from phoenix.operator.context import OperatorContext
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.pipeline.lifecycle import paused_stages
from phoenix.operator.pipeline.loop import stage_of_pipeline_seen
from phoenix.operator.pipeline.summary import StageView, pipeline_status

REDIS = {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}}
UID = "0b6f6c3e-7a43-4d57-9b55-6d1f1a2f4c11"
OWNER = Owner(API_VERSION, PIPELINE_KIND, "documents", "team", UID)


def entry(name: str, to: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"processor": "router", "image": "phoenix:1", "redis": REDIS, **spec}
    if to is not None:
        body["output"] = {"stage": to}
    return {"name": name, "spec": body}


def pipeline(*entries: dict[str, Any], **spec: Any) -> PhoenixPipelineSpec:
    return PhoenixPipelineSpec.model_validate({"stages": list(entries), **spec})


CHAIN = (entry("router", "parser"), entry("parser", "grouper"), entry("grouper"))


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ((entry("a"), entry("a")), "each stage's name must be unique in the pipeline (repeated: a)"),
        ((entry("a", "b"),), "an output.stage or outputs[].stage must name a stage of this pipeline"),
        ((entry("a", "b"), entry("b", input="custom:in")), "a stage that sets spec.input is fed with output.stream"),
        ((entry("a", "a"),), "must not name the stage itself (a pipeline has no cycle) (stage a)"),
        ((entry("a", "b"), entry("b", "c"), entry("c", "a")), "(a pipeline is a DAG) (found a -> b -> c -> a)"),
    ],
)
def test_the_models_refuse_what_a_pipeline_cannot_be_with_one_message(
    entries: tuple[dict[str, Any], ...], message: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        pipeline(*entries)
    assert message in str(refused.value)
    assert len(refused.value.errors()) == 1


def test_edges_out_of_the_pipeline_go_by_stream_and_a_dag_is_admitted() -> None:
    spec = pipeline(entry("a", "b"), entry("b", output={"stream": "elsewhere:in"}), entry("c", "b"))
    assert spec.edges() == {"a": ("b",), "b": (), "c": ("b",)}
    assert spec.upstream() == {"a": (), "b": ("a", "c"), "c": ()}
    assert find_cycle(spec.upstream()) is None


def _stage(paused: bool, lag: int | None = 0, pending: int | None = 0, ready_pods: int = 0) -> dict[str, Any]:
    """A PhoenixStage as the operator left it: reconciled (observedGeneration), with its sampled queue."""
    return {
        "metadata": {"generation": 2},
        "spec": {"paused": paused},
        "status": {
            "observedGeneration": 2,
            "replicas": {"ready": ready_pods, "desired": ready_pods},
            "queue": {"lag": lag, "pending": pending},
            "conditions": [{"type": "Ready", "status": "True", "reason": "StageReady"}],
        },
    }


def test_a_pause_stops_intake_first_then_each_next_stage_once_drained() -> None:
    spec = pipeline(*CHAIN, paused=True)
    running = {name: _stage(False, lag=3) for name in ("router", "parser", "grouper")}
    # First the router alone: the parser waits for it to stop.
    assert paused_stages(spec, running) == {"router": True, "parser": False, "grouper": False}
    # The router paused but a pod of it still ready: still waiting.
    stages = {**running, "router": _stage(True, ready_pods=1)}
    assert paused_stages(spec, stages)["parser"] is False
    # The router stopped, the parser still has a backlog: waiting.
    stages["router"] = _stage(True)
    assert paused_stages(spec, stages)["parser"] is False
    # The parser drained (nothing undelivered, nothing in flight): paused, and the grouper waits for it to stop.
    stages["parser"] = _stage(False, lag=0, pending=0)
    assert paused_stages(spec, stages) == {"router": True, "parser": True, "grouper": False}
    # A figure not known yet is not "drained".
    stages["parser"] = _stage(True)
    stages["grouper"] = _stage(False, lag=None, pending=0)
    assert paused_stages(spec, stages)["grouper"] is False
    # A stage paused stays paused until the resume, whatever comes into it meanwhile.
    stages["grouper"] = _stage(True, lag=7)
    assert all(paused_stages(spec, stages).values())


def test_a_resume_is_at_once_and_leaves_each_stage_its_own_pause() -> None:
    spec = pipeline(entry("router", "parser"), entry("parser", paused=True))
    stages = {"router": _stage(True), "parser": _stage(True)}
    assert paused_stages(spec, stages) == {"router": False, "parser": True}


def test_a_stage_fed_by_two_waits_for_both() -> None:
    spec = pipeline(entry("a", "c"), entry("b", "c"), entry("c"), paused=True)
    stages = {"a": _stage(True), "b": _stage(True, ready_pods=1), "c": _stage(False)}
    assert paused_stages(spec, stages)["c"] is False
    stages["b"] = _stage(True)
    assert paused_stages(spec, stages)["c"] is True


def test_the_status_sums_the_stages_and_counts_the_ready() -> None:
    router = _stage(False, lag=4, pending=1)
    router["status"]["queue"].update({"dlqLength": 2, "oldestUnfinishedSeconds": 30})
    parser = _stage(False, lag=1, pending=0)
    parser["status"]["queue"].update({"dlqLength": 0, "oldestUnfinishedSeconds": 90})
    parser["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "RolloutInProgress"}]
    views = [StageView("router", router), StageView("parser", parser), StageView("grouper", None, not_owned=True)]
    status = pipeline_status({"handledRestart": "r1"}, views, paused=False, error=None, generation=3)
    assert (status["ready"], status["backlog"], status["inFlight"], status["dlq"]) == ("1/3", 5, 1, 2)
    assert status["oldestUnfinishedSeconds"] == 90 and status["observedGeneration"] == 3
    assert status["handledRestart"] == "r1"  # fields of others kept
    assert [line["state"] for line in status["stages"]] == ["Ready", "NotReady", "NotOwned"]
    ready = {c["type"]: c for c in status["conditions"]}
    assert ready["Ready"]["status"] == "False" and ready["StagesReady"]["reason"] == "StagesNotReady"
    assert "parser (RolloutInProgress)" in ready["StagesReady"]["message"]
    assert "grouper (a PhoenixStage of this name not made by the pipeline)" in ready["StagesReady"]["message"]
    # Unchanged conditions keep their lastTransitionTime from one status to the next.
    again = pipeline_status(status, views, paused=False, error=None, generation=3)
    assert again["conditions"] == status["conditions"]


def test_no_figure_is_made_up_for_stages_not_sampled_yet() -> None:
    status = pipeline_status({}, [StageView("router", None)], paused=False, error=None, generation=1)
    assert status["ready"] == "0/1"
    assert not {"backlog", "inFlight", "dlq", "oldestUnfinishedSeconds"} & set(status)


def test_a_pipeline_stage_is_owned_labelled_and_carries_the_pipeline_pause_and_policy() -> None:
    raw = entry("parser", paused=False, deletionPolicy="Retain")["spec"]
    spec = wanted_stage_spec(raw, paused=True, deletion_policy=DeletionPolicy.DELETE)
    assert (spec["paused"], spec["deletionPolicy"]) == (True, "Delete")
    assert wanted_stage_spec(raw, paused=False, deletion_policy=None)["deletionPolicy"] == "Retain"
    stage = pipeline_stage(OWNER, "parser", spec)
    assert stage["metadata"]["labels"] == {PIPELINE_LABEL: "documents"}
    assert owned_by(stage, UID) and not owned_by(stage, "another-uid")
    assert not owned_by({"metadata": {"ownerReferences": [{"uid": UID, "controller": False}]}}, UID)


def test_a_stage_is_patched_only_where_it_departs_from_the_pipeline() -> None:
    wanted = pipeline_stage(OWNER, "parser", wanted_stage_spec(entry("parser")["spec"], False, None))
    existing = {**copy.deepcopy(wanted), "metadata": {**wanted["metadata"], "resourceVersion": "7"}}
    assert stage_changes(existing, wanted) == []
    existing["spec"]["image"] = "someone/else:1"
    existing["metadata"]["labels"] = {}
    ops = stage_changes(existing, wanted)
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    assert {"op": "replace", "path": "/spec", "value": wanted["spec"]} in ops
    assert {"op": "add", "path": "/metadata/labels", "value": {}} in ops
    assert {"op": "add", "path": "/metadata/labels/phoenix.io~1pipeline", "value": "documents"} in ops


def test_named_outputs_are_edges_too() -> None:
    router = {
        "name": "router",
        "spec": {
            **entry("router")["spec"],
            "outputs": [{"name": "parser", "stage": "parser"}, {"name": "imaging", "stage": "imaging"}],
        },
    }
    spec = pipeline(router, entry("parser", "grouper"), entry("imaging", "grouper"), entry("grouper"))
    assert spec.edges()["router"] == ("parser", "imaging")
    assert spec.upstream()["grouper"] == ("parser", "imaging")
    closing = {
        "name": "grouper",
        "spec": {**entry("grouper")["spec"], "outputs": [{"name": "back", "stage": "router"}]},
    }
    with pytest.raises(ValidationError, match=r"found router -> (parser|imaging) -> grouper -> router"):
        pipeline(router, entry("parser", "grouper"), entry("imaging", "grouper"), closing)
    with pytest.raises(ValidationError, match="must name a stage of this pipeline"):
        pipeline(router, entry("parser"))


def test_a_pipeline_or_a_stage_it_made_is_looked_at_at_once_and_no_other() -> None:
    context = OperatorContext(KubeApi(client.ApiClient()), namespaces=(), refresh_interval=10.0)
    pipelines = context.pipelines
    pipelines.observe({"metadata": {"namespace": "team", "name": "documents", "generation": 1}})
    assert pipelines.changed == {("team", "documents")} and pipelines.wake.is_set()
    pipelines.changed.clear()
    pipelines.wake.clear()
    stage_of_pipeline_seen(context, {"metadata": {"namespace": "team", "name": "router"}})  # a hand-made stage
    assert not pipelines.changed and not pipelines.wake.is_set()
    labelled = {"metadata": {"namespace": "team", "name": "parser", "labels": {PIPELINE_LABEL: "documents"}}}
    stage_of_pipeline_seen(context, labelled)
    assert pipelines.changed == {("team", "documents")} and pipelines.wake.is_set()
