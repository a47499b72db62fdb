"""kubectl for the e2e suite: whatever cluster KUBECONFIG names, driven the way a user drives it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from phoenix.kube_names import STAGE_LABEL

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "manifests"
# The upstream names in the manifests; the e2e overrides them with kustomize, as a user pointing at a registry would.
PHOENIX_IMAGE = "ghcr.io/phoenix/phoenix"
VALKEY_IMAGE = "docker.io/valkey/valkey"
OPERATOR_NAMESPACE = "phoenix-system"
OPERATOR_PODS = "app.kubernetes.io/name=phoenix-operator"


def kubectl_binary() -> str:
    found = os.environ.get("KUBECTL") or shutil.which("kubectl")
    local = REPO_ROOT / ".cache" / "kube" / "bin" / "kubectl"
    return found or str(local)


def kubectl(*args: str, input: str | None = None, check: bool = True, timeout: float = 300) -> str:
    """kubectl's stdout; a failure raises with kubectl's own message."""
    result = subprocess.run(
        [kubectl_binary(), *args], input=input, capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json"))


def apply_documents(documents: list[dict[str, Any]], namespace: str) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(documents))


def image_override(name: str, reference: str) -> dict[str, str]:
    """A kustomize `images:` entry replacing image `name` with `reference` (repository[:tag])."""
    repository, _, tag = reference.rpartition(":") if ":" in reference.rsplit("/", 1)[-1] else (reference, "", "")
    entry = {"name": name, "newName": repository}
    if tag:
        entry["newTag"] = tag
    return entry


def write_overlay(directory: Path, base: Path, extra: dict[str, Any]) -> Path:
    """A kustomization in `directory` over `base` with `extra` fields (images, namespace, patches...)."""
    directory.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, directory)],
        **extra,
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return directory


def install_operator_with_kustomize(image: str, directory: Path) -> None:
    """`kubectl apply -k manifests/` with the operator's image overridden (in an overlay written to `directory`)."""
    overlay = write_overlay(directory, MANIFESTS, {"images": [image_override(PHOENIX_IMAGE, image)]})
    kubectl("apply", "--server-side", "-k", str(overlay))
    wait_rollout(OPERATOR_NAMESPACE, "phoenix-operator")


@contextlib.contextmanager
def port_forward(namespace: str, target: str, port: int) -> Iterator[int]:
    """`kubectl port-forward` to a Service or pod; yields the local port."""
    process = subprocess.Popen(
        [kubectl_binary(), "port-forward", "-n", namespace, "--address=127.0.0.1", target, f":{port}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not match:
            raise RuntimeError(f"kubectl port-forward {target} failed: {line}{process.stdout.read()}")
        yield int(match.group(1))
    finally:
        process.terminate()
        process.wait(timeout=10)


def pods(namespace: str, selector: str) -> list[dict[str, Any]]:
    return kubectl_json("get", "pods", "-n", namespace, "-l", selector)["items"]


def stage_pods(namespace: str, stage: str) -> list[dict[str, Any]]:
    return pods(namespace, f"{STAGE_LABEL}={stage}")


def delete_stage(namespace: str, stage: str, timeout: int = 180) -> None:
    """Delete a test's own stage and wait until its workers are gone, so that the next test (the report's, which lists
    every worker pod of the namespace) finds the namespace as the pipeline fixture made it."""
    kubectl("delete", "-n", namespace, "phoenixstage", stage, "--ignore-not-found", f"--timeout={timeout}s")
    gone = ("wait", "-n", namespace, "--for=delete", "pod", "-l", f"{STAGE_LABEL}={stage}", f"--timeout={timeout}s")
    kubectl(*gone, timeout=timeout + 30)


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return pod["metadata"].get("deletionTimestamp") is None and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def wait_rollout(namespace: str, deployment: str, timeout: int = 300) -> None:
    kubectl(
        "rollout", "status", "-n", namespace, f"deployment/{deployment}", f"--timeout={timeout}s", timeout=timeout + 30
    )


def since(start: float) -> str:
    return f"{time.monotonic() - start:6.1f}s"


def printed_columns(*args: str) -> dict[str, str]:
    """One object as `kubectl get` prints it, by column header (cells may be empty, so split by header offsets)."""
    header, row = kubectl("get", *args).splitlines()[:2]
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    bounds = zip(starts, [*starts[1:], None], strict=True)
    return {header[start:end].strip(): row[start:end].strip() for start, end in bounds}
