"""Generated PhoenixStage specs (tests/fixtures/stage_specs.py: from the CRD's schema, with hostile values) through
the models (phoenix/crds) and through the real API server's schema and CEL rules (a server-side dry run of the
stage, strict field validation as kubectl's): the two refuse the same specs. And whatever the models admit builds
(phoenix/operator/builders) a Deployment, PodDisruptionBudget, ScaledObject and TriggerAuthentication that the API
server admits too, and a worker environment the worker's settings accept.

Each disagreement found became a regular test (tests/test_crds.py, tests/test_builders.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kubernetes import client
from pydantic import ValidationError

from phoenix.crds import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    RESERVED_ENV_NAMES,
    VERSION,
    PhoenixStage,
    PhoenixStageSpec,
)
from phoenix.operator.builders import (
    AutoscalingConfigError,
    Owner,
    build_deployment,
    build_pod_disruption_budget,
    build_scaled_object,
    build_trigger_authentication,
    redis_connection,
)
from phoenix.redis_spec import RedisSpec
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.admission import refused_by_the_api_server
from tests.fixtures.cluster_objects import ensure_namespace
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.fuzzing import FUZZ_SCALE, fuzz_settings
from tests.fixtures.stage_specs import stage_objects

pytestmark = [pytest.mark.fuzz, pytest.mark.kube]

NAMESPACE = "fuzz-stage-specs"
UID = "5f0c3ad2-6d7e-4a55-9a50-0d4c5d0c7b8e"


def redis_url(spec: PhoenixStageSpec) -> str:
    """What the stage's Secret would hold: a URL with a password, as the samples', TLS with spec.redis.tls (the
    operator refuses a redis:// URL then: InvalidRedisUrl)."""
    return f"{'rediss' if spec.redis.tls else 'redis'}://:pw@redis:6379/0"


@pytest.fixture(scope="module")
def namespace(kube_cluster: ControlPlane) -> Iterator[str]:
    ensure_namespace(kube_cluster, NAMESPACE)
    yield NAMESPACE


def refused_by_the_models(stage: dict[str, Any]) -> str | None:
    try:
        PhoenixStage.model_validate(stage)
    except ValidationError as exc:
        return str(exc)
    return None


def _stage_refusal(api: client.ApiClient, namespace: str, stage: dict[str, Any]) -> str | None:
    custom = client.CustomObjectsApi(api)
    return refused_by_the_api_server(
        custom.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, body=stage
    )


@pytest.mark.timeout(120 * FUZZ_SCALE)
@fuzz_settings(80)
@given(stage=stage_objects())
def test_the_models_and_the_api_server_refuse_the_same_specs(
    kube_api: client.ApiClient, namespace: str, stage: dict[str, Any]
) -> None:
    by_models, by_api_server = refused_by_the_models(stage), _stage_refusal(kube_api, namespace, stage)
    from hypothesis import event

    event(f"models {'refused' if by_models else 'admitted'}, api {'refused' if by_api_server else 'admitted'}")
    assert (by_models is None) == (by_api_server is None), (
        f"the models: {by_models or 'admitted'}\nthe API server: {by_api_server or 'admitted'}"
    )


def _resolved_env(deployment: dict[str, Any], url: str) -> dict[str, str]:
    """The worker container's environment as the kubelet would make it, the Secrets holding `url` and "x"."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {}
    for var in container["env"]:
        source = var.get("valueFrom", {})
        if "secretKeyRef" in source:
            env[var["name"]] = url if var["name"] == "REDIS_URL" else "x"
        elif "fieldRef" in source:
            env[var["name"]] = "router-6d4cf56db6-x7k2q"
        else:
            env[var["name"]] = var.get("value", "")
    return env


@pytest.mark.timeout(240 * FUZZ_SCALE)
# Most generated specs are refused by some rule; those are skipped here (the first property covers them).
@fuzz_settings(25, suppress_health_check=[*settings().suppress_health_check, HealthCheck.filter_too_much])
@given(stage=stage_objects(hostile=False), output_partitions=st.sampled_from([1, 4]))
def test_what_the_models_admit_builds_objects_the_api_server_and_the_worker_admit(
    kube_api: client.ApiClient, namespace: str, stage: dict[str, Any], output_partitions: int
) -> None:
    try:
        parsed = PhoenixStage.model_validate(stage)
    except ValidationError:
        assume(False)
        return
    assert _stage_refusal(kube_api, namespace, stage) is None
    owner = Owner(API_VERSION, KIND, parsed.metadata.name, namespace, UID)
    spec = parsed.spec
    deployment = build_deployment(owner, spec, restarted_at="2026-01-01T00:00:00Z", output_partitions=output_partitions)
    apps, policy, custom = client.AppsV1Api(kube_api), client.PolicyV1Api(kube_api), client.CustomObjectsApi(kube_api)
    refusals = {"Deployment": refused_by_the_api_server(apps.create_namespaced_deployment, namespace, body=deployment)}
    if (budget := build_pod_disruption_budget(owner, spec)) is not None:
        refusals["PodDisruptionBudget"] = refused_by_the_api_server(
            policy.create_namespaced_pod_disruption_budget, namespace, body=budget
        )
    keda = []
    if (authentication := build_trigger_authentication(owner, spec)) is not None:
        keda.append(("triggerauthentications", authentication))
    try:
        connection = redis_connection(RedisSpec.from_url(redis_url(spec)))
        keda.append(("scaledobjects", build_scaled_object(owner, spec, connection, output_partitions)))
    except AutoscalingConfigError:
        pass  # a condition and an Event the operator reports (tests/test_builders.py)
    for plural, body in keda:
        refusals[body["kind"]] = refused_by_the_api_server(
            custom.create_namespaced_custom_object, "keda.sh", "v1alpha1", namespace, plural, body=body
        )
    assert {kind: why for kind, why in refusals.items() if why is not None} == {}
    # The worker would start: its settings accept what the operator gives it (spec.env's own variables are the
    # stage author's to get right; the worker names a bad one at start).
    operators = {
        name: value for name, value in _resolved_env(deployment, redis_url(spec)).items() if name in RESERVED_ENV_NAMES
    }
    # As the worker builds them (from its environment, through __init__): model_validate skips what pydantic-settings
    # does there and refused every partitioned stage.
    settings: dict[str, Any] = {name.lower(): value for name, value in operators.items()}
    WorkerSettings(**settings)
