"""The operator end to end: `phoenix operator` with the manifests/rbac identity against the local control plane,
workers played from the generated Deployments, records flowing through router -> parser -> grouper."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from kubernetes import client

from phoenix.keys import StageKeys
from phoenix.kube_names import REPLAY_ANNOTATION, RESTART_ANNOTATION, STAGE_LABEL
from phoenix.operator.status.durability import redis_risk_condition
from phoenix.stages.data_keys import grouped_key
from phoenix.stages.samples import ensure_samples
from phoenix.worker_runtime.redis_risk import RedisRisk, assess_redis
from tests.fixtures.cluster_objects import ensure_namespace, install_keda_crds
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.kube_models import custom_object, metadata_of, name_of
from tests.fixtures.kubelet_player import KubeletPlayer
from tests.fixtures.operator_process import (
    condition_of_reason,
    event_messages,
    event_reasons,
    existing_stage,
    final_stage,
    health,
    kubectl_apply,
    kubectl_columns,
    read_or_none,
    ready_reason,
    redis_db_url,
    running_operator,
    sample_documents,
    stage_condition,
    stage_events,
    stage_status,
    wait_ready,
)
from tests.fixtures.replies import stream_entries_now
from tests.fixtures.workers import ROOT

pytestmark = pytest.mark.kube
STAGES = ("router", "parser", "grouper")


@pytest.fixture(scope="module")
def operator(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Iterator[str]:
    """The operator for the whole module; yields its liveness URL."""
    with running_operator(kube_cluster, operator_kubeconfig) as (process, liveness):
        yield liveness
        assert process.alive, process.failure("died during the tests")


def _enqueue(connection: sync_redis.Redis, namespace: str, record_id: str, document: Path) -> None:
    data = json.dumps({"document_url": document.resolve().as_uri()})
    connection.xadd(
        StageKeys.for_stage("router", namespace).input, {"record_id": record_id, "user_id": "u1", "data": data}
    )


def _worker_report(players: dict[str, KubeletPlayer]) -> str:
    """What the played pods did: start errors and the end of each worker's log."""
    lines = []
    for stage, player in players.items():
        lines.append(f"{stage}: start errors {player.start_errors}")
        lines += [f"--- {pod}\n{process.log_tail(15)}" for pod, process in player.processes().items()]
    return "\n".join(lines)


async def _assess(url: str) -> RedisRisk:
    async with aioredis.Redis.from_url(url, decode_responses=True) as client:
        return await assess_redis(client)


def _replica_sets(api: client.ApiClient, namespace: str, stage: str) -> set[str]:
    found = client.AppsV1Api(api).list_namespaced_replica_set(namespace, label_selector=f"{STAGE_LABEL}={stage}")
    return {name_of(rs) for rs in found.items}


@dataclass
class Pipeline:
    """The sample pipeline of this module: its namespace, Redis database, documents and played workers."""

    namespace: str
    url: str
    connection: sync_redis.Redis
    documents: list[Path]
    workdir: Path
    players: dict[str, KubeletPlayer] = field(default_factory=dict)


@pytest.fixture(scope="module")
def pipeline(
    operator: str,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pipeline]:
    """router -> parser -> grouper applied once for the module (Redis database 1, a namespace of its own), reconciled,
    with the sample documents enqueued while no worker runs yet (the `processed` fixture starts them)."""
    ns = f"t-pipeline-{uuid.uuid4().hex[:6]}"
    ensure_namespace(kube_cluster, ns)
    url = redis_db_url(redis_url, 1)
    workdir = tmp_path_factory.mktemp("pipeline")
    with sync_redis.Redis.from_url(url, decode_responses=True) as connection:
        connection.flushdb()
        kubectl_apply(kube_cluster, sample_documents(url, ns, workdir / "docs"))
        eventually(lambda: all(stage_status(kube_cluster, ns, s).get("streams") for s in STAGES), "streams in status")
        documents = ensure_samples(workdir / "docs")
        for i, document in enumerate(documents):
            _enqueue(connection, ns, f"rec-{i}", document)
        built = Pipeline(ns, url, connection, documents, workdir)
        try:
            yield built
        finally:
            for player in built.players.values():
                player.stop()
            client.CoreV1Api(kube_api).delete_namespace(ns)


