"""A PhoenixPipeline against the real API server and a real operator process: its stages made (owned, labelled),
READY 3/3, a spec change carried to its stage, a removed stage deleted, a hand edit put back, a stage of the same
name it does not own refused, a cycle and an unknown edge refused, a pause in order and a resume at once, a restart
passed on, and the pipeline's deletion taking its stages with it; its P50 and P99 from a real worker of its final
stage. (No kubelet: every stage scales 0..5, so that a Deployment of zero pods is ready; the final stage's one pod is
played by tests/fixtures/kubelet_player.py.)"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
import yaml
from kubernetes import client

from phoenix.crds.pipeline import PIPELINE_PLURAL
from phoenix.kube_names import PIPELINE_LABEL, REPLAY_ANNOTATION, RESTART_ANNOTATION
from phoenix.record_format import ENTERED_AT
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kubelet_player import KubeletPlayer
from tests.fixtures.operator_process import (
    ServingOperator,
    condition,
    event_messages,
    event_reasons,
    existing_stage,
    final_stage,
    get_pipeline,
    get_stage,
    kubectl_apply,
    kubectl_columns,
    sample_pipeline,
    watching_operator,
)
from tests.fixtures.replies import add_entry_now, read_group_now

pytestmark = pytest.mark.kube
STAGES = ("router", "parser", "grouper")
PIPELINE = "documents"


@pytest.fixture(scope="module")
def operator(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Iterator[ServingOperator]:
    with watching_operator(kube_cluster, operator_kubeconfig, "operator-pipeline") as served:
        yield served


def _pipeline_condition(plane: ControlPlane, namespace: str, type_: str = "Ready") -> dict[str, Any]:
    return condition(get_pipeline(plane, namespace, PIPELINE), type_) or {}


def _stage_spec(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    return existing_stage(plane, namespace, name)["spec"]


def _entry(pipeline: dict[str, Any], name: str) -> dict[str, Any]:
    return next(entry for entry in pipeline["spec"]["stages"] if entry["name"] == name)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("redis_db", [13], indirect=True)
def test_a_pipeline_makes_keeps_pauses_and_deletes_its_stages(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, _ = redis_db
    ns = kube_namespace
    secret, pipeline = sample_pipeline(url, ns)
    kubectl_apply(kube_cluster, [secret, pipeline])
    uid = eventually(lambda: (get_pipeline(kube_cluster, ns, PIPELINE) or {}).get("metadata", {}).get("uid"), "uid")

    # One PhoenixStage per entry, of its name, owned by the pipeline and labelled with its name.
    for name in STAGES:
        stage = eventually(lambda name=name: get_stage(kube_cluster, ns, name), f"the stage {name} made")
        (reference,) = stage["metadata"]["ownerReferences"]
        assert (reference["kind"], reference["uid"], reference["controller"]) == ("PhoenixPipeline", uid, True)
        assert stage["metadata"]["labels"][PIPELINE_LABEL] == PIPELINE
        assert stage["spec"]["processor"] == _entry(pipeline, name)["spec"]["processor"]
    assert existing_stage(kube_cluster, ns, "router")["spec"]["output"] == {"stage": "parser"}

    # READY 3/3 once the stages are Ready, with the sums of their figures in the other columns.
    eventually(lambda: _pipeline_condition(kube_cluster, ns).get("reason") == "PipelineReady", "pipeline Ready", 90)
    row = kubectl_columns(kube_cluster, PIPELINE_PLURAL, ns)[PIPELINE]
    assert (row["READY"], row["BACKLOG"], row["IN-FLIGHT"], row["DLQ"]) == ("3/3", "0", "0", "0")
    assert row["P99"] == ""  # no record finished yet: shown empty, not made up
    assert "StageCreated" in event_reasons(kube_api, ns, PIPELINE)
    status = existing_stage(kube_cluster, ns, "router")["status"]
    lines = (get_pipeline(kube_cluster, ns, PIPELINE) or {})["status"]["stages"]
    [line] = [line for line in lines if line["name"] == "router"]
    assert line["input"] == status["streams"]["input"] and line["state"] == "Ready"

    custom = client.CustomObjectsApi(kube_api)

    def patch_pipeline(body: dict[str, Any]) -> None:
        custom.patch_namespaced_custom_object("phoenix.io", "v1alpha1", ns, PIPELINE_PLURAL, PIPELINE, body)

    def replace_stages(stages: list[dict[str, Any]]) -> None:
        patch_pipeline({"spec": {"stages": stages}})  # a merge patch replaces a list whole

    # A change of an entry's spec reaches its stage.
    current = get_pipeline(kube_cluster, ns, PIPELINE) or {}
    stages = copy.deepcopy(current["spec"]["stages"])
    _entry({"spec": {"stages": stages}}, "parser")["spec"]["worker"]["concurrency"] = 3
    replace_stages(stages)
    eventually(lambda: _stage_spec(kube_cluster, ns, "parser")["worker"]["concurrency"] == 3, "the change carried")
    assert eventually(lambda: event_messages(kube_api, ns, PIPELINE, "StageUpdated"), "a StageUpdated Event")

    # A hand edit of an owned stage is put back.
    custom.patch_namespaced_custom_object(
        "phoenix.io", "v1alpha1", ns, "phoenixstages", "grouper", {"spec": {"replicas": {"max": 9}}}
    )
    eventually(lambda: _stage_spec(kube_cluster, ns, "grouper")["replicas"]["max"] == 5, "the hand edit put back", 15)
    restored = eventually(lambda: event_messages(kube_api, ns, PIPELINE, "StageRestored"), "a StageRestored Event")
    assert "spec.replicas.max" in restored[0]

    # A restart asked of the pipeline is passed to every stage, once.
    kube_cluster.kubectl("annotate", PIPELINE_PLURAL, PIPELINE, "-n", ns, f"{RESTART_ANNOTATION}=r1")
    for name in STAGES:
        eventually(
            lambda name=name: (
                existing_stage(kube_cluster, ns, name)["metadata"]["annotations"].get(RESTART_ANNOTATION) == "r1"
            ),
            f"the restart passed to {name}",
        )
    assert (get_pipeline(kube_cluster, ns, PIPELINE) or {})["status"]["handledRestart"] == "r1"

    # A pause: the first stage at once, then each next one once what feeds it has stopped and it has drained
    # (here nothing waits anywhere); Paused once all are. A resume un-pauses every stage.
    patch_pipeline({"spec": {"paused": True}})
    eventually(lambda: _pipeline_condition(kube_cluster, ns, "Paused").get("status") == "True", "all paused", 60)
    assert all(_stage_spec(kube_cluster, ns, name)["paused"] for name in STAGES)
    assert event_reasons(kube_api, ns, "parser").count("Paused") == 1
    patch_pipeline({"spec": {"paused": False}})
    eventually(lambda: not any(_stage_spec(kube_cluster, ns, n)["paused"] for n in STAGES), "all resumed", 30)
    assert _pipeline_condition(kube_cluster, ns, "Paused")["reason"] == "Running"

    # A stage removed from the pipeline (with the edge to it) is deleted.
    current = get_pipeline(kube_cluster, ns, PIPELINE) or {}
    stages = [entry for entry in copy.deepcopy(current["spec"]["stages"]) if entry["name"] != "grouper"]
    del _entry({"spec": {"stages": stages}}, "parser")["spec"]["output"]
    replace_stages(stages)
    eventually(lambda: get_stage(kube_cluster, ns, "grouper") is None, "the removed stage deleted", 30)
    eventually(lambda: kubectl_columns(kube_cluster, PIPELINE_PLURAL, ns)[PIPELINE]["READY"] == "2/2", "READY 2/2")

    # Deleting the pipeline deletes its stages (the garbage collector, by the owner references).
    custom.delete_namespaced_custom_object("phoenix.io", "v1alpha1", ns, PIPELINE_PLURAL, PIPELINE)
    eventually(lambda: all(get_stage(kube_cluster, ns, n) is None for n in STAGES), "the stages deleted", 60)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [13], indirect=True)
def test_a_stage_the_pipeline_does_not_own_is_refused_not_taken_over(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, _ = redis_db
    ns = kube_namespace
    kubectl_apply(kube_cluster, final_stage(url, ns, name="grouper"))
    before = existing_stage(kube_cluster, ns, "grouper")
    kubectl_apply(kube_cluster, sample_pipeline(url, ns))
    found = eventually(
        lambda: (
            _pipeline_condition(kube_cluster, ns).get("reason") == "StageNotOwned"
            and _pipeline_condition(kube_cluster, ns)
        ),
        "the pipeline refused the stage it does not own",
    )
    assert "grouper" in found["message"] and found["status"] == "False"
    assert eventually(lambda: event_messages(kube_api, ns, PIPELINE, "StageNotOwned"), "a Warning")
    # The other stages are made; the hand-made one is left exactly as it was.
    eventually(lambda: get_stage(kube_cluster, ns, "parser") is not None, "the pipeline's own stages made")
    after = existing_stage(kube_cluster, ns, "grouper")
    assert after["spec"] == before["spec"]
    assert "ownerReferences" not in after["metadata"] and PIPELINE_LABEL not in after["metadata"].get("labels", {})
    row = kubectl_columns(kube_cluster, PIPELINE_PLURAL, ns)[PIPELINE]
    assert row["READY"].endswith("/3") and row["READY"] != "3/3"


@pytest.mark.timeout(120)
def test_a_cycle_is_a_condition_and_an_unknown_edge_is_refused_at_admission(
    operator: ServingOperator, kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    _, pipeline = sample_pipeline("redis://unused:6379/0", ns)
    grouper = _entry(pipeline, "grouper")
    # grouper -> router closes router -> parser -> grouper: CEL cannot follow a path, the operator can.
    grouper["spec"]["output"] = {"stage": "router"}
    kubectl_apply(kube_cluster, [pipeline])
    found = eventually(
        lambda: (
            _pipeline_condition(kube_cluster, ns).get("reason") == "InvalidSpec"
            and _pipeline_condition(kube_cluster, ns)
        ),
        "the cycle refused",
    )
    assert "cycle" in found["message"] and "router -> parser -> grouper -> router" in found["message"]
    assert eventually(lambda: event_messages(kube_api, ns, PIPELINE, "InvalidSpec"), "a Warning")
    assert all(get_stage(kube_cluster, ns, name) is None for name in STAGES)

    # An edge to a stage outside the pipeline: refused by the API server, with the rule's message.
    grouper["spec"]["output"] = {"stage": "elsewhere"}
    pipeline["metadata"]["name"] = "strays"
    result = kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pipeline))
    assert result.returncode != 0
    assert "an output.stage or outputs[].stage must name a stage of this pipeline" in result.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("redis_db", [13], indirect=True)
def test_a_pause_waits_for_each_stage_to_drain_and_replays_and_the_delete_policy_reach_every_stage(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    kubectl_apply(kube_cluster, sample_pipeline(url, ns))
    eventually(lambda: _pipeline_condition(kube_cluster, ns).get("reason") == "PipelineReady", "pipeline Ready", 90)
    custom = client.CustomObjectsApi(kube_api)

    def patch_pipeline(body: dict[str, Any]) -> None:
        custom.patch_namespaced_custom_object("phoenix.io", "v1alpha1", ns, PIPELINE_PLURAL, PIPELINE, body)

    def streams(name: str) -> dict[str, str]:
        return existing_stage(kube_cluster, ns, name)["status"]["streams"]

    def paused(name: str) -> bool:
        return bool(_stage_spec(kube_cluster, ns, name)["paused"])

    # One entry waits in the parser's input (no worker runs here): the parser has a backlog of 1.
    parser = streams("parser")
    add_entry_now(connection, parser["input"], {"record_id": "r-1", "data": "{}"})
    eventually(lambda: kubectl_columns(kube_cluster, PIPELINE_PLURAL, ns)[PIPELINE]["BACKLOG"] == "1", "BACKLOG 1", 30)

    # The router pauses at once; the parser waits for its backlog, and the grouper for the parser.
    patch_pipeline({"spec": {"paused": True}})
    eventually(lambda: paused("router"), "the router paused")
    eventually(
        lambda: "paused: router;" in _pipeline_condition(kube_cluster, ns, "Paused").get("message", ""),
        "the router stopped",
        30,
    )
    pausing = _pipeline_condition(kube_cluster, ns, "Paused")
    assert pausing["reason"] == "Pausing" and "parser: backlog 1, in flight 0" in pausing["message"]
    time.sleep(3)  # a few passes of the pipeline loop and of the status refresh
    assert not paused("parser") and not paused("grouper")

    # The entry read, as a worker would: in flight now, so the parser still waits; acknowledged, it has drained.
    [(entry_id, _)] = read_group_now(connection, parser["consumerGroup"], "test-worker", parser["input"], 1)
    eventually(
        lambda: "parser: backlog 0, in flight 1" in _pipeline_condition(kube_cluster, ns, "Paused")["message"],
        "the parser's entry in flight",
        30,
    )
    assert not paused("parser")
    connection.xack(parser["input"], parser["consumerGroup"], entry_id)
    eventually(lambda: paused("parser"), "the parser paused once drained", 30)
    eventually(lambda: _pipeline_condition(kube_cluster, ns, "Paused").get("status") == "True", "all paused", 60)
    assert paused("grouper")
    patch_pipeline({"spec": {"paused": False}})
    eventually(lambda: not any(paused(name) for name in STAGES), "all resumed", 30)

    # A replay asked of the pipeline: its annotation taken off it and carried out by every stage, once.
    kube_cluster.kubectl("annotate", PIPELINE_PLURAL, PIPELINE, "-n", ns, f"{REPLAY_ANNOTATION}=all")
    for name in STAGES:
        eventually(lambda name=name: "DlqReplayed" in event_reasons(kube_api, ns, name), f"{name} replayed", 30)
    annotations = (get_pipeline(kube_cluster, ns, PIPELINE) or {})["metadata"].get("annotations") or {}
    assert REPLAY_ANNOTATION not in annotations
    assert "ReplayRequested" in event_reasons(kube_api, ns, PIPELINE)

    # deletionPolicy Delete on the pipeline becomes every stage's: deleting the pipeline deletes their Redis data.
    inputs = [streams(name)["input"] for name in STAGES]
    assert all(connection.exists(stream) for stream in inputs)
    patch_pipeline({"spec": {"deletionPolicy": "Delete"}})
    for name in STAGES:
        eventually(
            lambda name=name: (
                existing_stage(kube_cluster, ns, name)["metadata"].get("finalizers")
                and _stage_spec(kube_cluster, ns, name)["deletionPolicy"] == "Delete"
            ),
            f"{name} under Delete",
        )
    custom.delete_namespaced_custom_object("phoenix.io", "v1alpha1", ns, PIPELINE_PLURAL, PIPELINE)
    eventually(lambda: all(get_stage(kube_cluster, ns, n) is None for n in STAGES), "the stages deleted", 60)
    assert not any(connection.exists(stream) for stream in inputs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [13], indirect=True)
def test_a_foreground_deletion_waits_for_the_stages_and_makes_none_again(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, _ = redis_db
    ns = kube_namespace
    kubectl_apply(kube_cluster, sample_pipeline(url, ns))
    eventually(lambda: all(get_stage(kube_cluster, ns, n) for n in STAGES), "the stages made")
    # A finalizer of someone else's holds the grouper: in a foreground deletion the pipeline then stays (its
    # deletionTimestamp set) while the garbage collector has deleted the router and the parser.
    hold = {"metadata": {"finalizers": ["test.phoenix.io/hold"]}}
    custom = client.CustomObjectsApi(kube_api)
    custom.patch_namespaced_custom_object("phoenix.io", "v1alpha1", ns, "phoenixstages", "grouper", hold)
    deleted = kube_cluster.kubectl(
        "delete", PIPELINE_PLURAL, PIPELINE, "-n", ns, "--cascade=foreground", "--wait=false"
    )
    assert deleted.returncode == 0, deleted.stderr
    eventually(lambda: all(get_stage(kube_cluster, ns, n) is None for n in ("router", "parser")), "two deleted", 30)
    time.sleep(3)  # a few passes of the pipeline loop: it must not make them again for a pipeline being deleted
    assert get_pipeline(kube_cluster, ns, PIPELINE) is not None
    assert all(get_stage(kube_cluster, ns, n) is None for n in ("router", "parser"))
    assert event_reasons(kube_api, ns, PIPELINE).count("StageCreated") == len(STAGES)
    release = {"metadata": {"finalizers": None}}
    custom.patch_namespaced_custom_object("phoenix.io", "v1alpha1", ns, "phoenixstages", "grouper", release)
    eventually(lambda: get_pipeline(kube_cluster, ns, PIPELINE) is None, "the pipeline deleted after its stages", 30)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("redis_db", [13], indirect=True)
def test_a_pipelines_p99_is_the_end_to_end_latency_its_final_stage_observed(
    operator: ServingOperator,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    """The grouper's worker (its pod's container run by the kubelet player, with a processor that commits anything)
    commits records that entered the pipeline 100 s and 1000 s ago: its latency windows reach the grouper's status
    and the pipeline's P50 and P99."""
    url, connection = redis_db
    ns = kube_namespace
    kubectl_apply(kube_cluster, sample_pipeline(url, ns))
    eventually(lambda: _pipeline_condition(kube_cluster, ns).get("reason") == "PipelineReady", "pipeline Ready", 90)
    assert "latency" not in (get_pipeline(kube_cluster, ns, PIPELINE) or {})["status"]
    grouper = existing_stage(kube_cluster, ns, "grouper")["status"]["streams"]["input"]
    now_ms = int(time.time() * 1000)
    ages = [100] * 3 + [1000]  # seconds: three in (60, 120], one in (600, 1200]
    for i, age in enumerate(ages):
        add_entry_now(connection, grouper, {"record_id": f"r-{i}", "data": "{}", ENTERED_AT: str(now_ms - age * 1000)})
    overrides = {"PROCESSOR": "tests.processors:ScriptedProcessor", "PYTHONPATH": str(Path(__file__).parents[1])}
    with KubeletPlayer(kube_cluster, ns, "grouper", env_overrides=overrides) as player:
        player.start()
        client.AppsV1Api(kube_api).patch_namespaced_deployment_scale("grouper", ns, {"spec": {"replicas": 1}})

        def latency() -> dict[str, Any] | None:
            found = ((get_pipeline(kube_cluster, ns, PIPELINE) or {}).get("status") or {}).get("latency")
            return found if found and found["count"] == len(ages) else None

        figures = eventually(latency, "the pipeline's latency from its final stage's windows", 90)
    # Rank 2 of 4 is the second of three in (60, 120]; rank 3.96 is 96 % into (600, 1200].
    assert figures == {"windowSeconds": 360, "count": 4, "p50Seconds": 100.0, "p99Seconds": 1176.0}
    stage = existing_stage(kube_cluster, ns, "grouper")["status"]["latency"]
    assert stage["buckets"] == [{"le": "120.0", "count": 3}, {"le": "1200.0", "count": 1}]
    assert "latency" not in existing_stage(kube_cluster, ns, "router")["status"]  # it forwards: no end there
    row = kubectl_columns(kube_cluster, PIPELINE_PLURAL, ns)[PIPELINE]
    assert float(row["P99"]) == 1176.0
