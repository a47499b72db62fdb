"""The operator's pure parts: replica policy, readiness, status merging, replay requests, refresh grouping, retry
waits and the kopf handlers' ids."""

from __future__ import annotations

import logging
from typing import Any

import kopf
import pytest

from phoenix.crds import ConditionType, PhoenixStageSpec
from phoenix.crds.definition import FIGURES_AGE
from phoenix.keys import StageKeys
from phoenix.operator import handlers  # noqa: F401  (registers the kopf handlers
from phoenix.operator.errors import MAX_BACKOFF_SECONDS, StageError, retry_delay
from phoenix.operator.kube.kopf_settings import QuietHandlers
from phoenix.operator.options import DEFAULT_REFRESH_SECONDS
from phoenix.operator.record import StageRecord
from phoenix.operator.stage.children import deployment_replicas
from phoenix.operator.stage.converge import current_view, due_work
from phoenix.operator.stage.drift import describe, differences
from phoenix.operator.stage.reconcile import kopf_retry, parse_stage
from phoenix.operator.stage.refresh import (
    FIGURES_MAX_CYCLES,
    PATCH_CONCURRENCY,
    PlannedWrite,
    due_writes,
    group_by_redis,
)
from phoenix.operator.stage.requests import (
    ReplayRequestError,
    has_replay_work,
    has_restart_request,
    parse_replay_count,
)
from phoenix.operator.status.conditions import new_condition
from phoenix.operator.status.readiness import deployment_condition, ready_condition, replica_status, waits_for_keda
from phoenix.operator.status.writer import merged_status, status_patch
from phoenix.redis_spec import RedisSpec


def _spec(**overrides: Any) -> PhoenixStageSpec:
    return PhoenixStageSpec.model_validate(
        {"processor": "router", "image": "img", "redis": {"urlSecretRef": {"name": "s", "key": "url"}}, **overrides}
    )


def _deployment(desired: int, ready: int = 0, updated: int | None = None, seen: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": seen,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": desired if updated is None else updated,
        },
    }


@pytest.mark.parametrize(
    ("overrides", "current", "keda", "expected"),
    [
        ({"replicas": {"min": 2, "max": 5}}, 4, False, 2),  # no KEDA: exactly min
        ({"replicas": {"min": 2, "max": 5}}, 4, True, 4),  # KEDA's choice is kept
        ({"replicas": {"min": 2, "max": 5}}, 0, True, 2),  # unpaused: back to min
        ({"replicas": {"min": 2, "max": 5}}, 9, True, 5),  # max lowered: clamped
        ({"replicas": {"min": 2, "max": 5}}, None, True, 2),  # created at min
        ({"replicas": {"min": 2, "max": 5}, "paused": True}, 4, True, 0),
        ({"replicas": {"min": 2, "max": 5}, "paused": True}, 4, False, 0),
    ],
)
def test_deployment_replicas(overrides: dict[str, Any], current: int | None, keda: bool, expected: int) -> None:
    assert deployment_replicas(_spec(**overrides), current, keda) == expected


@pytest.mark.parametrize(
    ("deployment", "status", "reason"),
    [
        (None, "False", "DeploymentMissing"),
        (_deployment(2, ready=2), "True", "ReplicasAvailable"),
        (_deployment(2, ready=1), "False", "ReplicasUnavailable"),
        (_deployment(2, ready=2, updated=1), "False", "RolloutInProgress"),
        (_deployment(2, ready=2, seen=0), "False", "RolloutPending"),
        (_deployment(0), "True", "ScaledToZero"),
    ],
)
def test_deployment_condition(deployment: dict[str, Any] | None, status: str, reason: str) -> None:
    found = deployment_condition(deployment)
    assert (found.type, found.status, found.reason) == ("DeploymentReady", status, reason)


def test_replica_status_reads_desired_and_ready() -> None:
    assert replica_status(_deployment(3, ready=2)).to_k8s() == {"desired": 3, "ready": 2, "summary": "2/3"}
    assert replica_status(None).summary == "0/0"