@pytest.fixture(scope="module")
def processed(pipeline: Pipeline, kube_cluster: ControlPlane, kube_api: client.ApiClient) -> Pipeline:
    """The pipeline with its workers played and every sample record grouped. KEDA is not running here, so the
    parser (replicas.min 0) is scaled as KEDA would."""
    ns = pipeline.namespace
    for stage in STAGES:
        pipeline.players[stage] = KubeletPlayer(kube_cluster, ns, stage)
        pipeline.players[stage].start()
    client.AppsV1Api(kube_api).patch_namespaced_deployment_scale("parser", ns, {"spec": {"replicas": 1}})
    try:
        eventually(
            lambda: all(
                pipeline.connection.exists(grouped_key(ns, f"rec-{i}")) for i in range(len(pipeline.documents))
            ),
            "every record grouped",
            timeout=120,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_worker_report(pipeline.players)}") from None
    return pipeline


@pytest.mark.timeout(180)
def test_streams_groups_and_children_exist_before_any_worker(
    pipeline: Pipeline, kube_cluster: ControlPlane, kube_api: client.ApiClient
) -> None:
    ns, connection = pipeline.namespace, pipeline.connection
    for stage in STAGES:
        keys = StageKeys.for_stage(stage, ns)
        assert connection.xinfo_groups(keys.input)[0]["name"] == keys.consumer_group
        assert connection.xlen(keys.dlq) == 0
        deployment = client.AppsV1Api(kube_api).read_namespaced_deployment(stage, ns)
        assert [ref.kind for ref in metadata_of(deployment).owner_references or []][:1] == ["PhoenixStage"]
    scaled = custom_object(client.CustomObjectsApi(kube_api), "keda.sh", "v1alpha1", ns, "scaledobjects", "parser")
    assert scaled["spec"]["maxReplicaCount"] == 20
    assert stage_condition(kube_cluster, ns, "router", "AutoscalingReady")["status"] == "True"


def test_the_backlog_shows_in_kubectl_get(pipeline: Pipeline, kube_cluster: ControlPlane) -> None:
    eventually(
        lambda: (
            kubectl_columns(kube_cluster, "phoenixstages", pipeline.namespace).get("router", {}).get("BACKLOG")
            == str(len(pipeline.documents))
        ),
        "the router's backlog in kubectl get",
        timeout=30,
    )


def test_the_queues_drain_and_the_stages_are_ready(
    processed: Pipeline, kube_cluster: ControlPlane, kube_api: client.ApiClient
) -> None:
    ns = processed.namespace

    def drained() -> bool:
        rows = kubectl_columns(kube_cluster, "phoenixstages", ns)
        return all(rows.get(s, {}).get("BACKLOG") == "0" and rows.get(s, {}).get("PENDING") == "0" for s in STAGES)

    eventually(drained, "backlog and pending back to 0 in kubectl get", timeout=30)
    assert (
        kubectl_columns(kube_cluster, "phoenixstages", ns)["parser"]["THROTTLED"] == "False"
    )  # the Backpressure condition's column
    # The server's durability, as the workers' start line and the operator read it (the tests' Valkey keeps
    # nothing on disk, a REDIS_URL given by the user may).
    risk = asyncio.run(_assess(processed.url))
    found = stage_condition(kube_cluster, ns, "router", "RedisRisk")
    assert (found["status"], found["message"]) == (redis_risk_condition(risk).status, risk.describe())
    # The operator left KEDA's replica count alone.
    assert client.AppsV1Api(kube_api).read_namespaced_deployment("parser", ns).spec.replicas == 1
    eventually(lambda: stage_condition(kube_cluster, ns, "router")["status"] == "True", "router Ready")


def test_a_restart_rolls_the_workers_once_per_value(
    processed: Pipeline, kube_cluster: ControlPlane, kube_api: client.ApiClient
) -> None:
    ns = processed.namespace
    before = _replica_sets(kube_api, ns, "router")
    kube_cluster.kubectl("annotate", "phoenixstage", "router", "-n", ns, f"{RESTART_ANNOTATION}=r1")
    eventually(lambda: len(_replica_sets(kube_api, ns, "router")) == len(before) + 1, "a new ReplicaSet")
    eventually(lambda: stage_status(kube_cluster, ns, "router").get("handledRestart") == "r1", "restart recorded")
    assert stage_status(kube_cluster, ns, "router")["lastRestart"]
    kube_cluster.kubectl("annotate", "--overwrite", "phoenixstage", "router", "-n", ns, f"{RESTART_ANNOTATION}=r1")
    kube_cluster.kubectl("label", "phoenixstage", "router", "-n", ns, "touched=yes")
    assert len(_replica_sets(kube_api, ns, "router")) == len(before) + 1


