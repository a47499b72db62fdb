"""The PhoenixStage models and the CRD generated from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from phoenix.crds import RESERVED_ENV_NAMES, PhoenixStage, PhoenixStageSpec, PhoenixStageStatus
from phoenix.crds.definition import custom_resource_definition
from phoenix.crds.generate import CHART_CRD_PATH, CRD_PATH, main, render_crd
from phoenix.crds.pod import PROJECTED_SOURCES, VOLUME_SOURCES
from phoenix.retention import Retention
from tests.fixtures.admission import admitted_by_the_api_server, admitted_by_the_models
from tests.fixtures.control_plane import ControlPlane

MINIMAL_SPEC: dict[str, Any] = {
    "processor": "router",
    "image": "ghcr.io/phoenix/phoenix:0.1.0",
    "redis": {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}},
}

# Keywords a structural schema may use (apiextensions.k8s.io/v1 JSONSchemaProps), minus $ref and friends.
ALLOWED_KEYWORDS = {
    "description",
    "type",
    "format",
    "default",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "items",
    "properties",
    "additionalProperties",
    "anyOf",
    "nullable",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
    "x-kubernetes-embedded-resource",
}


def spec_schema() -> dict[str, Any]:
    return openapi_schema()["properties"]["spec"]


def openapi_schema() -> dict[str, Any]:
    return custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def structural_violations(node: dict[str, Any], path: str = "") -> list[str]:
    """Why `node` is not a structural schema, per the Kubernetes CRD rules (empty when it is)."""
    problems = [f"{path}: keyword {key}" for key in node if key not in ALLOWED_KEYWORDS]
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    if "type" not in node and not int_or_string and not node.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path}: no type")
    if "anyOf" in node:
        allowed = [{"type": "integer"}, {"type": "string"}]
        if not int_or_string or node["anyOf"] != allowed:
            problems.append(f"{path}: anyOf outside int-or-string")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: both properties and additionalProperties")
    if node.get("additionalProperties") is False:
        problems.append(f"{path}: additionalProperties: false")
    if isinstance(node.get("exclusiveMinimum"), int | float) and not isinstance(node["exclusiveMinimum"], bool):
        problems.append(f"{path}: numeric exclusiveMinimum (OpenAPI v3.0 wants a boolean)")
    if node.get("type") == "array" and "items" not in node:
        problems.append(f"{path}: array without items")
    for name, child in node.get("properties", {}).items():
        problems += structural_violations(child, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            problems += structural_violations(node[key], path + suffix)
    return problems


def undocumented(node: dict[str, Any], path: str) -> list[str]:
    missing = [] if node.get("description") else [path]
    for name, child in node.get("properties", {}).items():
        missing += undocumented(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        missing += undocumented(node["items"], f"{path}[]")
    return missing


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Defaulting as the apiserver does it: absent fields with a default get it, then recurse."""
    if isinstance(value, dict) and "properties" in schema:
        value = dict(value)
        for name, child in schema["properties"].items():
            if name not in value and "default" in child:
                value[name] = child["default"]
            if name in value:
                value[name] = apply_defaults(child, value[name])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def test_committed_crd_is_generated_from_the_models() -> None:
    committed = CRD_PATH.read_text()
    assert committed == render_crd(), f"{CRD_PATH} differs from phoenix/crds: run `make manifests`"


def test_the_helm_chart_holds_the_generated_crd_too() -> None:
    assert CHART_CRD_PATH.read_text() == render_crd(), f"{CHART_CRD_PATH} is stale: run `make manifests`"
    assert main(["--check"]) == 0


def test_generate_check_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "crd.yaml"
    stale.write_text("# edited by hand\n")
    assert main(["--check", "--output", str(stale)]) == 1
    assert "make manifests" in capsys.readouterr().err
    assert main(["--output", str(stale)]) == 0
    assert main(["--check", "--output", str(stale)]) == 0
    assert yaml.safe_load(stale.read_text()) == custom_resource_definition()


def test_crd_names_scope_and_status_subresource() -> None:
    spec = custom_resource_definition()["spec"]
    assert spec["group"] == "phoenix.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["plural"] == "phoenixstages"
    assert spec["names"]["shortNames"] == ["phx"]
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    columns = {c["name"]: c for c in custom_resource_definition()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Replicas"]["jsonPath"] == ".status.replicas.summary"
    assert columns["Backlog"]["jsonPath"] == ".status.queue.lag"
    assert columns["Pending"]["jsonPath"] == ".status.queue.pending"
    assert columns["DLQ"]["jsonPath"] == ".status.queue.dlqLength"
    assert columns["Oldest"]["jsonPath"] == ".status.queue.oldestUnfinishedSeconds"
    assert columns["Age"]["type"] == "date"
    wide = {name for name, c in columns.items() if c.get("priority") == 1}
    assert {"Input", "Output"} <= wide
    assert columns["Input"]["jsonPath"] == ".status.streams.input"


def test_schema_is_structural() -> None:
    assert structural_violations(openapi_schema()) == []


def test_structural_checker_catches_pydantic_leftovers() -> None:
    leftover = {
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/A"},
            "b": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "c": {"type": "number", "exclusiveMinimum": 0},
        },
    }
    problems = structural_violations(leftover)
    assert any(".a: keyword $ref" in p for p in problems)
    assert any(".b: anyOf outside int-or-string" in p for p in problems)
    assert any(".c: numeric exclusiveMinimum" in p for p in problems)


def _preserving(node: dict[str, Any], path: str) -> list[str]:
    found = [path] if node.get("x-kubernetes-preserve-unknown-fields") else []
    for name, child in node.get("properties", {}).items():
        found += _preserving(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        found += _preserving(node["items"], f"{path}[]")
    return found


def test_only_status_root_and_kubernetes_typed_pod_fields_preserve_unknown_fields() -> None:
    """Pruning is off only where the value is Kubernetes' own type, passed to the pod as written; what CEL must
    refuse there (a hostPath, a securityContext) is a declared field, which CEL can see."""
    volume = [f"spec.pod.volumes[].{name}" for name in VOLUME_SOURCES if name != "projected"]
    projected = [f"spec.pod.volumes[].projected.sources[].{name}" for name in PROJECTED_SOURCES]
    expected = [
        "spec.pod.affinity",
        "spec.pod.topologySpreadConstraints[]",
        *volume,
        *projected,
        "spec.pod.volumes[].hostPath",
        "spec.pod.securityContext",
        "status",
    ]
    assert sorted(_preserving(openapi_schema(), "")) == sorted(f".{path}" for path in expected)


def test_every_field_is_documented() -> None:
    assert undocumented(spec_schema(), "spec") == []
    assert undocumented(openapi_schema()["properties"]["status"], "status") == []


def test_resources_are_int_or_string_quantities() -> None:
    quantity = spec_schema()["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True
    assert "pattern" in quantity


def test_cel_rules_guard_cross_field_constraints() -> None:
    props = spec_schema()["properties"]
    assert props["replicas"]["x-kubernetes-validations"][0]["rule"] == "self.min <= self.max"
    assert props["retry"]["x-kubernetes-validations"][0]["rule"] == "self.baseSeconds <= self.maxSeconds"
    assert props["output"]["x-kubernetes-validations"][0]["rule"] == "has(self.stream) != has(self.stage)"
    env_rule = props["env"]["x-kubernetes-validations"][0]["rule"]
    assert all(f"'{name}'" in env_rule for name in RESERVED_ENV_NAMES)
    # CEL cost is estimated from bounds: every list and string a rule walks must be bounded.
    assert props["env"]["maxItems"] and props["env"]["items"]["properties"]["name"]["maxLength"]


def test_schema_defaults_match_model_defaults() -> None:
    """What the apiserver stores for a minimal spec is what the operator's models assume."""
    defaulted = apply_defaults(spec_schema(), MINIMAL_SPEC)
    model = PhoenixStageSpec.model_validate(MINIMAL_SPEC).to_k8s()
    assert model.pop("env") == []  # an absent list and an empty one mean the same
    assert defaulted == model


def test_minimal_spec_gets_documented_defaults() -> None:
    spec = PhoenixStageSpec.model_validate(MINIMAL_SPEC)
    assert (spec.replicas.min, spec.replicas.max) == (1, 10)
    assert spec.autoscaling.enabled and spec.autoscaling.lag_count == 10
    assert (spec.autoscaling.polling_interval, spec.autoscaling.cooldown_period) == (15, 180)
    assert spec.autoscaling.activation_lag_count == 0
    assert spec.worker.concurrency == 1 and spec.worker.idempotency_ttl == 86400
    assert (spec.worker.claim_idle_ms, spec.worker.max_deliveries) == (300_000, 10)
    assert (spec.retry.base_seconds, spec.retry.max_seconds) == (2, 300)
    assert (spec.circuit_breaker.failure_threshold, spec.circuit_breaker.half_open_calls) == (5, 3)
    assert spec.paused is False and spec.deletion_policy == "Retain"
    assert spec.input is None and spec.output is None and spec.env == []


def test_wire_names_are_camel_case() -> None:
    spec = PhoenixStageSpec.model_validate({**MINIMAL_SPEC, "worker": {"idempotencyTTL": 60, "claimIdleMs": 5000}})
    wire = spec.to_k8s()
    assert wire["worker"]["idempotencyTTL"] == 60
    assert wire["worker"]["claimIdleMs"] == 5000
    assert "circuitBreaker" in wire and "deletionPolicy" in wire


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"replicas": {"min": 5, "max": 2}}, "replicas.min (5) must be less than or equal to replicas.max (2)"),
        ({"output": {"stream": "a", "stage": "b"}}, "set exactly one of output.stream or output.stage"),
        ({"output": {}}, "set exactly one of output.stream or output.stage"),
        ({"retry": {"baseSeconds": 10, "maxSeconds": 5}}, "retry.baseSeconds (10.0) must not exceed"),
        (
            {"env": [{"name": "REDIS_URL", "value": "redis://x"}]},
            "must not set variables the operator or the worker derive",
        ),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "names must be unique (repeated: A)"),
        ({"env": [{"name": "A"}]}, "env A: set exactly one of value or secretKeyRef"),
        ({"env": [{"name": "1BAD", "value": "x"}]}, "String should match pattern"),
        ({"processor": "not a processor!"}, "String should match pattern"),
        ({"resources": {"limits": {"memory": "lots"}}}, "'lots' is not a Kubernetes quantity"),
        ({"replicas": {"min": -1}}, "greater than or equal to 0"),
        ({"autoscaling": {"lagCount": 0}}, "greater than or equal to 1"),
        ({"worker": {"concurrency": 0}}, "greater than or equal to 1"),
        ({"deletionPolicy": "Destroy"}, "Input should be 'Retain' or 'Delete'"),
        ({"replica": {"min": 1}}, "Extra inputs are not permitted"),
        ({"redis": {"urlSecretRef": {"name": "Bad_Name", "key": "url"}}}, "String should match pattern"),
        ({"input": "has space"}, "String should match pattern"),
        (
            {"env": [{"name": "BILLING_URL", "value": "http://litellm:4000"}], "worker": {"concurrency": 2}},
            "only safe with worker.concurrency 1",
        ),
        (
            {
                "env": [
                    {"name": "BILLING_URL", "secretKeyRef": {"name": "b", "key": "url"}},
                    {"name": "BILLING_SWAP_ENV", "value": "true"},
                ],
                "worker": {"concurrency": 4},
            },
            "(got worker.concurrency 4)",
        ),
    ],
)
def test_bad_specs_are_rejected_with_a_clear_message(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        PhoenixStageSpec.model_validate({**MINIMAL_SPEC, **change})
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "BILLING_URL", "value": "http://litellm:4000"}, {"name": "BILLING_SWAP_ENV", "value": "False"}],
        [{"name": "BILLING_URL", "value": ""}],  # empty counts as unset for the worker
        [{"name": "OTHER", "value": "x"}],
    ],
)
def test_concurrency_above_one_is_fine_without_env_swapping(env: list[dict[str, Any]]) -> None:
    assert PhoenixStageSpec.model_validate({**MINIMAL_SPEC, "env": env, "worker": {"concurrency": 8}}).env


