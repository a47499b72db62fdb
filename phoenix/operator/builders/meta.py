"""Metadata every child object of a PhoenixStage carries: labels and the owner reference that lets Kubernetes
garbage-collect children when their PhoenixStage is deleted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phoenix.kube_names import (
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    PIPELINE_LABEL,
    STAGE_LABEL,
    WORKER_APP_NAME,
)


@dataclass(frozen=True)
class Owner:
    """The PhoenixStage that owns the objects being built."""

    api_version: str
    kind: str
    name: str
    namespace: str
    uid: str
    # The Kubernetes cluster it lives in (the operator's identity; "" unknown): with the uid, what the ownership
    # markers of its Redis keys name.
    cluster: str = ""
    # The pipeline it belongs to, from its phoenix.io/pipeline label ("" for none): its workers' PIPELINE.
    pipeline: str = ""

    @classmethod
    def from_body(cls, body: Mapping[str, Any], cluster: str = "") -> Owner:
        """From a kopf body or any object dict with apiVersion, kind and metadata.name/namespace/uid (and labels)."""
        meta = body["metadata"]
        pipeline = (meta.get("labels") or {}).get(PIPELINE_LABEL, "")
        return cls(body["apiVersion"], body["kind"], meta["name"], meta["namespace"], meta["uid"], cluster, pipeline)


def owner_reference(owner: Owner) -> dict[str, Any]:
    # controller=True marks the single managing owner; blockOwnerDeletion makes foreground deletion wait for it.
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def selector_labels(stage: str) -> dict[str, str]:
    """The immutable subset used in the Deployment's selector."""
    return {NAME_LABEL: WORKER_APP_NAME, INSTANCE_LABEL: stage}


def stage_labels(stage: str) -> dict[str, str]:
    return {**selector_labels(stage), MANAGED_BY_LABEL: MANAGED_BY, STAGE_LABEL: stage}


def child_metadata(owner: Owner, name: str, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """metadata of a child object named `name` in the owner's namespace."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": owner.namespace,
        "labels": stage_labels(owner.name),
        "ownerReferences": [owner_reference(owner)],
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta
