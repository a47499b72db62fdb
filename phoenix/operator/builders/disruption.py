"""The PodDisruptionBudget of a stage: voluntary disruptions (node drains, cluster upgrades) take its workers one at
a time, each draining its in-flight records within the termination grace."""

from __future__ import annotations

from typing import Any

from phoenix.crds import PhoenixStageSpec
from phoenix.operator.builders.meta import Owner, child_metadata, selector_labels


def build_pod_disruption_budget(owner: Owner, spec: PhoenixStageSpec) -> dict[str, Any] | None:
    """`maxUnavailable: 1` over the stage's workers, or None for a stage that never runs more than one pod: a
    budget there could only allow that pod's eviction (a no-op) or forbid it (a drain that never ends).

    Decided on replicas.max, not on the current scale, so KEDA's scaling never creates or deletes it."""
    if spec.replicas.max <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(owner, owner.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name)}},
    }