def test_processor_accepts_entry_points_and_import_paths() -> None:
    for processor in ("router", "my-plugin.v2", "phoenix.stages.router:RouterProcessor", "pkg.mod:Outer.Inner"):
        assert PhoenixStageSpec.model_validate({**MINIMAL_SPEC, "processor": processor}).processor == processor


def test_quantities_accept_integers_and_suffixes() -> None:
    spec = PhoenixStageSpec.model_validate({**MINIMAL_SPEC, "resources": {"requests": {"cpu": 1, "memory": "1.5Gi"}}})
    assert spec.resources is not None and spec.resources.requests == {"cpu": 1, "memory": "1.5Gi"}


def test_whole_object_checks_kind_and_name() -> None:
    body = {"apiVersion": "phoenix.io/v1alpha1", "kind": "PhoenixStage", "metadata": {"name": "router"}}
    assert PhoenixStage.model_validate({**body, "spec": MINIMAL_SPEC}).metadata.name == "router"
    with pytest.raises(ValidationError, match=r"expected apiVersion phoenix\.io/v1alpha1 kind PhoenixStage"):
        PhoenixStage.model_validate({**body, "kind": "Deployment", "spec": MINIMAL_SPEC})
    with pytest.raises(ValidationError, match="String should match pattern"):
        PhoenixStage.model_validate({**body, "metadata": {"name": "Router.v1"}, "spec": MINIMAL_SPEC})


def test_status_reads_back_kopf_bookkeeping_and_timestamps() -> None:
    status = PhoenixStageStatus.model_validate(
        {
            "observedGeneration": 3,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Reconciled",
                    "message": "",
                    "lastTransitionTime": "2025-01-02T03:04:05Z",
                    "observedGeneration": 3,
                },
            ],
            "queue": {"length": 5, "pending": 2, "lag": 3, "oldestPendingSeconds": 12, "dlqLength": 0, "consumers": 1},
            "kopf": {"progress": {}},
            "reconcile": {"result": "from a kopf handler"},
        }
    )
    assert status.conditions[0].last_transition_time.year == 2025
    assert status.queue is not None and status.queue.lag == 3
    assert "kopf" not in status.to_k8s()


@pytest.mark.parametrize(
    ("text", "maxlen", "age_ms"),
    [("maxlen:100000", 100_000, None), ("age:7d", None, 7 * 86_400_000), ("age:90m", None, 90 * 60_000)],
)
def test_output_retention_forms(text: str, maxlen: int | None, age_ms: int | None) -> None:
    assert (Retention.parse(text).maxlen, Retention.parse(text).age_ms) == (maxlen, age_ms)
    PhoenixStageSpec.model_validate({**MINIMAL_SPEC, "output": {"stream": "sink", "retention": text}})


