"""A PhoenixPipeline's PhoenixStages: each entry of spec.stages as the PhoenixStage the operator makes of it, and the
JSON patch bringing an existing one back to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from phoenix.crds import API_VERSION, KIND, DeletionPolicy
from phoenix.kube_names import PIPELINE_LABEL
from phoenix.operator.builders.meta import Owner, owner_reference

Json = dict[str, Any]


def wanted_stage_spec(entry_spec: Mapping[str, Any], paused: bool, deletion_policy: DeletionPolicy | None) -> Json:
    """An entry's spec as its stage runs it: the pipeline's pause (pipeline/lifecycle.py) and deletionPolicy, when
    it sets one, in place of the entry's own. `entry_spec` is the entry as stored (defaulted by the API server
    under the same schema as a PhoenixStage's, so an unchanged stage compares equal)."""
    spec = {**entry_spec, "paused": paused}
    if deletion_policy is not None:
        spec["deletionPolicy"] = deletion_policy.value
    return spec


def pipeline_stage(owner: Owner, name: str, spec: Mapping[str, Any]) -> Json:
    """The PhoenixStage `name` of the pipeline `owner`, running `spec` (wanted_stage_spec)."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": {PIPELINE_LABEL: owner.name},
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": dict(spec),
    }


def owned_by(stage: Mapping[str, Any], uid: str) -> bool:
    """Whether the pipeline of `uid` is the stage's controller (its owner reference with controller: true)."""
    references = stage.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in references)


def stage_changes(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[Json]:
    """The JSON patch turning the owned stage `existing` into `wanted` (pipeline_stage): its spec replaced whole
    (a merge patch would keep fields the pipeline dropped) and its pipeline label put back; [] when nothing differs.
    A `test` of the resourceVersion makes a write over a change made meanwhile fail instead (the next pass redoes
    it)."""
    ops: list[Json] = []
    meta = existing.get("metadata", {})
    labels = meta.get("labels") or {}
    owner = wanted["metadata"]["labels"][PIPELINE_LABEL]
    if labels.get(PIPELINE_LABEL) != owner:
        if not labels:
            ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
        ops.append({"op": "add", "path": "/metadata/labels/" + PIPELINE_LABEL.replace("/", "~1"), "value": owner})
    if existing.get("spec") != wanted["spec"]:
        ops.append({"op": "replace", "path": "/spec", "value": wanted["spec"]})
    if not ops:
        return []
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")}, *ops]
