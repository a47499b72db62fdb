"""`phoenix ui` as a real process against the API server, a real operator reconciling the example's three chained
PhoenixStages on the session's Valkey and a real router worker, read by headless Chromium: the page draws the DAG
and its figures change as records flow and dead letters appear."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis

from phoenix.keys import StageKeys
from phoenix.stages.samples import ensure_samples
from tests.fixtures.browser import Page, chromium_page, needs_chromium
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.operator_process import VENV_BIN, kubectl_apply, running_operator, sample_documents, stage_status
from tests.fixtures.processes import LoggedProcess, free_loopback_port

STAGES = ("router", "parser", "grouper")
PAUSE = '{"spec": {"paused": true}}'
TOKEN = "ui-test-token-5f1c2a"  # a test's own; what matters is that it never shows in a log
# What the page shows, read from its DOM: each stage's figures by data-figure, each edge's label, the DLQ table.
READ_PAGE = """(() => {
  const stages = {};
  for (const box of document.querySelectorAll("[data-stage]")) {
    const figures = {};
    for (const f of box.querySelectorAll("[data-figure]")) figures[f.dataset.figure] = f.textContent;
    stages[box.dataset.stage] = figures;
  }
  const edges = {};
  for (const e of document.querySelectorAll("[data-edge]")) edges[e.dataset.edge] = e.textContent;
  const dlq = [...document.querySelectorAll("#dlq-rows tr")].map((r) => [...r.cells].map((c) => c.textContent));
  const head = [...document.querySelectorAll("#dlq-head th")].map((c) => c.textContent);
  return {stages, edges, dlq, head, problem: document.getElementById("problem").textContent,
          oldest: (document.querySelector("[data-figure=oldest]") || {}).textContent,
          text: document.body.innerText};
})()"""


@contextmanager
def running_ui(plane: ControlPlane, workdir: Path, *options: str) -> Iterator[str]:
    """`phoenix ui OPTIONS` with the admin's kubeconfig, reading every second; yields its base URL."""
    port = free_loopback_port()
    argv = [str(VENV_BIN / "phoenix"), "ui", f"--port={port}", "--interval=1", *options]
    env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
    process = LoggedProcess.start("phoenix-ui", argv, workdir / f"ui-{port}.log", env)
    base = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: (process.alive and _status_of(f"{base}/") == 200) or _died(process), "phoenix ui serving")
        yield base
        assert process.alive, process.failure("died during the test")
    finally:
        process.stop(10)
        assert TOKEN not in process.log_path.read_text()


@pytest.fixture
def ui(kube_cluster: ControlPlane, kube_namespace: str, tmp_path: Path) -> Iterator[str]:
    """`phoenix ui` over the test's namespace, with a token."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with running_ui(kube_cluster, tmp_path, f"--token-file={token_file}", "-n", kube_namespace) as base:
        yield base


def _died(process: LoggedProcess) -> bool:
    if not process.alive:
        raise process.failure("stopped")
    return False


def _status_of(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _enqueue(connection: sync_redis.Redis, ns: str, record_id: str, document: Path) -> None:
    data = json.dumps({"document_url": document.resolve().as_uri()})
    connection.xadd(StageKeys.for_stage("router", ns).input, {"record_id": record_id, "user_id": "u1", "data": data})


def _page_when(page: Page, check: Any, what: str, timeout: float = 60.0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def read() -> bool:
        found.update(page.evaluate(READ_PAGE))
        return bool(check(found))

    try:
        eventually(read, what, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the page showed {json.dumps(found, indent=1)[:3000]}") from None
    return found


@needs_chromium
@pytest.mark.browser
@pytest.mark.subprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("redis_db", [15], indirect=True)
def test_the_page_draws_the_pipeline_and_follows_it_live(
    kube_cluster: ControlPlane,
    operator_kubeconfig: Path,
    kube_namespace: str,
    kubelet_player: PlayKubelet,
    redis_db: tuple[str, sync_redis.Redis],
    ui: str,
    tmp_path: Path,
) -> None:
    url, connection = redis_db
    ns = kube_namespace
    # The API refuses a request without the token; the page's code holds no data and is served to anyone, with a
    # policy that lets it load nothing from elsewhere.
    assert _status_of(f"{ui}/api/pipelines") == 401 and _status_of(f"{ui}/api/pipelines", "wrong") == 401
    assert _status_of(f"{ui}/api/pipelines", TOKEN) == 200
    with urllib.request.urlopen(f"{ui}/static/app.js", timeout=5) as response:
        assert response.headers["Content-Security-Policy"].startswith("default-src 'self'")

    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-ui") as (operator, _):
        kubectl_apply(kube_cluster, sample_documents(url, ns, tmp_path / "docs"))
        eventually(lambda: all(stage_status(kube_cluster, ns, s).get("queue") for s in STAGES), "queues in status")
        with chromium_page(f"{ui}/#token={TOKEN}", tmp_path, width=1200, height=560) as page:
            shown = _page_when(
                page, lambda p: len(p["stages"]) == 3 and p["stages"]["router"]["backlog"] == "0", "three boxes"
            )
            assert set(shown["stages"]) == set(STAGES)
            assert set(shown["edges"]) == {"router->parser", "parser->grouper"}
            assert shown["stages"]["router"]["dlq"] == "0" and shown["stages"]["router"]["replicas"] == "0/1"
            assert page.evaluate("location.hash") == ""  # the token left the address bar

            # Records wait for the router: its backlog, then the oldest unfinished one, from its status.
            documents = ensure_samples(tmp_path / "docs")
            for i, document in enumerate(documents):
                _enqueue(connection, ns, f"doc-{i}", document)
            for missing in ("gone-1", "gone-2"):
                _enqueue(connection, ns, missing, tmp_path / "docs" / f"{missing}.pdf")
            waiting = str(len(documents) + 2)
            _page_when(page, lambda p: p["stages"]["router"]["backlog"] == waiting, f"router backlog {waiting}")

            # A real router worker routes them to the parser (which has none): the edge's lag is the parser's
            # backlog; the two records without a document are dead-lettered.
            router = kubelet_player(ns, "router")
            router.start()
            rates: set[str] = set()

            def routed(p: dict[str, Any]) -> bool:
                router, parser = p["stages"]["router"], p["stages"]["parser"]
                rates.add(router["rate"])
                return router["dlq"] == "2" and router["backlog"] == "0" and parser["backlog"] == str(len(documents))

            try:
                flowed = _page_when(page, routed, "records routed and dead-lettered", timeout=120)
            except AssertionError as exc:
                logs = "\n".join(f"--- {pod}\n{p.log_tail(15)}" for pod, p in router.processes().items())
                pods = kube_cluster.kubectl("get", "pods,deploy,rs", "-n", ns).stdout
                raise AssertionError(f"{exc}\nstart errors {router.start_errors}\n{pods}\n{logs}") from None
            assert flowed["edges"]["router->parser"] == f"lag {len(documents)}"
            assert rates - {"0.0/s", "-"}, f"the router's rate was never above 0: {rates}"

            # The router's dead letters: ids and reasons, never the record's data.
            page.evaluate("""document.querySelector("[data-stage=router] .dlq-link").dispatchEvent(
                new MouseEvent("click", {bubbles: true}))""")
            listed = _page_when(page, lambda p: len(p["dlq"]) == 2, "two dead letters listed")
            assert listed["head"] == ["entry", "record", "error type", "reason", "first seen", "attempts"]
            assert sorted(row[1] for row in listed["dlq"]) == ["gone-1", "gone-2"]
            assert {row[2] for row in listed["dlq"]} == {"RecordNotFoundError"}
            assert "document_url" not in listed["text"] and "u1" not in {c for r in listed["dlq"] for c in r}
            assert listed["problem"] == ""
            # Only the namespace the view was started for (-n), whatever the caller may read.
            assert _status_of(f"{ui}/api/stages/default/router/dlq", TOKEN) == 502

            # A paused stage says so on its box (spec.paused).
            kube_cluster.kubectl("patch", "phoenixstage", "grouper", "-n", ns, "--type=merge", "-p", PAUSE)
            _page_when(page, lambda p: p["stages"]["grouper"].get("paused") == "paused", "the grouper paused")
            shot = page.screenshot(tmp_path / "pipeline-view.png")
            print(f"screenshot: {shot}")

        # On loopback without a token, with the record data asked for, every stage's Redis reached at --redis-host
        # (here where its Secret says too, so only the option's path is new).
        where = urllib.parse.urlsplit(url)
        options = ("--no-auth", "--show-data", f"--redis-host={where.hostname}:{where.port}")
        with (
            running_ui(kube_cluster, tmp_path, *options) as open_ui,
            urllib.request.urlopen(f"{open_ui}/api/stages/{ns}/router/dlq", timeout=10) as response,
        ):
            letters = json.load(response)
        assert letters["data"] and letters["length"] == 2
        assert {json.loads(e["data"])["document_url"] for e in letters["entries"]} == {
            (tmp_path / "docs" / f"{missing}.pdf").resolve().as_uri() for missing in ("gone-1", "gone-2")
        }
        assert operator.alive, operator.failure("died during the test")