@pytest.mark.parametrize("text", ["100000", "maxlen:0", "maxlen:-5", "age:7", "age:7w", "age:0s", "forever"])
def test_output_retention_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="maxlen:<entries>"):
        Retention.parse(text)
    with pytest.raises(ValidationError):
        PhoenixStageSpec.model_validate({**MINIMAL_SPEC, "output": {"stream": "sink", "retention": text}})


def test_output_retention_is_for_a_stream_not_for_a_stage() -> None:
    with pytest.raises(ValidationError, match=r"output\.retention is for a stream no consumer group reads"):
        PhoenixStageSpec.model_validate({**MINIMAL_SPEC, "output": {"stage": "parser", "retention": "maxlen:10"}})


_SECRET_REF = {"secretKeyRef": {"name": "llm", "key": "api-key"}}
# (env, worker tuning) -> the part of the refusal both the models and the API server give; None: admitted.
ENV_ADMISSION: dict[str, tuple[list[dict[str, Any]], dict[str, Any], str | None]] = {
    # The worker reads its settings case-insensitively: `redis_url` would point it at another Redis.
    "reserved lower case": ([{"name": "redis_url", "value": "redis://elsewhere:6379"}], {}, "in any letter case"),
    "reserved mixed case": ([{"name": "Input_Queue", "value": "other"}], {}, "in any letter case"),
    "reserved concurrency": ([{"name": "concurrency", "value": "64"}], {}, "in any letter case"),
    "reserved consumer name": ([{"name": "CONSUMER_NAME", "value": "same-for-all"}], {}, "in any letter case"),
    "api key in plain text": ([{"name": "OPENAI_API_KEY", "value": "sk-plain"}], {}, "use secretKeyRef"),
    "password in plain text": ([{"name": "db_password", "value": "hunter2"}], {}, "use secretKeyRef"),
    "token in plain text": ([{"name": "GITHUB_TOKEN", "value": "ghp_x"}], {}, "use secretKeyRef"),
    "secret in plain text": ([{"name": "ClientSecretValue", "value": "x"}], {}, "use secretKeyRef"),
    "billing in lower case": (
        [{"name": "billing_url", "value": "http://litellm:4000"}],
        {"concurrency": 4},
        "only safe with worker.concurrency 1",
    ),
    # Credentials under names the first rule (*_KEY, *PASSWORD*, *TOKEN*, *SECRET*) let through, and in URLs.
    "otlp headers in plain text": (
        [{"name": "OTEL_EXPORTER_OTLP_HEADERS", "value": "authorization=Bearer%20abc"}],
        {},
        "use secretKeyRef",
    ),
    "otlp trace headers in plain text": (
        [{"name": "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "value": "x-api=abc"}],
        {},
        "use secretKeyRef",
    ),
    "a passwd in plain text": ([{"name": "DB_PASSWD", "value": "hunter2"}], {}, "use secretKeyRef"),
    "an apikey in plain text": ([{"name": "OPENAI_APIKEY", "value": "sk-plain"}], {}, "use secretKeyRef"),
    "a credential in plain text": ([{"name": "GCP_CREDENTIALS", "value": "{}"}], {}, "use secretKeyRef"),
    "basic auth in plain text": ([{"name": "proxy_auth", "value": "user:pw"}], {}, "use secretKeyRef"),
    "a dsn in plain text": (
        [{"name": "SENTRY_DSN", "value": "https://k@o1.ingest.sentry.io/1"}],
        {},
        "use secretKeyRef",
    ),
    "a database url": ([{"name": "DATABASE_URL", "value": "postgres://db:5432/app"}], {}, "use secretKeyRef"),
    "a url with a password": (
        [{"name": "CACHE_URL", "value": "redis://:hunter2@cache:6379/0"}],
        {},
        "use secretKeyRef",
    ),
    "a url with a user": ([{"name": "UPSTREAM", "value": "https://bot@api.example.com/v1"}], {}, "use secretKeyRef"),
    "a url with user info in a list": (
        [{"name": "BROKERS", "value": "kafka://h1:9092,kafka://app:pw@h2:9092"}],
        {},
        "use secretKeyRef",
    ),
    "a url without user info": (
        [{"name": "CACHE_URL", "value": "http://cache:8080/p?to=a@b"}, {"name": "NOTIFY", "value": "ops@example.com"}],
        {},
        None,
    ),
    "api key from a secret": ([{"name": "OPENAI_API_KEY", **_SECRET_REF}], {}, None),
    "empty api key": ([{"name": "OPENAI_API_KEY", "value": ""}], {}, None),
    "ordinary values": ([{"name": "LOG_LEVEL", "value": "debug"}, {"name": "KEYBOARD", "value": "us"}], {}, None),
}


@pytest.mark.parametrize("case", list(ENV_ADMISSION))
def test_env_admission_by_the_models(case: str) -> None:
    env, worker, refusal = ENV_ADMISSION[case]
    admitted = admitted_by_the_models({**MINIMAL_SPEC, "env": env, "worker": worker}, refusal)
    assert refusal is not None or (admitted is not None and admitted.env)


@pytest.mark.timeout(120)
@pytest.mark.kube
@pytest.mark.parametrize("case", list(ENV_ADMISSION))
def test_env_admission_by_the_api_server(case: str, kube_cluster: ControlPlane, kube_namespace: str) -> None:
    """The CEL rules of the installed CRD refuse what the models refuse, with the same message."""
    env, worker, refusal = ENV_ADMISSION[case]
    spec = {**MINIMAL_SPEC, "env": env, "worker": worker}
    admitted_by_the_api_server(kube_cluster, kube_namespace, "envcheck", spec, refusal)


_URL_REF = {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}}
# spec.redis -> the part of the refusal both the models and the API server give; None: admitted.
REDIS_ADMISSION: dict[str, tuple[dict[str, Any], str | None]] = {
    "standalone by default": (_URL_REF, None),
    "sentinel with its master": ({**_URL_REF, "mode": "sentinel", "sentinel": {"masterName": "mymaster"}}, None),
    "sentinel with its own credentials and mTLS": (
        {
            **_URL_REF,
            "mode": "sentinel",
            "sentinel": {
                "masterName": "mymaster",
                "username": "watcher",
                "passwordSecretRef": {"name": "sentinel-auth", "key": "password"},
            },
            "tls": {"caSecretRef": {"name": "ca", "key": "ca.crt"}, "clientCertSecretRef": {"name": "client"}},
        },
        None,
    ),
    "sentinel without a master": ({**_URL_REF, "mode": "sentinel"}, "redis.mode sentinel needs"),
    "a master outside sentinel mode": (
        {**_URL_REF, "sentinel": {"masterName": "mymaster"}},
        "redis.sentinel is only read with redis.mode sentinel",
    ),
    "cluster": ({**_URL_REF, "mode": "cluster"}, None),
    "an unknown mode": ({**_URL_REF, "mode": "replicated"}, "replicated"),
    "a client certificate by key": (
        {**_URL_REF, "tls": {"clientCertSecretRef": {"name": "client", "key": "tls.crt"}}},
        "key",
    ),
}


@pytest.mark.parametrize("case", list(REDIS_ADMISSION))
def test_redis_admission_by_the_models(case: str) -> None:
    redis, refusal = REDIS_ADMISSION[case]
    admitted = admitted_by_the_models({**MINIMAL_SPEC, "redis": redis}, refusal)
    assert refusal is not None or (admitted is not None and admitted.redis.url_secret_ref.name == "phoenix-redis")


@pytest.mark.kube
@pytest.mark.parametrize("case", list(REDIS_ADMISSION))
def test_redis_admission_by_the_api_server(case: str, kube_cluster: ControlPlane, kube_namespace: str) -> None:
    """The installed CRD (schema and CEL rules) refuses what the models refuse, with the same words."""
    redis, refusal = REDIS_ADMISSION[case]
    admitted_by_the_api_server(kube_cluster, kube_namespace, "redischeck", {**MINIMAL_SPEC, "redis": redis}, refusal)


# spec.pod, every field set: what a platform team writes for a private image read through workload identity.
FULL_POD: dict[str, Any] = {
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "reader",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "phoenix", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["work"]}]}]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "router"}},
        }
    ],
    "priorityClassName": "pipelines",
    "labels": {"team": "search", "cost-center": "cc-42"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "envFrom": [{"configMapRef": {"name": "router-config"}}, {"prefix": "S3_", "secretRef": {"name": "s3"}}],
    "volumes": [
        {"name": "models", "configMap": {"name": "models"}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
    ],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    "terminationGracePeriodSeconds": 200,
}
_TOKEN_SOURCE = {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}
_TOKEN_VOLUME = {"name": "token", "projected": {"sources": [_TOKEN_SOURCE]}}
_TOKEN_MOUNT = {"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}
# spec.pod -> the part of the refusal both the models and the API server give; None: admitted.
POD_ADMISSION: dict[str, tuple[dict[str, Any], str | None]] = {
    "every field set": (FULL_POD, None),
    "privileged": ({"securityContext": {"privileged": True}}, "spec.pod.securityContext is refused"),
    "root": ({"securityContext": {"runAsUser": 0}}, "spec.pod.securityContext is refused"),
    "host network": ({"hostNetwork": True}, "forbids sharing the node's namespaces"),
    "host pid": ({"hostPID": False}, "forbids sharing the node's namespaces"),
    "host path": (
        {"volumes": [{"name": "node", "hostPath": {"path": "/var/run/docker.sock"}}]},
        "hostPath volumes are refused",
    ),
    "two sources in one volume": (
        {"volumes": [{"name": "both", "emptyDir": {}, "secret": {"secretName": "x"}}]},
        "needs exactly one of configMap",
    ),
    "the operator's volume name": ({"volumes": [{"name": "tmp", "emptyDir": {}}]}, "are the operator's own"),
    "a mount over /tmp": (
        {"volumes": [{"name": "big", "emptyDir": {}}], "volumeMounts": [{"name": "big", "mountPath": "/tmp"}]},
        "must not mount over /tmp",
    ),
    "a mount into the TLS directory": (
        {
            "volumes": [{"name": "certs", "secret": {"secretName": "c"}}],
            "volumeMounts": [{"name": "certs", "mountPath": "/etc/phoenix/redis-tls/extra"}],
        },
        "must not mount over",
    ),
    "a mount of no volume": ({"volumeMounts": [{"name": "ghost", "mountPath": "/ghost"}]}, "must be one of"),
    "a selector label": ({"labels": {"app.kubernetes.io/instance": "other"}}, "selects its pods by them"),
    "a phoenix label": ({"labels": {"phoenix.io/anything": "x"}}, "selects its pods by them"),
    "a restart annotation": (
        {"annotations": {"phoenix.io/restartedAt": "2026-01-01T00:00:00Z"}},
        "must not set the operator's own annotations",
    ),
    "a scrape annotation": ({"annotations": {"prometheus.io/port": "9999"}}, "operator's own annotations"),
    # A token of the pods' ServiceAccount through a projected volume: only when the stage asks for it.
    "a service account token": (
        {"serviceAccountName": "reader", "volumes": [_TOKEN_VOLUME], "volumeMounts": [_TOKEN_MOUNT]},
        "refused unless spec.pod.allowServiceAccountToken is true",
    ),
    "a service account token beside a secret": (
        {
            "volumes": [{"name": "token", "projected": {"sources": [{"secret": {"name": "s"}}, _TOKEN_SOURCE]}}],
        },
        "refused unless spec.pod.allowServiceAccountToken is true",
    ),
    "a service account token not allowed": (
        {"allowServiceAccountToken": False, "volumes": [_TOKEN_VOLUME]},
        "refused unless spec.pod.allowServiceAccountToken is true",
    ),
    "a service account token allowed": (
        {"serviceAccountName": "reader", "allowServiceAccountToken": True, "volumes": [_TOKEN_VOLUME]},
        None,
    ),
    "projected secrets, config maps and the pod's fields": (
        {
            "volumes": [
                {
                    "name": "bundle",
                    "projected": {
                        "defaultMode": 0o440,
                        "sources": [
                            {"secret": {"name": "s", "items": [{"key": "k", "path": "k"}]}},
                            {"configMap": {"name": "c"}},
                            {
                                "downwardAPI": {
                                    "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                                }
                            },
                        ],
                    },
                }
            ],
        },
        None,
    ),
    "two sources in one projection": (
        {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "s"}, "configMap": {"name": "c"}}]}}]},
        "needs exactly one of secret, configMap, downwardAPI, serviceAccountToken",
    ),
    "a projected mode beyond 0777": (
        {"volumes": [{"name": "p", "projected": {"defaultMode": 512, "sources": [{"configMap": {"name": "c"}}]}}]},
        "less than or equal to 511",
    ),
    "envFrom of both kinds": (
        {"envFrom": [{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}]},
        "exactly one of configMapRef or secretRef",
    ),
}


