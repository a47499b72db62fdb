"""The operator against an API server that accepts connections and never answers: its calls time out instead of
hanging, and its readiness says so (while its liveness stays green: the process itself is fine)."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import kopf
import pytest
from kubernetes import config
from urllib3.exceptions import HTTPError

from phoenix.operator.kube import kopf_settings
from phoenix.operator.kube.api import REQUEST_TIMEOUT_SECONDS, KubeApi, load_client
from tests.fixtures.eventually import eventually
from tests.fixtures.operator_process import VENV_BIN
from tests.fixtures.processes import LoggedProcess, free_loopback_port
from tests.fixtures.silent_server import plain_kubeconfig, silent_server


@pytest.mark.timeout(90)
async def test_a_kube_call_to_a_silent_api_server_fails_within_its_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with silent_server() as url:
        monkeypatch.setattr(
            config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(plain_kubeconfig(tmp_path / "kubeconfig", url))
        )
        kube = KubeApi(load_client(threads=2), request_timeout=(1.0, 1.0))
        started = time.monotonic()
        # The bound only keeps a regression from hanging the suite: the call must fail on its own, in ~1 s.
        with pytest.raises((HTTPError, TimeoutError)) as failure:
            await asyncio.wait_for(kube.get_deployment("default", "router"), timeout=20)
        elapsed = time.monotonic() - started
        await kube.aclose()
    assert not isinstance(failure.value, TimeoutError), "the call hung until the test gave up on it"
    assert "timed out" in str(failure.value).lower()
    # One attempt: a read that timed out is not retried (that would make each timeout several).
    assert elapsed < 3.0


def test_every_kube_call_and_every_kopf_request_has_a_timeout() -> None:
    assert KubeApi.__init__.__defaults__ == (REQUEST_TIMEOUT_SECONDS,)
    settings = kopf.OperatorSettings()
    kopf_settings.configure(settings, [], "managed")
    assert settings.networking.request_timeout == kopf_settings.REQUEST_TIMEOUT_SECONDS
    assert settings.networking.connect_timeout == kopf_settings.CONNECT_TIMEOUT_SECONDS
    assert settings.watching.connect_timeout == kopf_settings.CONNECT_TIMEOUT_SECONDS
    # The server ends each watch; kopf gives up on one that went silent a little later.
    server_timeout, client_timeout = settings.watching.server_timeout, settings.watching.client_timeout
    assert server_timeout is not None and client_timeout is not None
    assert 0 < server_timeout < client_timeout


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode().strip()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode().strip()
    except OSError:
        return 0, ""


@pytest.mark.timeout(60)
@pytest.mark.subprocess
def test_readyz_fails_while_the_api_server_does_not_answer(tmp_path: Path) -> None:
    with silent_server() as url:
        port = free_loopback_port()
        process = LoggedProcess.start(
            "operator-silent-api",
            [
                str(VENV_BIN / "phoenix"),
                "operator",
                f"--metrics-port={port}",
                "--leader-election",
                "--lease-namespace=default",
            ],
            tmp_path / "operator.log",
            {**os.environ, "KUBECONFIG": str(plain_kubeconfig(tmp_path / "kubeconfig", url))},
        )
        try:
            base = f"http://127.0.0.1:{port}"
            eventually(lambda: _get(f"{base}/healthz")[0] == 200, "the operator's /healthz")
            status, text = _get(f"{base}/readyz")
            assert process.alive, process.failure("died")
        finally:
            process.stop(15)
    assert (status, text) == (503, "kubernetes API unreachable: ReadTimeoutError")
