"""Pure functions from a validated PhoenixStage spec to the Kubernetes objects that run it."""

from phoenix.operator.builders.deployment import (
    DEFAULT_RESOURCES,
    HEALTH_PORT,
    build_deployment,
    desired_replicas,
    worker_env,
)
from phoenix.operator.builders.disruption import build_pod_disruption_budget
from phoenix.operator.builders.keda import (
    AutoscalingConfigError,
    build_scaled_object,
    build_trigger_authentication,
    scaled_object_patch,
    trigger_authentication_name,
)
from phoenix.operator.builders.meta import Owner, owner_reference, stage_labels
from phoenix.operator.builders.redis_address import RedisConnection, RedisUser, in_namespace, redis_connection
from phoenix.operator.builders.streams import resolve_streams

__all__ = [
    "DEFAULT_RESOURCES",
    "HEALTH_PORT",
    "AutoscalingConfigError",
    "Owner",
    "RedisConnection",
    "RedisUser",
    "build_deployment",
    "build_pod_disruption_budget",
    "build_scaled_object",
    "build_trigger_authentication",
    "desired_replicas",
    "in_namespace",
    "owner_reference",
    "redis_connection",
    "resolve_streams",
    "scaled_object_patch",
    "stage_labels",
    "trigger_authentication_name",
    "worker_env",
]
