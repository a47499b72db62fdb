"""Pure status logic: the DeploymentReady condition, the replica counts and the aggregated Ready condition."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from phoenix.crds import Condition, ConditionType, ReplicaStatus
from phoenix.operator.status.conditions import find_condition, new_condition

# The AutoscalingReady reason while KEDA is absent; such stages are reconciled again until it appears.
KEDA_NOT_INSTALLED = "KedaNotInstalled"
# The AutoscalingReady reason while a KEDA object of the stage's name belongs to someone else (children.NotOwned);
# reconciled again like a missing KEDA, so removing that object hands the stage back to autoscaling.
CHILD_NOT_OWNED = "ChildNotOwned"


def replica_status(deployment: Mapping[str, Any] | None) -> ReplicaStatus:
    if deployment is None:
        return ReplicaStatus.of(0, 0)
    desired = int(deployment.get("spec", {}).get("replicas", 0) or 0)
    return ReplicaStatus.of(desired, int(deployment.get("status", {}).get("readyReplicas", 0) or 0))


def queue_drained(queue: Mapping[str, Any]) -> bool:
    """Nothing waits in the stage's input: no backlog and nothing in flight (status.queue's figures)."""
    return queue.get("lag") == 0 and queue.get("pending") == 0


def deployment_condition(deployment: Mapping[str, Any] | None, generation: int | None = None) -> Condition:
    """DeploymentReady from the Deployment's own status, the way `kubectl rollout status` reads it."""
    if deployment is None:
        return new_condition(
            ConditionType.DEPLOYMENT_READY,
            False,
            "DeploymentMissing",
            "the Deployment does not exist",
            observed_generation=generation,
        )
    spec, status = deployment.get("spec", {}), deployment.get("status", {})
    desired = int(spec.get("replicas", 0) or 0)
    if int(status.get("observedGeneration", 0) or 0) < int(deployment["metadata"].get("generation", 0) or 0):
        return new_condition(
            ConditionType.DEPLOYMENT_READY,
            False,
            "RolloutPending",
            "the Deployment controller has not seen the latest change yet",
            observed_generation=generation,
        )
    if desired == 0:
        return new_condition(
            ConditionType.DEPLOYMENT_READY, True, "ScaledToZero", "no pods are wanted", observed_generation=generation
        )
    updated = int(status.get("updatedReplicas", 0) or 0)
    available = int(status.get("availableReplicas", 0) or 0)
    if updated < desired:
        message = f"{updated} of {desired} pods run the latest pod template"
        return new_condition(
            ConditionType.DEPLOYMENT_READY, False, "RolloutInProgress", message, observed_generation=generation
        )
    if available < desired:
        message = f"{available} of {desired} pods available"
        return new_condition(
            ConditionType.DEPLOYMENT_READY, False, "ReplicasUnavailable", message, observed_generation=generation
        )
    return new_condition(
        ConditionType.DEPLOYMENT_READY,
        True,
        "ReplicasAvailable",
        f"{available} of {desired} pods available",
        observed_generation=generation,
    )


def ready_condition(
    conditions: Iterable[Mapping[str, Any]], error: Condition | None, generation: int | None = None
) -> Condition:
    """Ready: no reconcile error, the streams exist and the workers are available. Autoscaling is not required:
    without it the stage still runs at replicas.min."""
    if error is not None:
        return new_condition(ConditionType.READY, False, error.reason, error.message, observed_generation=generation)
    conditions = list(conditions)
    for type_ in (ConditionType.STREAM_READY, ConditionType.DEPLOYMENT_READY):
        found = find_condition(conditions, type_)
        if found is None:
            return new_condition(
                ConditionType.READY, None, "Reconciling", f"{type_} is not known yet", observed_generation=generation
            )
        if found.get("status") != "True":
            return new_condition(
                ConditionType.READY,
                False,
                str(found.get("reason", "NotReady")),
                str(found.get("message", "")),
                observed_generation=generation,
            )
    return new_condition(
        ConditionType.READY,
        True,
        "StageReady",
        "streams exist and workers are available",
        observed_generation=generation,
    )


def _autoscaling_reason(body: Mapping[str, Any]) -> str | None:
    conditions = (body.get("status") or {}).get("conditions") or []
    found = find_condition(conditions, ConditionType.AUTOSCALING_READY)
    return None if found is None else found.get("reason")


def waits_for_keda(body: Mapping[str, Any], **_: Any) -> bool:
    """The stage runs without autoscaling because KEDA was missing when it was last reconciled."""
    return _autoscaling_reason(body) == KEDA_NOT_INSTALLED


def autoscaling_rechecked(body: Mapping[str, Any]) -> bool:
    """The stage runs without autoscaling for a reason outside its spec (KEDA missing, or a KEDA object of its
    name owned by someone else), so the operator looks again from time to time."""
    return _autoscaling_reason(body) in (KEDA_NOT_INSTALLED, CHILD_NOT_OWNED)
