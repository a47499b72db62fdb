"""The worker settings a PhoenixStage tunes are written once (phoenix/tuning.py): the CRD, the operator's env and the
worker agree on each one's default, and every value a spec may give reaches the worker unchanged."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from phoenix.crds import PhoenixStageSpec
from phoenix.keys import StageKeys
from phoenix.operator.builders.deployment import worker_env
from phoenix.tuning import RETRY_BASE_SECONDS, RETRY_MAX_SECONDS, TUNABLES, Tunable
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.fuzzing import fuzz_settings

REDIS = {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}}
# Where each tunable sits in a spec's JSON: (section, field).
SPEC_PLACES = {
    "LOCK_TIMEOUT": ("worker", "lockTimeout"),
    "IDEMPOTENCY_TTL": ("worker", "idempotencyTTL"),
    "PROCESSING_TIMEOUT": ("worker", "processingTimeout"),
    "CLAIM_IDLE_MS": ("worker", "claimIdleMs"),
    "CONCURRENCY": ("worker", "concurrency"),
    "MAX_DELIVERIES": ("worker", "maxDeliveries"),
    "RETRY_BASE_SECONDS": ("retry", "baseSeconds"),
    "RETRY_MAX_SECONDS": ("retry", "maxSeconds"),
    "CIRCUIT_FAILURE_THRESHOLD": ("circuitBreaker", "failureThreshold"),
    "CIRCUIT_RESET_TIMEOUT": ("circuitBreaker", "resetTimeout"),
    "CIRCUIT_HALF_OPEN_CALLS": ("circuitBreaker", "halfOpenCalls"),
}


def spec_with(values: dict[Tunable, int | float]) -> PhoenixStageSpec:
    sections: dict[str, dict[str, Any]] = {}
    for setting, value in values.items():
        section, field = SPEC_PLACES[setting.env]
        sections.setdefault(section, {})[field] = value
    return PhoenixStageSpec.model_validate({"processor": "parser", "image": "img:1", "redis": REDIS, **sections})


def worker_of(spec: PhoenixStageSpec) -> WorkerSettings:
    """The settings a worker reads from the env the operator writes for `spec`."""
    env = {var["name"]: var.get("value", "") for var in worker_env("parser", spec, StageKeys.for_stage("parser"))}
    wanted = {setting.env for setting in TUNABLES}
    return WorkerSettings(
        service_name="parser", processor="parser", **{k.lower(): v for k, v in env.items() if k in wanted}
    )


def test_every_tunable_has_a_place_in_the_spec() -> None:
    assert set(SPEC_PLACES) == {setting.env for setting in TUNABLES}


@pytest.mark.parametrize("setting", TUNABLES, ids=lambda setting: setting.env)
def test_the_crd_the_operator_and_the_worker_share_each_default(setting: Tunable) -> None:
    assert WorkerSettings.model_fields[setting.setting].default == setting.default
    default_spec = spec_with({})
    assert default_spec.tuned_values()[setting] == setting.default
    assert getattr(worker_of(default_spec), setting.setting) == setting.default
    schema = PhoenixStageSpec.model_json_schema(by_alias=True)
    section, field = SPEC_PLACES[setting.env]
    (ref,) = [schema["properties"][section]["$ref"].rsplit("/", 1)[1]]
    crd_field = schema["$defs"][ref]["properties"][field]
    assert crd_field["default"] == setting.default
    assert crd_field["maximum"] == setting.maximum
    minimum = "exclusiveMinimum" if setting.exclusive_minimum else "minimum"
    assert crd_field[minimum] == setting.minimum


@pytest.mark.parametrize("setting", TUNABLES, ids=lambda setting: setting.env)
def test_a_value_past_a_spec_bound_is_refused_by_the_model(setting: Tunable) -> None:
    below = setting.minimum if setting.exclusive_minimum else setting.minimum - 1
    for refused in (below, setting.maximum + 1):
        with pytest.raises(ValidationError):
            spec_with({setting: refused})


def _within(setting: Tunable) -> st.SearchStrategy[int | float]:
    if isinstance(setting.default, float):
        return st.floats(setting.minimum, setting.maximum, exclude_min=setting.exclusive_minimum)
    return st.integers(int(setting.minimum), int(setting.maximum))


@fuzz_settings(60)
@given(values=st.fixed_dictionaries({setting: _within(setting) for setting in TUNABLES}))
def test_every_value_a_spec_may_give_reaches_the_worker_unchanged(values: dict[Tunable, int | float]) -> None:
    base, longest = values[RETRY_BASE_SECONDS], values[RETRY_MAX_SECONDS]
    if base > longest:  # refused by the spec itself (retry.baseSeconds must not exceed maxSeconds)
        values[RETRY_BASE_SECONDS], values[RETRY_MAX_SECONDS] = longest, base
    settings = worker_of(spec_with(values))
    assert {setting: getattr(settings, setting.setting) for setting in TUNABLES} == values
