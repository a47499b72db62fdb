"""How many replicas the operator writes into the worker Deployment (pure)."""

from __future__ import annotations

from phoenix.crds import PhoenixStageSpec
from phoenix.operator.builders import desired_replicas


def deployment_replicas(spec: PhoenixStageSpec, current: int | None, keda_scales: bool) -> int:
    """The operator's replica count for the Deployment.

    Without KEDA the stage runs exactly replicas.min (0 while paused). When KEDA scales it, the operator only
    creates the Deployment at replicas.min and afterwards keeps KEDA's number, clamped into [min, max]: KEDA
    never goes outside that range either, so the two never fight, and unpausing brings a stage back to min.
    """
    if spec.paused or not keda_scales or current is None:
        return desired_replicas(spec)
    return max(spec.replicas.min, min(spec.replicas.max, current))
