"""Who may make PhoenixStages: manifests/rbac/stage-roles.yaml applied to the real API server, its rules aggregated
into the default `edit`, `admin` and `view` roles by the controller manager's clusterrole-aggregation controller,
and users bound to those roles asking, and acting, through impersonation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.fixtures.cluster_objects import kubectl_checked
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_models import status_of

pytestmark = pytest.mark.kube

STAGE: dict[str, Any] = {
    "apiVersion": "phoenix.io/v1alpha1",
    "kind": "PhoenixStage",
    "metadata": {"name": "made-by-a-user"},
    "spec": {
        "processor": "router",
        "image": "ghcr.io/phoenix/phoenix:0.1.0",
        "redis": {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}},
    },
}


def _grants_stages(plane: ControlPlane, role: str, verb: str) -> bool:
    rules = json.loads(kubectl_checked(plane, "get", "clusterrole", role, "-o", "json")).get("rules") or []
    return any(
        "phoenix.io" in rule.get("apiGroups", [])
        and "phoenixstages" in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        for rule in rules
    )


@pytest.fixture(scope="module")
def stage_roles(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> None:
    """manifests/rbac applied (operator_kubeconfig applies it, stage-roles.yaml with the rest); then the default
    roles once the controller manager aggregated the stage roles into them."""
    for role, verb in (("edit", "create"), ("admin", "create"), ("view", "list")):
        eventually(lambda role=role, verb=verb: _grants_stages(kube_cluster, role, verb), f"{role} to {verb} stages")


def _bind(api: client.ApiClient, namespace: str, user: str, cluster_role: str) -> None:
    binding = client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=f"{user}-{cluster_role}"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=cluster_role),
        subjects=[client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")],
    )
    client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(namespace, binding)


def _allowed(api: client.ApiClient, user: str, verb: str, namespace: str, subresource: str = "") -> bool:
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            resource_attributes=client.V1ResourceAttributes(
                group="phoenix.io", resource="phoenixstages", subresource=subresource, verb=verb, namespace=namespace
            ),
        )
    )
    result = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(status_of(result).allowed)


def test_edit_may_make_stages_view_may_only_read_them(
    stage_roles: None, kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str
) -> None:
    for user, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin")):
        _bind(kube_api, kube_namespace, user, role)

    # Asked: a SubjectAccessReview of each user, as the authorizer answers it.
    for user in ("alice", "carol"):
        for verb in ("create", "update", "patch", "delete", "get", "list", "watch"):
            assert _allowed(kube_api, user, verb, kube_namespace), (user, verb)
        assert not _allowed(kube_api, user, "patch", kube_namespace, "status")  # the operator's alone
    for verb in ("get", "list", "watch"):
        assert _allowed(kube_api, "bob", verb, kube_namespace)
    for verb in ("create", "update", "patch", "delete"):
        assert not _allowed(kube_api, "bob", verb, kube_namespace), verb
    assert not _allowed(kube_api, "alice", "create", "default")  # her binding is in one namespace only

    # Done: the same users through impersonation, a real create, list and delete.
    manifest = yaml.safe_dump(STAGE)
    created = kube_cluster.kubectl("create", "--as=alice", f"--namespace={kube_namespace}", "-f", "-", input=manifest)
    assert created.returncode == 0, created.stderr
    refused = kube_cluster.kubectl(
        "create", "--as=bob", f"--namespace={kube_namespace}", "-f", "-", input=manifest.replace("made-by-a", "bobs")
    )
    assert refused.returncode != 0
    assert 'User "bob" cannot create resource "phoenixstages"' in refused.stderr
    listed = kube_cluster.kubectl("get", "phoenixstages", "--as=bob", f"--namespace={kube_namespace}", "-o", "name")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["phoenixstage.phoenix.io/made-by-a-user"]
    deleted = kube_cluster.kubectl("delete", "phoenixstage", "made-by-a-user", "--as=bob", f"-n={kube_namespace}")
    assert deleted.returncode != 0 and "cannot delete" in deleted.stderr
