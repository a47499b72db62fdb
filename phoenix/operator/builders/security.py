"""The hardened security settings shared by worker pods and the operator's own pod (restricted Pod Security)."""

from __future__ import annotations

from typing import Any

NONROOT_UID = 65532  # the distroless "nonroot" user


# Both levels say it: the pod's for every container, the container's so that it holds wherever it is copied.
_NON_ROOT = {
    "runAsNonRoot": True,
    "runAsUser": NONROOT_UID,
    "runAsGroup": NONROOT_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_security_context() -> dict[str, Any]:
    return {**_NON_ROOT, "fsGroup": NONROOT_UID}


def container_security_context() -> dict[str, Any]:
    return {
        **_NON_ROOT,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