@pytest.mark.parametrize("case", list(POD_ADMISSION))
def test_pod_admission_by_the_models(case: str) -> None:
    pod, refusal = POD_ADMISSION[case]
    admitted = admitted_by_the_models({**MINIMAL_SPEC, "pod": pod}, refusal)
    assert refusal is not None or (admitted is not None and admitted.pod.to_k8s() == pod)


@pytest.mark.kube
@pytest.mark.parametrize("case", list(POD_ADMISSION))
def test_pod_admission_by_the_api_server(case: str, kube_cluster: ControlPlane, kube_namespace: str) -> None:
    """The installed CRD's CEL rules refuse what would relax the restricted security context, in the models'
    words; an admitted spec.pod is stored as written (Kubernetes-typed fields such as affinity are not pruned)."""
    pod, refusal = POD_ADMISSION[case]
    stored = admitted_by_the_api_server(kube_cluster, kube_namespace, "podcheck", {**MINIMAL_SPEC, "pod": pod}, refusal)
    assert refusal is not None or (stored is not None and stored["spec"]["pod"] == pod)


@pytest.mark.parametrize("source", ["clusterTrustBundle", "podCertificate"])
def test_a_projected_source_the_schema_does_not_declare_is_refused_by_the_models(source: str) -> None:
    """A pod certificate is a credential of the pod's ServiceAccount as a token is, and newer Kubernetes versions
    add sources: only the declared ones are admitted."""
    volume = {"name": "p", "projected": {"sources": [{source: {"signerName": "example.com/x"}}]}}
    admitted_by_the_models({**MINIMAL_SPEC, "pod": {"volumes": [volume]}}, "Extra inputs are not permitted")


