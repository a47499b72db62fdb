"""Pure functions from a validated PhoenixStage spec to the Kubernetes objects that run it."""

from phoenix.operator.builders.conditions import find_condition, new_condition, set_condition
from phoenix.operator.builders.deployment import (
    DEFAULT_RESOURCES,
    HEALTH_PORT,
    RESTARTED_AT_ANNOTATION,
    build_deployment,
    desired_replicas,
    worker_env,
)
from phoenix.operator.builders.keda import (
    PAUSED_ANNOTATION,
    PAUSED_REPLICAS_ANNOTATION,
    AutoscalingConfigError,
    build_scaled_object,
    build_trigger_authentication,
    scaled_object_patch,
    trigger_authentication_name,
)
from phoenix.operator.builders.meta import Owner, owner_reference, stage_labels
from phoenix.operator.builders.redis_address import RedisConnection, RedisUrlError, in_namespace, redis_connection
from phoenix.operator.builders.streams import default_input_stream, resolve_streams

__all__ = [
    "DEFAULT_RESOURCES",
    "HEALTH_PORT",
    "PAUSED_ANNOTATION",
    "PAUSED_REPLICAS_ANNOTATION",
    "RESTARTED_AT_ANNOTATION",
    "AutoscalingConfigError",
    "Owner",
    "RedisConnection",
    "RedisUrlError",
    "build_deployment",
    "build_scaled_object",
    "build_trigger_authentication",
    "default_input_stream",
    "desired_replicas",
    "find_condition",
    "in_namespace",
    "new_condition",
    "owner_reference",
    "redis_connection",
    "resolve_streams",
    "scaled_object_patch",
    "set_condition",
    "stage_labels",
    "trigger_authentication_name",
    "worker_env",
]