def test_ready_needs_streams_and_workers_but_not_autoscaling() -> None:
    streams = new_condition(ConditionType.STREAM_READY, True, "StreamReady").to_k8s()
    workers = new_condition(ConditionType.DEPLOYMENT_READY, False, "ReplicasUnavailable", "0 of 1").to_k8s()
    no_keda = new_condition(ConditionType.AUTOSCALING_READY, False, "KedaNotInstalled").to_k8s()
    assert ready_condition([streams], None).status == "Unknown"
    waiting = ready_condition([streams, workers, no_keda], None)
    assert (waiting.status, waiting.reason, waiting.message) == ("False", "ReplicasUnavailable", "0 of 1")
    workers["status"] = "True"
    assert ready_condition([streams, workers, no_keda], None).status == "True"
    error = new_condition(ConditionType.READY, False, "SecretNotFound", "no Secret")
    assert ready_condition([streams, workers], error).reason == "SecretNotFound"


def test_status_merge_patches_only_what_changed() -> None:
    streams = new_condition(ConditionType.STREAM_READY, True, "StreamReady")
    first = merged_status({}, {"queue": {"lag": 3}, "observedGeneration": 1}, [streams], None, 1)
    assert [c["type"] for c in first["conditions"]] == ["StreamReady", "Ready"]
    assert status_patch({}, first) == first
    again = merged_status(first, {"queue": {"lag": 3}}, [streams], None, 1)
    assert status_patch(first, again) == {}
    drained = merged_status(first, {"queue": {"lag": 0}, "replayRequest": None}, [], None, 1)
    assert status_patch(first, drained) == {"queue": {"lag": 0}}
    pending = {**first, "replayRequest": {"id": "x"}}
    assert status_patch(pending, merged_status(pending, {"replayRequest": None}, [], None, 1)) == {
        "replayRequest": None
    }


def test_status_patch_sends_only_the_figures_that_moved() -> None:
    current = {"queue": {"lag": 3, "pending": 1, "consumers": 2}, "replicas": {"ready": 1}}
    new = {"queue": {"lag": 4, "pending": 1}, "replicas": {"ready": 1}}
    assert status_patch(current, new) == {"queue": {"lag": 4, "consumers": None}}


def _planned(name: str, queue: dict[str, int], before: dict[str, int], written: float) -> PlannedWrite:
    record = StageRecord("ns", name, status={"queue": before}, figures_written=written)
    return PlannedWrite(record, {"queue": queue}, [], status_patch(record.status, {"queue": queue}))


def test_a_cycle_writes_changed_states_at_once_and_figures_of_the_longest_unwritten() -> None:
    stages = 3 * FIGURES_MAX_CYCLES * PATCH_CONCURRENCY
    budget = stages // FIGURES_MAX_CYCLES
    moved = [_planned(f"s{i}", {"lag": 5 + i, "pending": 1}, {"lag": 2, "pending": 1}, float(i)) for i in range(stages)]
    unchanged = _planned("same", {"lag": 2, "pending": 0}, {"lag": 2, "pending": 0}, 0.0)
    drained = _planned("drained", {"lag": 0, "pending": 0}, {"lag": 2, "pending": 0}, 1e9)
    filling = _planned("filling", {"lag": 1, "pending": 0}, {"lag": 0, "pending": 0}, 1e9)
    state = PlannedWrite(StageRecord("ns", "state", figures_written=1e9), {}, [], {"conditions": []})
    due = due_writes([*reversed(moved), unchanged, drained, filling, state], stages)
    # A stage that drained or began to queue, and any other change, go at once, whatever the budget.
    assert [p.record.name for p in due[:3]] == ["drained", "filling", "state"]
    # Figure-only changes: the longest unwritten first, a third of the stages a cycle.
    assert [p.record.name for p in due[3:]] == [f"s{i}" for i in range(budget)]
    # With few stages, one round of concurrent patches writes them all.
    assert len(due_writes(moved[:PATCH_CONCURRENCY], stages=PATCH_CONCURRENCY)) == PATCH_CONCURRENCY


def test_the_columns_say_how_old_the_figures_may_be() -> None:
    apart = DEFAULT_REFRESH_SECONDS
    assert f"within {FIGURES_MAX_CYCLES} status refreshes ({apart:g} s apart by default)" in FIGURES_AGE


@pytest.mark.parametrize(("value", "expected"), [("all", None), ("ALL", None), ("5", 5), (" 12 ", 12)])
def test_parse_replay_count(value: str, expected: int | None) -> None:
    assert parse_replay_count(value) == expected


@pytest.mark.parametrize("value", ["0", "-1", "five", "", "1.5"])
def test_parse_replay_count_rejects(value: str) -> None:
    with pytest.raises(ReplayRequestError, match=r"phoenix\.io/replay-dlq"):
        parse_replay_count(value)