def test_a_replay_brings_a_dead_letter_back(
    processed: Pipeline, kube_cluster: ControlPlane, kube_api: client.ApiClient
) -> None:
    """A record whose document is missing is dead-lettered; once the document exists, a replay processes it."""
    ns, connection = processed.namespace, processed.connection
    missing = processed.workdir / "docs" / "late.pdf"  # under the router's DOCUMENT_ROOT
    _enqueue(connection, ns, "late", missing)
    eventually(
        lambda: kubectl_columns(kube_cluster, "phoenixstages", ns)["router"]["DLQ"] == "1",
        "the DLQ column at 1",
        timeout=60,
    )
    missing.write_bytes(processed.documents[0].read_bytes())
    kube_cluster.kubectl("annotate", "phoenixstage", "router", "-n", ns, f"{REPLAY_ANNOTATION}=all")
    eventually(lambda: connection.exists(grouped_key(ns, "late")), "the replayed record processed", timeout=60)
    last = eventually(lambda: stage_status(kube_cluster, ns, "router").get("lastReplay"), "lastReplay in status")
    assert (last["requested"], last["moved"]) == (1, 1)
    replayed = eventually(
        lambda: event_messages(kube_api, ns, "router", "DlqReplayed"),
        "a DlqReplayed Event",
    )
    # The replay is a repair: recorded in the stage's audit stream, which the Event names.
    audit = StageKeys.for_stage("router", ns).audit
    [message] = replayed
    assert message.startswith("moved 1 DLQ entries back to the input (requested 1) by phoenix-operator@")
    assert message.endswith(f", recorded in {audit}")
    [(_, entry)] = stream_entries_now(connection, audit)
    assert (entry["action"], entry["count"]) == ("dlq-replay", "1")
    assert entry["actor"].startswith("phoenix-operator@") and f" by {entry['actor']}, " in message
    stage = existing_stage(kube_cluster, ns, "router")
    assert REPLAY_ANNOTATION not in stage["metadata"].get("annotations", {})
    assert "replayRequest" not in stage["status"]


def test_the_refresh_asks_each_redis_once_per_cycle(processed: Pipeline, operator: str) -> None:
    # One Redis round trip per refresh cycle for all stages of this Redis (other tests' Redis databases add theirs).
    refresh = health(operator)["statusRefresh"]["last"]
    assert 1 <= refresh["redis_round_trips"] < refresh["stages"]


def test_deletion_policy_delete_removes_the_redis_data(
    processed: Pipeline, kube_cluster: ControlPlane, kube_api: client.ApiClient
) -> None:
    """Last of the pipeline's tests: it deletes the router."""
    ns, connection = processed.namespace, processed.connection
    kube_cluster.kubectl(
        "patch", "phoenixstage", "router", "-n", ns, "--type=merge", "-p", '{"spec": {"deletionPolicy": "Delete"}}'
    )
    generation = existing_stage(kube_cluster, ns, "router")["metadata"]["generation"]
    eventually(
        lambda: stage_condition(kube_cluster, ns, "router")["observedGeneration"] == generation,
        "the policy change reconciled",
    )
    processed.players.pop("router").stop()
    assert kube_cluster.kubectl("delete", "phoenixstage", "router", "-n", ns, "--timeout=60s").returncode == 0
    router = StageKeys.for_stage("router", ns)
    assert not connection.exists(router.input, router.dlq, router.owner)
    assert connection.exists(StageKeys.for_stage("parser", ns).input)  # Retain keeps the others' data

    def router_children_gone() -> bool:
        return read_or_none(client.AppsV1Api(kube_api).read_namespaced_deployment, "router", ns) is None

    eventually(router_children_gone, "the router Deployment garbage-collected")


