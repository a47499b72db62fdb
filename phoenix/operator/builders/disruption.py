"""The PodDisruptionBudget of a stage: voluntary disruptions (node drains, cluster upgrades) take its workers one at
a time, each draining its in-flight records within the termination grace."""

from __future__ import annotations

from typing import Any

from phoenix.crds import PhoenixStageSpec
from phoenix.operator.builders.meta import Owner, child_metadata, selector_labels


def most_pods(spec: PhoenixStageSpec) -> int:
    """The most worker pods the spec lets the stage run: none while paused, replicas.min without autoscaling (the
    operator runs exactly that many), else replicas.max (KEDA's bound)."""
    if spec.paused:
        return 0
    return spec.replicas.max if spec.autoscaling.enabled else spec.replicas.min


def build_pod_disruption_budget(owner: Owner, spec: PhoenixStageSpec) -> dict[str, Any] | None:
    """`maxUnavailable: 1` over the stage's workers, or None for a stage whose spec never runs more than one pod
    (paused, `max: 1`, or without autoscaling at `min` 0 or 1): a budget there could only allow that pod's eviction
    (a no-op) or forbid it (a drain that never ends).

    Decided on the spec (most_pods), not on the current scale, so KEDA's scaling never creates or deletes it."""
    if most_pods(spec) <= 1:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(owner, owner.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name)}},
    }
