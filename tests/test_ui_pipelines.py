"""`phoenix ui`'s parts without a server: PhoenixStages grouped into pipelines with their figures, the command's
checks, and the page's files in the wheel."""

from __future__ import annotations

import argparse
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from phoenix.cli.ui.command import UiConfigError, read_token
from phoenix.cli.ui.pipelines import Edge, pipelines_of
from phoenix.cli.ui.source import shown_fields
from phoenix.kube_names import PIPELINE_LABEL
from tests.fixtures.control_plane import REPO_ROOT
from tests.fixtures.operator_process import VENV_BIN


def stage(
    name: str,
    namespace: str = "team-a",
    *,
    to: str | None = None,
    outputs: dict[str, str] | None = None,
    label: str | None = None,
    **queue: int,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"processor": "p"}
    if to:
        spec["output"] = {"stage": to}
    if outputs:
        spec["outputs"] = [{"name": out, "stage": target} for out, target in outputs.items()]
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {PIPELINE_LABEL: label} if label else {}},
        "spec": spec,
        "status": {
            "queue": queue,
            "replicas": {"summary": "1/1"},
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "Backpressure", "status": "True" if name == "parser" else "False"},
            ],
        },
    }


def test_a_chain_is_one_pipeline_with_each_edge_lagging_by_the_next_stages_backlog() -> None:
    stages = [
        stage("grouper", lag=2, pending=0, dlqLength=0, oldestUnfinishedSeconds=3),
        stage("router", to="parser", lag=7, pending=1, dlqLength=2, oldestUnfinishedSeconds=40),
        stage("parser", to="grouper", lag=5, pending=3, dlqLength=0),
    ]
    (pipeline,) = pipelines_of(stages, {("team-a", "router"): 4.5})
    assert (pipeline.namespace, pipeline.name, pipeline.labelled) == ("team-a", "router", False)
    assert [(s.name, s.column) for s in pipeline.stages] == [("router", 0), ("parser", 1), ("grouper", 2)]
    assert pipeline.edges == [Edge("router", "parser", None, 5), Edge("parser", "grouper", None, 2)]
    router, parser, grouper = pipeline.stages
    assert (router.backlog, router.in_flight, router.dlq, router.rate, router.replicas) == (7, 1, 2, 4.5, "1/1")
    assert parser.backpressure and not router.backpressure and router.ready
    assert grouper.rate is None  # not measured: shown as unknown, never as 0
    assert pipeline.oldest_seconds == 40  # the largest of the stages' own
    assert pipeline.p99_seconds is None  # no stage's status has it


def test_the_pipelines_p99_merges_its_final_stages_latency_as_its_status_does() -> None:
    final = [stage("lab"), stage("img")]
    final[0]["status"]["latency"] = {"buckets": [{"le": "0.5", "count": 98}, {"le": "1.0", "count": 1}]}
    final[1]["status"]["latency"] = {"buckets": [{"le": "10.0", "count": 1}]}
    (pipeline,) = pipelines_of([stage("router", outputs={"a": "lab", "b": "img"}), *final])
    # 100 records: the 99th is the last of the 0.5..1 bucket's one, its upper bound.
    assert pipeline.p99_seconds == 1.0


def test_named_outputs_are_edges_named_after_their_output() -> None:
    stages = [
        stage("router", outputs={"lab": "parser", "scans": "imaging"}),
        stage("parser", lag=1),
        stage("imaging", lag=4),
    ]
    (pipeline,) = pipelines_of(stages)
    assert pipeline.edges == [
        Edge("router", "imaging", "scans", 4),
        Edge("router", "parser", "lab", 1),
    ]
    assert [(s.name, s.column) for s in pipeline.stages] == [("router", 0), ("imaging", 1), ("parser", 1)]


def test_labelled_stages_group_by_their_label_and_the_rest_by_their_edges_per_namespace() -> None:
    stages = [
        stage("a", label="docs", to="b"),
        stage("b", label="docs"),
        stage("lonely", label="docs"),  # not connected, still the pipeline's
        stage("x", to="y"),
        stage("y"),
        stage("z", to="missing"),  # an edge to a stage that does not exist is not drawn
        stage("x", namespace="team-b", to="y"),
    ]
    found = {(p.namespace, p.name): p for p in pipelines_of(stages)}
    assert set(found) == {("team-a", "docs"), ("team-a", "x"), ("team-a", "z"), ("team-b", "x")}
    assert {s.name for s in found["team-a", "docs"].stages} == {"a", "b", "lonely"}
    assert found["team-a", "docs"].labelled and not found["team-a", "x"].labelled
    assert found["team-a", "z"].edges == [] and found["team-b", "x"].edges == []


def test_a_cycle_is_drawn_with_bounded_columns() -> None:
    (pipeline,) = pipelines_of([stage("a", to="b"), stage("b", to="c"), stage("c", to="a")])
    assert len(pipeline.edges) == 3 and max(s.column for s in pipeline.stages) <= 2


def test_a_dead_letter_shows_no_record_data_unless_asked() -> None:
    letter: dict[str, str | int] = {
        "record_id": "r-1",
        "user_id": "patient-7",
        "data": '{"document_url": "s3://x"}',
        "packed_fields": "...",
        "customer_field": "x",
        "error_type": "RecordNotFoundError",
        "error": "no document",
        "failed_at": "2026-12-06T22:00:00+00:00",
        "first_failed_at": "2026-12-06T21:59:00+00:00",
        "attempts": "3",
        "partition": 1,
    }
    hidden = {"user_id", "data", "packed_fields", "customer_field"}
    assert set(shown_fields(letter, show_data=False)) == set(letter) - hidden
    assert shown_fields(letter, show_data=True) == letter


def options(**given: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"no_auth": False, "token_file": None, "host": "127.0.0.1", **given})


def test_the_token_is_required_unless_no_auth_on_loopback(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    assert read_token(options(token_file=token_file)) == "s3cret-token"
    assert read_token(options(no_auth=True)) is None
    assert read_token(options(no_auth=True, host="::1")) is None
    refusals = {
        "give --token-file FILE": options(),
        "loopback --host only, not '0.0.0.0'": options(no_auth=True, host="0.0.0.0"),
        "not both": options(no_auth=True, token_file=token_file),
        "cannot read --token-file": options(token_file=tmp_path / "absent"),
    }
    for message, given in refusals.items():
        with pytest.raises(UiConfigError, match=message):
            read_token(given)
    token_file.write_text("two words")
    with pytest.raises(UiConfigError, match="holds no token") as refused:
        read_token(options(token_file=token_file))
    assert "two words" not in str(refused.value)  # the file's content is never repeated


@pytest.mark.subprocess
@pytest.mark.timeout(180)
def test_the_wheel_carries_the_page(tmp_path: Path) -> None:
    """The image installs the wheel: the page's files must be in it (pyproject's package-data). Built as pip builds
    it, in an isolated environment with the setuptools build-system.requires names."""
    subprocess.run(
        [str(VENV_BIN / "pip"), "wheel", "--no-deps", "-q", "-w", str(tmp_path), "."],
        cwd=REPO_ROOT,
        check=True,
        timeout=120,
    )
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"phoenix/cli/ui/static/{name}" for name in ("index.html", "app.js", "style.css")} <= names