def test_request_filters() -> None:
    body: dict[str, Any] = {"metadata": {"annotations": {"phoenix.io/restart": "a"}}, "status": {}}
    assert has_restart_request(body)
    body["status"]["handledRestart"] = "a"
    assert not has_restart_request(body)
    assert not has_replay_work(body)
    body["status"]["replayRequest"] = {"id": "1", "count": "all"}  # begun, annotation already removed
    assert has_replay_work(body)


def test_refresh_groups_stages_by_redis_url() -> None:
    def record(name: str, url: str | None) -> StageRecord:
        streams = StageKeys.for_stage(name, input=f"{name}:in", group="g", dlq=f"{name}:dlq")
        return StageRecord("ns", name, streams=streams, redis=RedisSpec.from_url(url) if url else None)

    groups = group_by_redis(
        [record("a", "redis://r1"), record("b", "redis://r2"), record("c", "redis://r1/0"), record("d", None)]
    )
    assert {redis.redacted: [r.name for r in members] for redis, members in groups.items()} == {
        "redis://r1:6379/0": ["a", "c"],
        "redis://r2:6379/0": ["b"],
    }


def test_masked_errors_and_records_hide_the_password() -> None:
    spec = RedisSpec.from_url("redis://:p%2Fw@h:1/0")
    assert (
        spec.masked("Error connecting to redis://:p%2Fw@h:1 (AUTH p/w)")
        == "Error connecting to redis://:***@h:1 (AUTH ***)"
    )
    assert "pw" not in repr(StageRecord("ns", "a", redis=RedisSpec.from_url("redis://:pw@h:1/0")))
    assert "pw" not in repr(RedisSpec.from_url("redis://:pw@h:1/0"))


def test_only_stages_that_missed_keda_are_rechecked() -> None:
    def body(reason: str | None) -> dict[str, object]:
        conditions = [] if reason is None else [{"type": "AutoscalingReady", "status": "False", "reason": reason}]
        return {"status": {"conditions": conditions}}

    assert waits_for_keda(body("KedaNotInstalled"))
    assert not waits_for_keda(body("AutoscalingDisabled"))
    assert not waits_for_keda(body(None))
    assert not waits_for_keda({})


def _wanted_deployment() -> dict[str, Any]:
    return {
        "metadata": {"name": "s", "labels": {"app": "s"}},
        "spec": {
            "replicas": 2,
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "img:1",
                            "env": [{"name": "A", "value": "1"}],
                            "resources": {"limits": {"cpu": 0.5, "memory": "512Mi"}},
                        }
                    ]
                }
            },
        },
    }