@pytest.mark.timeout(270)
@pytest.mark.parametrize("redis_db", [2], indirect=True)
def test_without_keda_the_stage_runs_at_min(
    operator: str,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    without_keda: None,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, _ = redis_db
    secret, router = sample_documents(url, kube_namespace)[:2]
    router["spec"]["replicas"] = {"min": 2, "max": 5}
    kubectl_apply(kube_cluster, [secret, router])

    autoscaling = eventually(
        lambda: condition_of_reason(kube_cluster, kube_namespace, "router", "KedaNotInstalled", "AutoscalingReady"),
        "AutoscalingReady=False/KedaNotInstalled",
        timeout=60,
    )
    assert autoscaling["status"] == "False"
    assert "replicas.min (2)" in autoscaling["message"]
    deployment = client.AppsV1Api(kube_api).read_namespaced_deployment("router", kube_namespace)
    assert deployment.spec.replicas == 2

    # KEDA installed later: the operator notices by itself and hands the stage over to it.
    install_keda_crds(kube_cluster)
    eventually(
        lambda: stage_condition(kube_cluster, kube_namespace, "router", "AutoscalingReady").get("status") == "True",
        "AutoscalingReady=True once KEDA is there",
        timeout=90,
    )
    scaled = custom_object(
        client.CustomObjectsApi(kube_api), "keda.sh", "v1alpha1", kube_namespace, "scaledobjects", "router"
    )
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (2, 5)
    adopted = eventually(
        lambda: [e.type for e in stage_events(kube_api, kube_namespace, "router", reason="KedaAdopted")],
        "a KedaAdopted Event",
    )
    assert adopted == ["Normal"]


@pytest.mark.timeout(270)
@pytest.mark.parametrize("redis_db", [3], indirect=True)
def test_bad_redis_settings_become_conditions_and_events(
    operator: str,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    secret, router, parser, grouper = sample_documents(url, ns)
    password = "s3cret-never-shown"
    unreachable = {
        **secret,
        "metadata": {**secret["metadata"], "name": "unreachable"},
        "stringData": {"url": f"redis://:{password}@127.0.0.1:1/0", "password": password},
    }
    parser["spec"]["redis"] = {"urlSecretRef": {"name": "unreachable", "key": "url"}}
    router["spec"]["redis"] = {"urlSecretRef": {"name": "not-yet", "key": "url"}}
    grouper["spec"]["replicas"] = {"min": 0, "max": 1}
    kubectl_apply(kube_cluster, [secret, unreachable, router, parser, grouper])

    def reason(name: str) -> str | None:
        return ready_reason(kube_cluster, ns, name)

    eventually(lambda: reason("router") == "SecretNotFound", "router Ready=False/SecretNotFound")
    eventually(lambda: reason("parser") == "RedisUnavailable", "parser Ready=False/RedisUnavailable", timeout=60)
    # The operator keeps serving the stage that is fine.
    wait_ready(kube_cluster, ns, "grouper")

    eventually(
        lambda: "SecretNotFound" in event_reasons(kube_api, ns, "router", "Warning"), "a Warning Event on router"
    )
    eventually(lambda: stage_events(kube_api, ns, "parser", reason="RedisUnavailable"), "a Warning Event on parser")
    shown = json.dumps([existing_stage(kube_cluster, ns, "parser")["status"]]) + " ".join(
        e.message or "" for e in stage_events(kube_api, ns, "parser")
    )
    assert password not in shown

    # Creating the Secret heals the stage on the next retry.
    fixed = {**secret, "metadata": {**secret["metadata"], "name": "not-yet"}}
    kubectl_apply(kube_cluster, [fixed])
    eventually(lambda: stage_status(kube_cluster, ns, "router").get("streams"), "router reconciled", timeout=60)
    router_keys = StageKeys.for_stage("router", ns)
    assert connection.xinfo_groups(router_keys.input)[0]["name"] == router_keys.consumer_group


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [4], indirect=True)
def test_pause_scales_to_zero_and_pauses_keda_then_restores(
    operator: str,
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    url, _ = redis_db
    ns = kube_namespace
    secret, router = sample_documents(url, ns)[:2]
    router["spec"]["replicas"] = {"min": 2, "max": 5}
    kubectl_apply(kube_cluster, [secret, router])
    apps = client.AppsV1Api(kube_api)
    custom = client.CustomObjectsApi(kube_api)

    def replicas() -> int | None:
        try:
            return apps.read_namespaced_deployment("router", ns).spec.replicas
        except client.ApiException:
            return None

    def keda_paused() -> dict[str, str]:
        scaled = custom_object(custom, "keda.sh", "v1alpha1", ns, "scaledobjects", "router")
        annotations = scaled["metadata"].get("annotations") or {}
        return {k: v for k, v in annotations.items() if k.startswith("autoscaling.keda.sh/paused")}

    eventually(lambda: replicas() == 2, "the Deployment at replicas.min")
    eventually(
        lambda: stage_condition(kube_cluster, ns, "router", "AutoscalingReady").get("status") == "True",
        "the ScaledObject in place",
        timeout=90,
    )
    assert keda_paused() == {}

    pause = ("patch", "phoenixstage", "router", "-n", ns, "--type=merge", "-p")

    kube_cluster.kubectl(*pause, '{"spec": {"paused": true}}')
    eventually(lambda: replicas() == 0, "paused: scaled to zero")
    assert keda_paused() == {"autoscaling.keda.sh/paused": "true", "autoscaling.keda.sh/paused-replicas": "0"}
    eventually(lambda: "Paused" in event_reasons(kube_api, ns, "router"), "a Paused Event")

    kube_cluster.kubectl(*pause, '{"spec": {"paused": false}}')
    eventually(lambda: replicas() == 2, "unpaused: back to replicas.min")
    eventually(lambda: keda_paused() == {}, "KEDA no longer paused")
    eventually(lambda: "Resumed" in event_reasons(kube_api, ns, "router"), "a Resumed Event")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [10], indirect=True)
def test_the_rate_limited_column_shows_the_records_held_back_now(
    operator: str,
    kube_cluster: ControlPlane,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    redis_db: tuple[str, sync_redis.Redis],
) -> None:
    """A stage of one record a minute given five: one runs, four wait in the retry set, and `kubectl get -o wide`
    says RATE-LIMITED 4, what is held back now (tests/test_rate_limits.py shows the count going down)."""
    url, connection = redis_db
    ns = kube_namespace
    limits = [{"rate": 1, "per": "minute", "burst": 1}]
    stage = final_stage(url, ns, "limited", processor="tests.processors:ScriptedProcessor", rateLimits=limits)
    stage[1]["spec"]["replicas"] = {"min": 1, "max": 1}
    kubectl_apply(kube_cluster, stage)
    eventually(lambda: stage_status(kube_cluster, ns, "limited").get("streams"), "the stage reconciled")
    for i in range(5):
        connection.xadd(StageKeys.for_stage("limited", ns).input, {"record_id": f"r{i}", "user_id": "u", "data": "{}"})
    player = kubelet_player(ns, "limited", {"PYTHONPATH": str(ROOT)})  # the test processors
    player.start()
    try:
        eventually(
            lambda: (
                kubectl_columns(kube_cluster, "phoenixstages", ns, wide=True).get("limited", {}).get("RATE-LIMITED")
                == "4"
            ),
            "four records held back in kubectl get -o wide",
            timeout=90,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_worker_report({'limited': player})}") from None
    assert stage_status(kube_cluster, ns, "limited")["queue"]["throttled"] == 4
    assert connection.zcard(StageKeys.for_stage("limited", ns).retry) == 4


@pytest.mark.timeout(210)
@pytest.mark.parametrize("redis_db", [14], indirect=True)
def test_a_stage_held_back_by_its_output_shows_backpressure(
    operator: str,
    kube_cluster: ControlPlane,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    redis_db: tuple[str, sync_redis.Redis],
    tmp_path: Path,
) -> None:
    """The parser does not run (replicas.min 0, no KEDA here): the router stops at its output's high-water mark,
    and `kubectl get` says which stage is held back. Once the parser runs, the router reads again."""
    url, connection = redis_db
    ns = kube_namespace
    secret, router, parser = sample_documents(url, ns, tmp_path / "docs")[:3]
    router["spec"]["env"].append({"name": "OUTPUT_HIGH_WATER", "value": "2"})
    kubectl_apply(kube_cluster, [secret, router, parser])
    eventually(lambda: stage_status(kube_cluster, ns, "parser").get("streams"), "parser reconciled")
    documents = ensure_samples(tmp_path / "docs")
    for i in range(2):
        for j, document in enumerate(documents):
            _enqueue(connection, ns, f"rec-{i}-{j}", document)
    players = {"router": kubelet_player(ns, "router")}
    players["router"].start()
    try:
        eventually(
            lambda: kubectl_columns(kube_cluster, "phoenixstages", ns).get("router", {}).get("THROTTLED") == "True",
            "the router throttled in kubectl get",
            timeout=60,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_worker_report(players)}") from None
    found = stage_condition(kube_cluster, ns, "router", "Backpressure")
    assert found["reason"] == "OutputOverHighWater" and "unfinished entries" in found["message"]
    assert (
        connection.xinfo_groups(StageKeys.for_stage("router", ns).input)[0]["lag"] > 0
    )  # the rest waits, unread, untrimmed

    kube_cluster.kubectl("scale", "deployment", "parser", "-n", ns, "--replicas=1")
    players["parser"] = kubelet_player(ns, "parser")
    players["parser"].start()
    try:
        eventually(
            lambda: (
                connection.xinfo_groups(StageKeys.for_stage("parser", ns).input)[0]["entries-read"]
                == 2 * len(documents)
            ),
            "every record routed and parsed once",
            timeout=120,
        )
        eventually(
            lambda: kubectl_columns(kube_cluster, "phoenixstages", ns)["router"]["THROTTLED"] == "False",
            "the router reads again",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{_worker_report(players)}") from None
