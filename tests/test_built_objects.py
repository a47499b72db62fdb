"""Objects the builders made for specs a generated run (tests/test_fuzz_stage_specs.py) found, created (dry run) on
the real API server through the client the operator creates them with (phoenix/operator/kube_api.py)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from phoenix.crds import PhoenixStageSpec
from phoenix.operator.builders import Owner, build_deployment
from tests.fixtures.control_plane import ControlPlane

pytestmark = pytest.mark.kube

MINIMAL = {
    "processor": "router",
    "image": "ghcr.io/phoenix/phoenix:0.1.0",
    "redis": {"urlSecretRef": {"name": "r", "key": "url"}},
}


@pytest.mark.parametrize(
    "resources",
    [
        {"requests": {"cpu": 1, "memory": "128Mi"}, "limits": {"cpu": 2, "memory": 536870912}},
        {"limits": {"nvidia.com/gpu": 1, "memory": "1Gi"}},
    ],
    ids=["numbers", "extended"],
)
def test_quantities_written_as_numbers_reach_the_api_server(
    resources: dict[str, Any], kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str
) -> None:
    """The operator's client refused a number among a container's resources before sending it (pydantic's
    ValidationError, not the API server's 422): such a stage never got its Deployment."""
    spec = PhoenixStageSpec.model_validate({**MINIMAL, "resources": resources})
    owner = Owner("phoenix.io/v1alpha1", "PhoenixStage", "numbers", kube_namespace, "u1")
    deployment: Any = build_deployment(owner, spec)  # a plain dict, as the operator sends it
    client.AppsV1Api(kube_api).create_namespaced_deployment(kube_namespace, deployment, dry_run="All")