def test_server_defaults_and_foreign_fields_are_no_drift() -> None:
    actual = _wanted_deployment()
    actual["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "3"}
    container = actual["spec"]["template"]["spec"]["containers"][0]
    container["terminationMessagePath"] = "/dev/termination-log"
    container["resources"]["limits"]["cpu"] = "500m"  # the API server's canonical form of 0.5
    actual["status"] = {"readyReplicas": 2}
    assert differences(_wanted_deployment(), actual) == []


def test_changed_removed_and_added_items_are_drift() -> None:
    actual = _wanted_deployment()
    actual["spec"]["replicas"] = 5
    container = actual["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "img:2"
    container["env"].append({"name": "B", "value": "2"})
    del actual["metadata"]["labels"]
    assert differences(_wanted_deployment(), actual) == [
        "metadata.labels.app",
        "spec.replicas",
        "spec.template.spec.containers[0].image",
        "spec.template.spec.containers[0].env",
    ]
    assert describe("Deployment", "s", ["a", "b", "c", "d", "e"]) == (
        "Deployment s differed from the spec at a, b, c and 2 more"
    )


def test_none_means_must_be_absent() -> None:
    wanted = {"metadata": {"annotations": {"autoscaling.keda.sh/paused": None}}}
    assert differences(wanted, {"metadata": {}}) == []
    paused = {"metadata": {"annotations": {"autoscaling.keda.sh/paused": "true"}}}
    assert differences(wanted, paused) == ["metadata.annotations.autoscaling.keda.sh/paused"]


def _record(**status: Any) -> StageRecord:
    record = StageRecord("ns", "s", status=status)
    record.body = {"metadata": {"name": "s", "annotations": {}}, "status": {}}
    return record


def test_converger_picks_the_most_urgent_work() -> None:
    record = _record()
    view = current_view(record)
    assert view is not None and due_work(record, view, now=100.0) is None
    assert record.body is not None
    record.body["metadata"]["annotations"]["phoenix.io/restart"] = "r1"
    record.drift["Deployment s was deleted"] = "Deployment"
    view = current_view(record)
    assert view is not None and due_work(record, view, now=100.0) == "repair"  # a restart needs the Deployment
    record.drift.clear()
    assert due_work(record, view, now=100.0) == "restart"
    # The status this operator wrote wins over the watched copy, which may lag behind it.
    record.status = {"handledRestart": "r1"}
    view = current_view(record)
    assert view is not None and due_work(record, view, now=100.0) is None


def test_keda_is_rechecked_only_now_and_then() -> None:
    record = _record(conditions=[{"type": "AutoscalingReady", "status": "False", "reason": "KedaNotInstalled"}])
    view = current_view(record)
    assert view is not None and due_work(record, view, now=100.0) == "keda"
    record.keda_checked_at = 90.0
    assert due_work(record, view, now=100.0) is None


def test_a_stage_being_deleted_gets_no_work() -> None:
    record = _record()
    record.drift["Deployment s was deleted"] = "Deployment"  # garbage collection at work
    assert record.body is not None
    record.body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert current_view(record) is None


def test_watcher_successes_are_kept_out_of_the_log() -> None:
    quiet = QuietHandlers(["stage_seen", "child_seen"])

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, message, None, None)

    assert not quiet.filter(record("Handler 'child_seen' succeeded."))
    assert quiet.filter(record("Handler 'reconcile' succeeded."))
    assert quiet.filter(record("Handler 'child_seen' failed temporarily: boom"))


def test_failed_work_waits_five_seconds_doubling_up_to_two_minutes() -> None:
    assert [retry_delay(attempt) for attempt in range(7)] == [5.0, 10.0, 20.0, 40.0, 80.0, 120.0, 120.0]
    assert retry_delay(10_000) == MAX_BACKOFF_SECONDS == 120.0


def test_kopf_retries_a_temporary_failure_after_the_backoff_and_never_a_permanent_one() -> None:
    temporary = kopf_retry(StageError("RedisUnavailable", "cannot reach Redis"), retry=2)
    assert isinstance(temporary, kopf.TemporaryError)
    assert temporary.delay == 20.0
    assert str(temporary) == "RedisUnavailable: cannot reach Redis"
    permanent = kopf_retry(StageError("InvalidSpec", "spec.dlq is the input", permanent=True), retry=2)
    assert isinstance(permanent, kopf.PermanentError)
    assert not isinstance(permanent, kopf.TemporaryError)


def test_the_reconcile_and_delete_handlers_keep_their_kopf_ids() -> None:
    """kopf keeps a handler's retry count in a phoenix.io/<id> annotation: renaming a handler must not change it."""
    # kopf has no public listing of its registered handlers; its registry keeps the changing ones here.
    registered = kopf.get_default_registry()._changing.get_all_handlers()
    # The resume and create handlers of a stage share the id "reconcile"; kopf suffixes the field a handler watches.
    # kopf types a handler's fn as its ChangingFn protocol, which has no __name__; it is the function itself.
    assert sorted((handler.fn.__name__, handler.id) for handler in registered) == [  # type: ignore[attr-defined]
        ("stage_changed", "reconcile"),
        ("stage_changed", "reconcile"),
        ("stage_changed", "reconcile/spec"),
        ("stage_deleted", "delete/spec.deletionPolicy"),
    ]


def test_a_stage_routing_to_itself_is_an_invalid_spec() -> None:
    parser = {"name": "parser", "stage": "parser"}
    spec: dict[str, Any] = {
        "processor": "router",
        "image": "img:1",
        "redis": {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}},
        "outputs": [parser, {"name": "again", "stage": "router"}],
    }
    body = {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": "router", "namespace": "docs", "uid": "u"},
        "spec": spec,
    }
    with pytest.raises(StageError, match="'again' names stage 'router', whose input is this stage's own") as caught:
        parse_stage(body)
    assert caught.value.permanent
    assert parse_stage({**body, "spec": {**spec, "outputs": [parser]}}).spec.outputs
