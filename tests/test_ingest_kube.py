"""`phoenix ingest` finding its pipelines through the real API server: the example's three PhoenixStages (stored
only, no operator) labelled as the pipeline `docs`, read with a ServiceAccount holding exactly the chart's Role
(get and list PhoenixStages, get Secrets); records land in the first stage's input, the trace names the three
stages, an unknown pipeline is a 404."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis as sync_redis
from kubernetes import client

from phoenix.keys import StageKeys
from phoenix.kube_names import PIPELINE_LABEL
from tests.fixtures.cluster_objects import service_account_kubeconfig, service_account_with_role
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.ingest import call, running_ingest
from tests.fixtures.operator_process import kubectl_apply, sample_documents
from tests.fixtures.replies import stream_entries_now

pytestmark = [pytest.mark.kube, pytest.mark.subprocess]
TOKEN = "ingest-kube-token-1b9f07"
# The chart's Role phoenix-ingest (charts/phoenix/templates/ingest.yaml; tests/test_helm_chart.py checks its rules).
INGEST_RULES = [
    client.V1PolicyRule(api_groups=["phoenix.io"], resources=["phoenixstages"], verbs=["get", "list"]),
    client.V1PolicyRule(api_groups=[""], resources=["secrets"], verbs=["get"]),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("redis_db", [13], indirect=True)
def test_ingest_serves_a_pipeline_of_phoenixstages_with_the_charts_rights_only(
    kube_cluster: ControlPlane,
    kube_api: client.ApiClient,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
    tmp_path: Path,
) -> None:
    url, valkey = redis_db
    ns = kube_namespace
    documents = sample_documents(url, ns)
    for doc in documents:
        if doc["kind"] == "PhoenixStage":
            doc["metadata"]["labels"] = {PIPELINE_LABEL: "docs"}
    kubectl_apply(kube_cluster, documents)
    service_account_with_role(kube_api, ns, "phoenix-ingest", INGEST_RULES)
    kubeconfig = service_account_kubeconfig(kube_cluster, ns, "phoenix-ingest", tmp_path / "ingest.kubeconfig")
    options = (f"--kubeconfig={kubeconfig}", f"--namespace={ns}", "--refresh=1")
    with running_ingest(tmp_path, TOKEN, *options) as base:
        status, _, body = call(
            base, "POST", "/v1/pipelines/docs/records", {"record_id": "k-1", "data": {"a": 1}}, TOKEN
        )
        assert status == 201, body
        assert body["stage"] == "router"
        router = StageKeys.for_stage("router", ns)
        [(entry_id, fields)] = stream_entries_now(valkey, router.input)
        assert entry_id == body["records"][0]["entry_id"] and fields["record_id"] == "k-1"
        assert call(base, "POST", "/v1/pipelines/docs/records", {"record_id": "k-1"}, TOKEN)[0] == 200
        status, _, trace = call(base, "GET", "/v1/pipelines/docs/records/k-1", token=TOKEN)
        assert status == 200
        assert [(s["stage"], s["state"]) for s in trace["stages"]] == [
            ("router", "waiting"),
            ("parser", "not seen"),
            ("grouper", "not seen"),
        ]
        status, _, unknown = call(base, "POST", "/v1/pipelines/other/records", {"record_id": "k-2"}, TOKEN)
        assert status == 404 and "no pipeline 'other'" in unknown["error"]
    assert not [log for log in tmp_path.glob("ingest-*.log") if url in log.read_text()]  # no Redis URL logged