@pytest.mark.kube
@pytest.mark.parametrize("source", ["clusterTrustBundle", "podCertificate"])
def test_a_projected_source_the_schema_does_not_declare_is_refused_by_the_api_server(
    source: str, kube_cluster: ControlPlane, kube_namespace: str
) -> None:
    """kubectl validates strictly: a field the schema does not declare is an error, not pruned in silence."""
    volume = {"name": "p", "projected": {"sources": [{source: {"signerName": "example.com/x"}}]}}
    spec = {**MINIMAL_SPEC, "pod": {"volumes": [volume]}}
    admitted_by_the_api_server(
        kube_cluster,
        kube_namespace,
        "projcheck",
        spec,
        f'unknown field "spec.pod.volumes[0].projected.sources[0].{source}"',
    )


_VOLUME = {"name": "models", "emptyDir": {}}
# Specs a generated run (tests/test_fuzz_stage_specs.py) found the models and the API server to disagree on, or the
# models to admit while the API server refused the Deployment built from them: each is now refused by both, in
# (the models' words, the API server's words).
FOUND_BY_FUZZING: dict[str, tuple[dict[str, Any], str, str]] = {
    # pydantic's lax mode took "true" for true and 1 for true; the schema refuses another JSON type.
    "a boolean as a string": (
        {"pod": {"envFrom": [{"secretRef": {"name": "s", "optional": "true"}}]}},
        "Input should be a valid boolean",
        "must be of type boolean",
    ),
    "a boolean as a number": ({"paused": 1}, "Input should be a valid boolean", "must be of type boolean"),
    # `\S` is Unicode's whitespace to pydantic's regex engine and ASCII's only to RE2.
    "a vertical tab in a stream name": ({"dlq": "\x0b0"}, "String should match pattern", "should match"),
    "a next-line character in a group name": (
        {"consumerGroup": "g\x85"},
        "String should match pattern",
        "should match",
    ),
    # Beyond an int64, and at 2**63 - 1, which the API server's float64 bound makes 2**63.
    "a toleration past its bound": (
        {
            "pod": {
                "tolerations": [
                    {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2**63 - 1}
                ]
            }
        },
        "less than or equal to 9007199254740992",
        "less than or equal to",
    ),
    # What the API server refused in the Deployment, now refused at admission in the models' words.
    "a toleration without key or Exists": (
        {"pod": {"tolerations": [{}]}},
        "without a key tolerates every taint",
        "without a key tolerates every taint",
    ),
    "a toleration of any value with one": (
        {"pod": {"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}},
        "with operator Exists matches any value",
        "with operator Exists matches any value",
    ),
    "toleration seconds without NoExecute": (
        {"pod": {"tolerations": [{"key": "k", "tolerationSeconds": 60}]}},
        "applies to effect NoExecute only",
        "applies to effect NoExecute only",
    ),
    "a toleration key with a space": (
        {"pod": {"tolerations": [{"key": "bad key", "operator": "Exists"}]}},
        "tolerations[].key must be a qualified name",
        "tolerations[].key must be a qualified name",
    ),
    "a label key with a space": ({"pod": {"labels": {"bad key": "x"}}}, "key must be a qualified name", "key must be"),
    "an annotation key of two slashes": (
        {"pod": {"annotations": {"a/b/c": "x"}}},
        "key must be a qualified name",
        "key must be a qualified name",
    ),
    "a node selector key too long": (
        {"pod": {"nodeSelector": {"x" * 64: "linux"}}},
        "key must be a qualified name",
        "key must be a qualified name",
    ),
    "an extended resource without its limit": (
        {"resources": {"requests": {"cpu": "100m", "nvidia.com/gpu": "100m"}}},
        "counted in whole units and not overcommitted",
        "counted in whole units and not overcommitted",
    ),
    "an extended resource in part": (
        {"resources": {"limits": {"nvidia.com/gpu": "0.5"}}},
        "counted in whole units and not overcommitted",
        "counted in whole units and not overcommitted",
    ),
    "a request over its limit": (
        {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": 1}}},
        "each request must be at most its limit",
        "each request must be at most its limit",
    ),
    "a resource Kubernetes does not know": (
        {"resources": {"limits": {"gpu": "1"}}},
        "spec.resources names cpu, memory",
        "spec.resources names cpu, memory",
    ),
    "a negative quantity": (
        {"resources": {"limits": {"memory": "-1"}}},
        "is not a Kubernetes quantity",
        "should match",
    ),
    "two mounts at one path": (
        {"volumes": [_VOLUME], "volumeMounts": [{"name": "models", "mountPath": "/m"}] * 2},
        "mount paths must be unique",
        "mount paths must be unique",
    ),
    "a sub path out of its volume": (
        {"volumes": [_VOLUME], "volumeMounts": [{"name": "models", "mountPath": "/m", "subPath": "a/../../b"}]},
        "subPath must stay inside its volume",
        "subPath must stay inside its volume",
    ),
    # Probes beside them: the container runtime resolves the path, so these mounted over the operator's own.
    "a mount over /tmp by a detour": (
        {"volumes": [_VOLUME], "volumeMounts": [{"name": "models", "mountPath": "/x/../tmp"}]},
        "must be a clean path",
        "must be a clean path",
    ),
    "a mount over the TLS directory by a double slash": (
        {"volumes": [_VOLUME], "volumeMounts": [{"name": "models", "mountPath": "/etc//phoenix/redis-tls"}]},
        "must be a clean path",
        "must be a clean path",
    ),
}


def _found_spec(case: str) -> dict[str, Any]:
    change = FOUND_BY_FUZZING[case][0]
    pod = {key: change[key] for key in ("volumes", "volumeMounts") if key in change}
    return {**MINIMAL_SPEC, **({"pod": pod} if pod else change)}


@pytest.mark.parametrize("case", list(FOUND_BY_FUZZING))
def test_what_a_generated_run_found_is_refused_by_the_models(case: str) -> None:
    admitted_by_the_models(_found_spec(case), FOUND_BY_FUZZING[case][1])


@pytest.mark.kube
@pytest.mark.parametrize("case", list(FOUND_BY_FUZZING))
def test_what_a_generated_run_found_is_refused_by_the_api_server(
    case: str, kube_cluster: ControlPlane, kube_namespace: str
) -> None:
    admitted_by_the_api_server(kube_cluster, kube_namespace, "fuzzfound", _found_spec(case), FOUND_BY_FUZZING[case][2])


# What Kubernetes admits next to those refusals, which the models and the API server admit too.
NEAR_THE_REFUSALS: dict[str, dict[str, Any]] = {
    "tolerations": {
        "pod": {
            "tolerations": [
                {"operator": "Exists"},
                {"key": "example.com/gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2**53},
            ]
        }
    },
    "keys": {"pod": {"labels": {"example.com/team": "search"}, "nodeSelector": {"kubernetes.io/os": "linux"}}},
    "mounts": {
        "pod": {
            "volumes": [_VOLUME],
            "volumeMounts": [{"name": "models", "mountPath": "/etc/models/", "subPath": "a..b/c"}],
        }
    },
    "resources": {
        "resources": {"requests": {"cpu": 1, "nvidia.com/gpu": 1}, "limits": {"cpu": "1000m", "nvidia.com/gpu": "1"}}
    },
}


@pytest.mark.parametrize("case", list(NEAR_THE_REFUSALS))
def test_what_kubernetes_admits_near_those_refusals_is_admitted_by_the_models(case: str) -> None:
    admitted_by_the_models({**MINIMAL_SPEC, **NEAR_THE_REFUSALS[case]}, None)


@pytest.mark.kube
@pytest.mark.parametrize("case", list(NEAR_THE_REFUSALS))
def test_what_kubernetes_admits_near_those_refusals_is_admitted_by_the_api_server(
    case: str, kube_cluster: ControlPlane, kube_namespace: str
) -> None:
    admitted_by_the_api_server(kube_cluster, kube_namespace, "near", {**MINIMAL_SPEC, **NEAR_THE_REFUSALS[case]}, None)


_ROUTER_OUTPUTS = [{"name": "parser", "stage": "parser"}, {"name": "imaging", "stage": "imaging"}]
# spec.output / spec.outputs -> the part of the refusal both the models and the API server give; None: admitted.
OUTPUTS_ADMISSION: dict[str, tuple[dict[str, Any], str | None]] = {
    "named outputs": ({"outputs": _ROUTER_OUTPUTS}, None),
    "one output and named ones": ({"output": {"stage": "parser"}, "outputs": _ROUTER_OUTPUTS}, "not both"),
    "a name twice": (
        {"outputs": [{"name": "parser", "stage": "parser"}, {"name": "parser", "stage": "imaging"}]},
        "spec.outputs names must be unique",
    ),
    "a name that is no DNS label": ({"outputs": [{"name": "Parser_1", "stage": "parser"}]}, "name"),
    "no stage": ({"outputs": [{"name": "parser"}]}, "stage"),
}


@pytest.mark.parametrize("case", list(OUTPUTS_ADMISSION))
def test_outputs_admission_by_the_models(case: str) -> None:
    outputs, refusal = OUTPUTS_ADMISSION[case]
    admitted = admitted_by_the_models({**MINIMAL_SPEC, **outputs}, refusal)
    assert refusal is not None or (admitted is not None and [o.name for o in admitted.outputs or []])


@pytest.mark.kube
@pytest.mark.parametrize("case", list(OUTPUTS_ADMISSION))
def test_outputs_admission_by_the_api_server(case: str, kube_cluster: ControlPlane, kube_namespace: str) -> None:
    """The installed CRD refuses what the models refuse, with the same words."""
    outputs, refusal = OUTPUTS_ADMISSION[case]
    admitted_by_the_api_server(kube_cluster, kube_namespace, "outputscheck", {**MINIMAL_SPEC, **outputs}, refusal)
