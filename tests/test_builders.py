"""Pure builders: spec in, Kubernetes objects out, checked field by field without a cluster."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from phoenix.crds import RESERVED_ENV_NAMES, ConditionType, PhoenixStageSpec, StreamsStatus
from phoenix.keys import input_stream
from phoenix.operator.builders import (
    AutoscalingConfigError,
    Owner,
    RedisConnection,
    RedisUser,
    build_deployment,
    build_pod_disruption_budget,
    build_scaled_object,
    build_trigger_authentication,
    in_namespace,
    redis_connection,
    resolve_streams,
    scaled_object_patch,
)
from phoenix.operator.builders.keda import relayed_partitions
from phoenix.operator.record import SecretsRead
from phoenix.operator.status.conditions import new_condition, set_condition
from phoenix.redis_spec import RedisSpec, RedisSpecError
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.leaks import assert_shows_no_part_of

OWNER = Owner(api_version="phoenix.io/v1alpha1", kind="PhoenixStage", name="parser", namespace="docs", uid="uid-1")
USER = RedisUser("phoenix.docs", "phoenix-redis-user")
REDIS = {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}}
REDIS_WITH_PASSWORD = {**REDIS, "passwordSecretRef": {"name": "phoenix-redis", "key": "password"}}
REDIS_SENTINEL_MTLS = {
    **REDIS_WITH_PASSWORD,
    "mode": "sentinel",
    "sentinel": {
        "masterName": "mymaster",
        "username": "watcher",
        "passwordSecretRef": {"name": "sentinel-auth", "key": "password"},
    },
    "tls": {
        "caSecretRef": {"name": "redis-ca", "key": "bundle.pem"},
        "clientCertSecretRef": {"name": "phoenix-client"},
    },
}


def make_spec(**changes: Any) -> PhoenixStageSpec:
    return PhoenixStageSpec.model_validate({"processor": "parser", "image": "img:1", "redis": REDIS, **changes})


def connection_of(url: str) -> RedisConnection:
    return redis_connection(RedisSpec.from_url(url))


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return {var["name"]: var.get("value", var.get("valueFrom")) for var in container(deployment)["env"]}


# --- streams -------------------------------------------------------------------------------------------


def test_streams_default_from_the_stage_name() -> None:
    streams = resolve_streams("parser", "default", make_spec())
    assert (streams.input, streams.output) == ("phoenix:{default}:parser:input", None)
    assert (streams.consumer_group, streams.dlq) == ("parser-group", "phoenix:{default}:parser:dlq")


def test_output_stage_resolves_to_its_input_stream() -> None:
    assert (
        resolve_streams("parser", "default", make_spec(output={"stage": "grouper"})).output
        == "phoenix:{default}:grouper:input"
    )


def test_explicit_names_win() -> None:
    spec = make_spec(input="in", output={"stream": "out"}, consumerGroup="g", dlq="dead")
    assert StreamsStatus.of(resolve_streams("parser", "default", spec)).to_k8s() == {
        "input": "in",
        "output": "out",
        "consumerGroup": "g",
        "dlq": "dead",
        "partitions": 1,
    }


# --- deployment ----------------------------------------------------------------------------------------


def test_worker_env_maps_the_spec_to_the_runtime_variables() -> None:
    spec = make_spec(
        output={"stage": "grouper"},
        worker={
            "concurrency": 4,
            "lockTimeout": 120,
            "idempotencyTTL": 3600,
            "processingTimeout": 90,
            "claimIdleMs": 60000,
            "maxDeliveries": 3,
        },
        retry={"baseSeconds": 0.5, "maxSeconds": 30},
        circuitBreaker={"failureThreshold": 7, "resetTimeout": 12.5, "halfOpenCalls": 2},
    )
    assert env_of(build_deployment(OWNER, spec)) == {
        "SERVICE_NAME": "parser",
        "KEY_NAMESPACE": "docs",
        "STAGE_UID": "uid-1",  # by which its workers prove to the keys' ownership marker that they are its own
        "STAGE_CLUSTER": None,
        "PARTITIONS": "1",
        "INPUT_QUEUE": "phoenix:{docs}:parser:input",
        "OUTPUT_QUEUE": "phoenix:{docs}:grouper:input",
        "OUTPUT_PARTITIONS": "1",
        "CONSUMER_GROUP": "parser-group",
        "DLQ_NAME": "phoenix:{docs}:parser:dlq",
        "PROCESSOR": "parser",
        "LOCK_TIMEOUT": "120",
        "IDEMPOTENCY_TTL": "3600",
        "PROCESSING_TIMEOUT": "90",
        "CLAIM_IDLE_MS": "60000",
        "CONCURRENCY": "4",
        "MAX_DELIVERIES": "3",
        "RETRY_BASE_SECONDS": "0.5",
        "RETRY_MAX_SECONDS": "30",
        "CIRCUIT_FAILURE_THRESHOLD": "7",
        "CIRCUIT_RESET_TIMEOUT": "12.5",
        "CIRCUIT_HALF_OPEN_CALLS": "2",
        "SHUTDOWN_GRACE": "90",  # the whole processingTimeout (termination grace 105)
        "HEALTH_PORT": "8080",
        "OUTPUT_RETENTION": None,  # None: set, empty (the name alone), so no envFrom key of the name reaches it
        "OUTPUTS": None,
        "READ_MEMORY_BYTES": str(512 * 2**20 // 4),  # a quarter of the default memory limit, 512Mi
        "REDIS_MODE": "standalone",
        "REDIS_SENTINEL_MASTER": None,
        "REDIS_SENTINEL_USERNAME": None,
        "REDIS_TLS_CA_FILE": None,
        "REDIS_TLS_CERT_FILE": None,
        "REDIS_TLS_KEY_FILE": None,
        "MASKED_ENV": None,
        "REDIS_URL": {"secretKeyRef": {"name": "phoenix-redis", "key": "url"}},
        "REDIS_USERNAME": None,
        "REDIS_PASSWORD": None,
        "REDIS_SENTINEL_PASSWORD": None,
        "CONSUMER_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},  # the pod's own name: one consumer per pod
    }


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"output": {"stream": "x", "retention": "maxlen:5000"}, "redis": REDIS_SENTINEL_MTLS},
        {"output": {"stage": "grouper"}, "partitions": 4, "resources": {"requests": {"cpu": 1}}},
        {"pod": {"envFrom": [{"configMapRef": {"name": "settings"}}]}},
    ],
    ids=["final-stage", "sentinel-mtls-retention", "partitioned-no-limit", "env-from"],
)
@pytest.mark.parametrize("with_user", [False, True], ids=["url-user", "acl-user"])
def test_every_reserved_name_is_set_in_env_whatever_the_spec(changes: dict[str, Any], with_user: bool) -> None:
    """spec.env may set anything except what the builder sets itself, and the builder sets every one of those in
    `env`, empty where the stage has no value: Kubernetes gives `env` precedence over `envFrom`, so a ConfigMap's
    CONSUMER_NAME or OUTPUT_QUEUE never reaches the worker."""
    owner = replace(OWNER, cluster="cluster-east")
    env = container(build_deployment(owner, make_spec(**changes), redis_user=USER if with_user else None))["env"]
    names = [var["name"] for var in env]
    assert sorted(names) == sorted(RESERVED_ENV_NAMES)  # each once
    assert all(var.get("value") != "" for var in env)  # empty is the name alone, as the API server stores it


def test_partitioned_stage_derives_its_streams_and_forwards_to_the_next_stages_partitions() -> None:
    """A stage of 4 partitions names no input or DLQ (its workers derive one per partition); the next stage's
    count, read by the operator from that PhoenixStage, reaches the workers as OUTPUT_PARTITIONS."""
    spec = make_spec(partitions=4, output={"stage": "grouper"})
    env = env_of(build_deployment(OWNER, spec, output_partitions=8))
    assert (env["PARTITIONS"], env["OUTPUT_PARTITIONS"]) == ("4", "8")
    assert StreamsStatus.of(resolve_streams("parser", "docs", spec)).partitions == 4
    assert env["OUTPUT_QUEUE"] == "phoenix:{docs}:grouper:input"  # the next stage as a whole; the worker picks a lane
    assert env["INPUT_QUEUE"] is None and env["DLQ_NAME"] is None
    assert env_of(build_deployment(OWNER, make_spec(output={"stream": "sink"})))["OUTPUT_PARTITIONS"] == "1"


@pytest.mark.parametrize("named", [{"input": "in"}, {"dlq": "dead"}])
def test_partitioned_stage_cannot_name_its_streams(named: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="several partitions derives its input and DLQ"):
        make_spec(partitions=2, **named)
    assert make_spec(partitions=1, **named).partitions == 1


@pytest.mark.parametrize("partitions", [0, 1025])
def test_partitions_are_bounded(partitions: int) -> None:
    with pytest.raises(ValidationError, match="partitions"):
        make_spec(partitions=partitions)


def test_sentinel_and_tls_reach_the_worker_as_files_and_secret_refs_only() -> None:
    """The mode and the master's name are plain values; the Sentinel password comes from its Secret; the CA and the
    client certificate are files of one read-only projected volume, each Secret giving only the keys it is for."""
    deployment = build_deployment(OWNER, make_spec(redis=REDIS_SENTINEL_MTLS))
    env = env_of(deployment)
    assert {name: env[name] for name in env if name.startswith("REDIS_")} == {
        "REDIS_MODE": "sentinel",
        "REDIS_SENTINEL_MASTER": "mymaster",
        "REDIS_SENTINEL_USERNAME": "watcher",
        "REDIS_SENTINEL_PASSWORD": {"secretKeyRef": {"name": "sentinel-auth", "key": "password"}},
        "REDIS_TLS_CA_FILE": "/etc/phoenix/redis-tls/ca.crt",
        "REDIS_TLS_CERT_FILE": "/etc/phoenix/redis-tls/tls.crt",
        "REDIS_TLS_KEY_FILE": "/etc/phoenix/redis-tls/tls.key",
        "REDIS_URL": {"secretKeyRef": {"name": "phoenix-redis", "key": "url"}},
        "REDIS_USERNAME": None,  # no ACL user of the namespace: the URL's
        "REDIS_PASSWORD": None,
    }
    pod = deployment["spec"]["template"]["spec"]
    (tls,) = [volume for volume in pod["volumes"] if volume["name"] == "redis-tls"]
    assert tls == {
        "name": "redis-tls",
        "projected": {
            "defaultMode": 0o440,
            "sources": [
                {"secret": {"name": "redis-ca", "items": [{"key": "bundle.pem", "path": "ca.crt"}]}},
                {
                    "secret": {
                        "name": "phoenix-client",
                        "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
                    }
                },
            ],
        },
    }
    mount = {"name": "redis-tls", "mountPath": "/etc/phoenix/redis-tls", "readOnly": True}
    assert mount in container(deployment)["volumeMounts"]
    # No value of a variable is a secret: every credential is a secretKeyRef or a file.
    assert all("value" not in var for var in container(deployment)["env"] if "PASSWORD" in var["name"])


def test_a_ca_alone_mounts_only_the_ca() -> None:
    redis = {**REDIS, "tls": {"caSecretRef": {"name": "redis-ca", "key": "ca.crt"}}}
    deployment = build_deployment(OWNER, make_spec(redis=redis))
    env = env_of(deployment)
    assert env["REDIS_TLS_CA_FILE"] == "/etc/phoenix/redis-tls/ca.crt"
    assert env["REDIS_TLS_CERT_FILE"] is None and env["REDIS_TLS_KEY_FILE"] is None
    (tls,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "redis-tls"]
    assert [source["secret"]["name"] for source in tls["projected"]["sources"]] == ["redis-ca"]


def test_without_tls_there_is_no_tls_volume() -> None:
    deployment = build_deployment(OWNER, make_spec())
    assert [v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    assert container(deployment)["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]


def test_the_secrets_resource_versions_go_into_the_pod_template() -> None:
    """A changed resourceVersion changes the pod template, which is what rolls the workers; no value goes in."""
    plain = build_deployment(OWNER, make_spec())
    assert "phoenix.io/secret-versions" not in plain["spec"]["template"]["metadata"]["annotations"]
    read = SecretsRead(versions=(("vendor", ""), ("phoenix-redis", "812")))
    rolled = build_deployment(OWNER, make_spec(), secrets=read)
    annotations = rolled["spec"]["template"]["metadata"]["annotations"]
    assert annotations["phoenix.io/secret-versions"] == "phoenix-redis=812,vendor="


def test_masked_env_lists_the_variables_the_pods_take_from_secrets() -> None:
    """spec.env's secretKeyRef names and the keys of spec.pod.envFrom's Secrets (prefixed), as Kubernetes resolves
    them: `env` wins over `envFrom`, so a literal of the same name is no Secret's; a ConfigMap's keys are not
    read; the operator's own REDIS_URL is masked by the worker itself."""
    spec = make_spec(
        env=[
            {"name": "VENDOR_TOKEN", "secretKeyRef": {"name": "vendor", "key": "token"}},
            {"name": "API_REGION", "value": "eu"},
        ],
        pod={
            "envFrom": [
                {"secretRef": {"name": "api"}},
                {"prefix": "DB_", "secretRef": {"name": "db", "optional": True}},
                {"configMapRef": {"name": "settings"}},
                {"secretRef": {"name": "missing", "optional": True}},
            ]
        },
    )
    keys = {"api": ("API_KEY", "API_REGION", "REDIS_URL"), "db": ("password", "pin")}
    env = env_of(build_deployment(OWNER, spec, secrets=SecretsRead(keys=keys)))
    assert env["MASKED_ENV"] == "API_KEY,DB_password,DB_pin,VENDOR_TOKEN"
    assert env_of(build_deployment(OWNER, make_spec()))["MASKED_ENV"] is None  # set, empty: nothing to mask
    assert WorkerSettings(service_name="s", processor="p", masked_env=env["MASKED_ENV"]).masked_variables == (
        "API_KEY",
        "DB_password",
        "DB_pin",
        "VENDOR_TOKEN",
    )


def test_read_memory_follows_the_pods_memory_limit() -> None:
    """One read's entries fit in a quarter of the memory limit; without a limit the worker's default holds."""
    assert env_of(build_deployment(OWNER, make_spec(resources={"limits": {"memory": "2Gi"}})))[
        "READ_MEMORY_BYTES"
    ] == str(2**31 // 4)
    unlimited = env_of(build_deployment(OWNER, make_spec(resources={"requests": {"cpu": 1}})))
    assert unlimited["READ_MEMORY_BYTES"] == str(WorkerSettings.model_fields["read_memory_bytes"].default)


@pytest.mark.parametrize("memory", ["1", "3", "1m", 0])
def test_a_memory_limit_of_a_few_bytes_still_reads_one_entry_at_a_time(memory: str | int) -> None:
    """A quarter of it was 0, which the worker refuses at start (READ_MEMORY_BYTES >= 1): the pods crash-looped
    (found by tests/test_fuzz_stage_specs.py)."""
    env = env_of(build_deployment(OWNER, make_spec(resources={"limits": {"memory": memory}})))
    assert env["READ_MEMORY_BYTES"] == "1"
    assert (
        WorkerSettings(service_name="s", processor="p", read_memory_bytes=env["READ_MEMORY_BYTES"]).read_memory_bytes
        == 1
    )


def test_final_stage_has_no_output_queue() -> None:
    assert env_of(build_deployment(OWNER, make_spec()))["OUTPUT_QUEUE"] is None


def test_output_retention_goes_to_the_worker_only_when_set() -> None:
    retained = env_of(build_deployment(OWNER, make_spec(output={"stream": "sink", "retention": "age:7d"})))
    assert (retained["OUTPUT_QUEUE"], retained["OUTPUT_RETENTION"]) == ("sink", "age:7d")
    assert env_of(build_deployment(OWNER, make_spec(output={"stream": "sink"})))["OUTPUT_RETENTION"] is None


def test_extra_env_follows_the_runtime_env() -> None:
    spec = make_spec(
        env=[
            {"name": "LOG_LEVEL", "value": "DEBUG"},
            {"name": "BILLING_MASTER_KEY", "secretKeyRef": {"name": "billing", "key": "master"}},
        ]
    )
    env = container(build_deployment(OWNER, spec))["env"]
    assert env[-2:] == [
        {"name": "LOG_LEVEL", "value": "DEBUG"},
        {"name": "BILLING_MASTER_KEY", "valueFrom": {"secretKeyRef": {"name": "billing", "key": "master"}}},
    ]


def test_container_runs_the_worker_with_probes_on_the_health_port() -> None:
    worker = container(build_deployment(OWNER, make_spec()))
    assert worker["command"] == ["phoenix", "worker"]
    assert worker["image"] == "img:1"
    assert worker["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert worker["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert worker["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}


def test_the_liveness_probe_restarts_a_hung_worker_before_its_peers_would_reclaim_its_entries() -> None:
    """docs/durability.md: a worker whose Redis calls hang fails /healthz LIVENESS_TIMEOUT after its last progress
    (the worker's default: the operator sets neither it nor BLOCK_MS); the kubelet restarts it at most
    periodSeconds x failureThreshold later."""
    deployment = build_deployment(OWNER, make_spec())
    probe, env = container(deployment)["livenessProbe"], env_of(deployment)
    assert "LIVENESS_TIMEOUT" not in env and "BLOCK_MS" not in env
    worker = WorkerSettings(service_name=OWNER.name, processor="parser", claim_idle_ms=int(env["CLAIM_IDLE_MS"]))
    assert worker.liveness_timeout is not None
    restarted_within = worker.liveness_timeout + probe["periodSeconds"] * probe["failureThreshold"]
    assert restarted_within == 90
    assert restarted_within < worker.claim_idle_ms / 1000


def test_pod_is_hardened() -> None:
    deployment = build_deployment(OWNER, make_spec())
    pod = deployment["spec"]["template"]["spec"]
    security = container(deployment)["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 65532
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["terminationGracePeriodSeconds"] == 615  # processingTimeout (600) + the shutdown margin
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]
    assert container(deployment)["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]


FULL_POD: dict[str, Any] = {
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "reader",
    "nodeSelector": {"pool": "work"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "phoenix", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
    "priorityClassName": "pipelines",
    "labels": {"team": "search"},
    "annotations": {"sidecar.istio.io/inject": "false"},
    "envFrom": [{"configMapRef": {"name": "parser-config"}}, {"prefix": "S3_", "secretRef": {"name": "s3"}}],
    "volumes": [{"name": "models", "configMap": {"name": "models"}}],
    "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    "terminationGracePeriodSeconds": 200,
}


def test_every_spec_pod_field_reaches_the_deployment() -> None:
    deployment = build_deployment(OWNER, make_spec(pod=FULL_POD), restarted_at="2026-01-01T00:00:00Z")
    template = deployment["spec"]["template"]
    pod = template["spec"]
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["serviceAccountName"] == pod["serviceAccount"] == "reader"
    assert pod["automountServiceAccountToken"] is False  # a ServiceAccount for workload identity, no API token
    assert pod["nodeSelector"] == {"pool": "work"}
    assert pod["tolerations"] == FULL_POD["tolerations"]
    assert pod["affinity"] == FULL_POD["affinity"]
    assert pod["topologySpreadConstraints"] == FULL_POD["topologySpreadConstraints"]
    assert pod["priorityClassName"] == "pipelines"
    assert pod["terminationGracePeriodSeconds"] == 200
    assert env_of(deployment)["SHUTDOWN_GRACE"] == "185"  # the grace less the shutdown margin
    # Beside the operator's own, which stay: the selector still selects the pods, the scrape and restart stay.
    assert template["metadata"]["labels"] == {
        "team": "search",
        "app.kubernetes.io/name": "phoenix-worker",
        "app.kubernetes.io/instance": "parser",
        "app.kubernetes.io/managed-by": "phoenix-operator",
        "phoenix.io/stage": "parser",
    }
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["annotations"] == {
        "sidecar.istio.io/inject": "false",
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8080",
        "prometheus.io/path": "/metrics",
        "phoenix.io/restartedAt": "2026-01-01T00:00:00Z",
    }
    assert deployment["metadata"]["annotations"]["phoenix.io/pod-keys"] == (
        '{"labels":["team"],"annotations":["sidecar.istio.io/inject"]}'
    )
    worker = container(deployment)
    assert worker["envFrom"] == FULL_POD["envFrom"]
    assert pod["volumes"] == [
        {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
        {"name": "models", "configMap": {"name": "models"}},
    ]
    assert worker["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "models", "mountPath": "/models", "readOnly": True},
    ]
    # The restricted security context is the operator's, whatever spec.pod says.
    assert worker["securityContext"] == container(build_deployment(OWNER, make_spec()))["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True and "hostNetwork" not in pod


def test_unset_pod_fields_are_absent_so_a_merge_patch_removes_them() -> None:
    pod = build_deployment(OWNER, make_spec())["spec"]["template"]["spec"]
    unset = ("serviceAccountName", "serviceAccount", "imagePullSecrets", "nodeSelector", "tolerations", "affinity")
    assert all(pod[key] is None for key in (*unset, "topologySpreadConstraints", "priorityClassName"))
    assert "envFrom" not in container(build_deployment(OWNER, make_spec()))


@pytest.mark.parametrize(("timeout", "grace", "drain"), [(1, 16, 1), (120, 135, 120), (86400, 86415, 86400)])
def test_the_termination_grace_follows_the_processing_timeout(timeout: int, grace: int, drain: int) -> None:
    """A record started just before SIGTERM may run its whole processingTimeout and still be committed: the
    worker drains that long, and the kubelet waits the shutdown margin more before its SIGKILL."""
    deployment = build_deployment(OWNER, make_spec(worker={"processingTimeout": timeout}))
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
    assert env_of(deployment)["SHUTDOWN_GRACE"] == str(drain)


def test_a_termination_grace_shorter_than_the_margin_drains_nothing() -> None:
    deployment = build_deployment(OWNER, make_spec(pod={"terminationGracePeriodSeconds": 5}))
    assert env_of(deployment)["SHUTDOWN_GRACE"] == "0"


def test_a_stage_of_several_pods_has_a_disruption_budget_of_one_pod_at_a_time() -> None:
    budget = build_pod_disruption_budget(OWNER, make_spec(replicas={"min": 0, "max": 2}))
    assert budget is not None
    assert (budget["apiVersion"], budget["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert budget["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert budget["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "phoenix-operator"  # watched for drift
    assert budget["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": build_deployment(OWNER, make_spec())["spec"]["selector"]["matchLabels"]},
    }


@pytest.mark.parametrize(
    "changes",
    [
        {"replicas": {"min": 0, "max": 1}},
        {"replicas": {"min": 1, "max": 1}},
        # At zero: paused, or no autoscaling at min 0; without autoscaling the stage runs exactly min pods.
        {"replicas": {"min": 2, "max": 5}, "paused": True},
        {"replicas": {"min": 0, "max": 5}, "autoscaling": {"enabled": False}},
        {"replicas": {"min": 1, "max": 5}, "autoscaling": {"enabled": False}},
    ],
    ids=["max-1-from-0", "max-1", "paused", "no-autoscaling-at-0", "no-autoscaling-at-1"],
)
def test_a_stage_of_at_most_one_pod_has_no_disruption_budget(changes: dict[str, Any]) -> None:
    assert build_pod_disruption_budget(OWNER, make_spec(**changes)) is None


def test_a_stage_without_autoscaling_has_a_disruption_budget_from_two_pods() -> None:
    spec = make_spec(replicas={"min": 2, "max": 5}, autoscaling={"enabled": False})
    assert build_pod_disruption_budget(OWNER, spec) is not None


def test_default_and_custom_resources() -> None:
    assert container(build_deployment(OWNER, make_spec()))["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }
    # A number is written as a string: the client the operator creates the Deployment with refuses a number there
    # (found by tests/test_fuzz_stage_specs.py; tests/test_built_objects.py creates it).
    custom = make_spec(resources={"limits": {"memory": "2Gi", "cpu": 2}})
    assert container(build_deployment(OWNER, custom))["resources"] == {"limits": {"memory": "2Gi", "cpu": "2"}}


def test_labels_selector_and_owner_reference() -> None:
    deployment = build_deployment(OWNER, make_spec())
    meta = deployment["metadata"]
    assert (meta["name"], meta["namespace"]) == ("parser", "docs")
    assert meta["labels"] == {
        "app.kubernetes.io/name": "phoenix-worker",
        "app.kubernetes.io/instance": "parser",
        "app.kubernetes.io/managed-by": "phoenix-operator",
        "phoenix.io/stage": "parser",
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "phoenix.io/v1alpha1",
            "kind": "PhoenixStage",
            "name": "parser",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        },
    ]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_pod_template_is_scraped_by_prometheus() -> None:
    annotations = build_deployment(OWNER, make_spec())["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8080",
        "prometheus.io/path": "/metrics",
    }


def test_restart_annotation_is_carried_when_given() -> None:
    restarted = build_deployment(OWNER, make_spec(), restarted_at="2025-05-01T10:00:00Z")
    annotations = restarted["spec"]["template"]["metadata"]["annotations"]
    assert annotations["phoenix.io/restartedAt"] == "2025-05-01T10:00:00Z"


def test_replicas_start_at_min_and_drop_to_zero_when_paused() -> None:
    assert build_deployment(OWNER, make_spec(replicas={"min": 2, "max": 4}))["spec"]["replicas"] == 2
    assert build_deployment(OWNER, make_spec(replicas={"min": 2, "max": 4}, paused=True))["spec"]["replicas"] == 0


# --- KEDA ----------------------------------------------------------------------------------------------


def test_scaled_object_scales_on_lag_and_stays_up_for_pending_entries_and_retries() -> None:
    spec = make_spec(
        redis=REDIS_WITH_PASSWORD,
        replicas={"min": 0, "max": 7},
        autoscaling={"lagCount": 25, "activationLagCount": 2, "pollingInterval": 5, "cooldownPeriod": 60},
        worker={"concurrency": 16},
    )
    scaled = build_scaled_object(OWNER, spec, connection_of("redis://:pw@redis.docs:6380/3"))
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert scaled["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert "annotations" not in scaled["metadata"]
    body = scaled["spec"]
    assert body["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "parser"}
    assert (body["minReplicaCount"], body["maxReplicaCount"]) == (0, 7)
    assert (body["pollingInterval"], body["cooldownPeriod"]) == (5, 60)
    connection = {"address": "redis.docs:6380", "databaseIndex": "3", "enableTLS": "false"}
    group = {"stream": "phoenix:{docs}:parser:input", "consumerGroup": "parser-group"}
    auth = {"authenticationRef": {"name": "parser-redis"}}
    assert body["triggers"] == [
        {
            "type": "redis-streams",
            "metadata": {**connection, **group, "lagCount": "25", "activationLagCount": "2"},
            **auth,
        },
        # KEDA reads a redis-streams trigger with a group and no lagCount as pendingEntriesCount mode, active
        # above zero: a pod stays up while entries are delivered and unacknowledged, one per CONCURRENCY of them.
        {"type": "redis-streams", "metadata": {**connection, **group, "pendingEntriesCount": "16"}, **auth},
        # The retry set only wakes the stage (ZCARD / a target no set reaches asks for one pod).
        {
            "type": "redis",
            "metadata": {**connection, "listName": "phoenix:{docs}:parser:retry", "listLength": "1000000000"},
            **auth,
        },
    ]


def test_trigger_authentication_reads_the_password_from_the_secret() -> None:
    auth = build_trigger_authentication(OWNER, make_spec(redis=REDIS_WITH_PASSWORD))
    assert auth is not None
    assert (auth["kind"], auth["metadata"]["name"]) == ("TriggerAuthentication", "parser-redis")
    assert auth["metadata"]["ownerReferences"][0]["controller"] is True
    assert auth["spec"] == {"secretTargetRef": [{"parameter": "password", "name": "phoenix-redis", "key": "password"}]}


def test_passwordless_redis_needs_no_trigger_authentication() -> None:
    spec = make_spec()
    assert build_trigger_authentication(OWNER, spec) is None
    triggers = build_scaled_object(OWNER, spec, connection_of("redis://redis:6379"))["spec"]["triggers"]
    assert all("authenticationRef" not in trigger for trigger in triggers)


def test_password_in_url_without_secret_ref_is_a_clear_error_without_the_password() -> None:
    with pytest.raises(AutoscalingConfigError) as caught:
        build_scaled_object(OWNER, make_spec(), connection_of("redis://:hunter2@redis:6379/0"))
    assert "spec.redis.passwordSecretRef" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_namespaces_redis_acl_user_logs_the_workers_and_keda_in() -> None:
    """The user's name and the Secret of its password replace the URL's credentials, for the workers and KEDA (whose
    password comes from the user's Secret even when the URL has one of its own and no passwordSecretRef)."""
    spec = make_spec()
    env = env_of(build_deployment(OWNER, spec, redis_user=USER))
    assert env["REDIS_USERNAME"] == "phoenix.docs"
    assert env["REDIS_PASSWORD"] == {"secretKeyRef": {"name": "phoenix-redis-user", "key": "password"}}
    assert env["REDIS_URL"] == {"secretKeyRef": {"name": "phoenix-redis", "key": "url"}}
    auth = build_trigger_authentication(OWNER, spec, USER)
    assert auth is not None
    assert auth["spec"] == {
        "secretTargetRef": [{"parameter": "password", "name": "phoenix-redis-user", "key": "password"}]
    }
    connection = connection_of("redis://phoenix.docs:their-own@redis:6379/0")
    triggers = build_scaled_object(OWNER, spec, connection, user=USER)["spec"]["triggers"]
    assert {(t["metadata"]["username"], t["authenticationRef"]["name"]) for t in triggers} == {
        ("phoenix.docs", "parser-redis")
    }
    # Without a user, both set empty (the URL's credentials hold), so no envFrom key of the names reaches it.
    plain = env_of(build_deployment(OWNER, spec))
    assert (plain["REDIS_USERNAME"], plain["REDIS_PASSWORD"]) == (None, None)


def test_paused_stage_pauses_keda_at_zero_replicas() -> None:
    spec = make_spec(paused=True, redis=REDIS_WITH_PASSWORD)
    scaled = build_scaled_object(OWNER, spec, connection_of("redis://:pw@redis:6379"))
    assert scaled["metadata"]["annotations"] == {
        "autoscaling.keda.sh/paused": "true",
        "autoscaling.keda.sh/paused-replicas": "0",
    }


def test_tls_and_acl_user_reach_the_trigger() -> None:
    spec = make_spec(redis=REDIS_WITH_PASSWORD)
    triggers = build_scaled_object(OWNER, spec, connection_of("rediss://app:pw@cache:6379/1"))["spec"]["triggers"]
    assert {(t["metadata"]["enableTLS"], t["metadata"]["username"]) for t in triggers} == {("true", "app")}


def test_sentinel_mode_scales_through_the_sentinels() -> None:
    """KEDA's redis-sentinel-streams and redis-sentinel scalers ask the Sentinels (`addresses`) for the primary of
    `sentinelMaster`; the Sentinels' own user is metadata, their password comes through the TriggerAuthentication."""
    spec = make_spec(redis=REDIS_SENTINEL_MTLS, worker={"concurrency": 4})
    url = "rediss://app:pw@sentinel-0.redis:26379,sentinel-1.redis:26379/2"
    connection = redis_connection(RedisSpec.from_url(url, mode="sentinel", sentinel_master="mymaster"))
    triggers = build_scaled_object(OWNER, spec, connection)["spec"]["triggers"]
    assert [t["type"] for t in triggers] == ["redis-sentinel-streams", "redis-sentinel-streams", "redis-sentinel"]
    metadata = {
        "addresses": "sentinel-0.redis:26379,sentinel-1.redis:26379",
        "databaseIndex": "2",
        "enableTLS": "true",
        "username": "app",
        "sentinelMaster": "mymaster",
        "sentinelUsername": "watcher",
    }
    for trigger in triggers:
        assert {key: trigger["metadata"][key] for key in metadata} == metadata
        assert "address" not in trigger["metadata"]
        assert trigger["authenticationRef"] == {"name": "parser-redis"}


def test_trigger_authentication_hands_keda_the_passwords_ca_and_client_certificate() -> None:
    auth = build_trigger_authentication(OWNER, make_spec(redis=REDIS_SENTINEL_MTLS))
    assert auth is not None
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "phoenix-redis", "key": "password"},
        {"parameter": "sentinelPassword", "name": "sentinel-auth", "key": "password"},
        {"parameter": "ca", "name": "redis-ca", "key": "bundle.pem"},
        {"parameter": "cert", "name": "phoenix-client", "key": "tls.crt"},
        {"parameter": "key", "name": "phoenix-client", "key": "tls.key"},
    ]


def test_a_private_ca_alone_needs_a_trigger_authentication() -> None:
    spec = make_spec(redis={**REDIS, "tls": {"caSecretRef": {"name": "redis-ca", "key": "ca.crt"}}})
    auth = build_trigger_authentication(OWNER, spec)
    assert auth is not None and auth["spec"]["secretTargetRef"] == [
        {"parameter": "ca", "name": "redis-ca", "key": "ca.crt"}
    ]
    triggers = build_scaled_object(OWNER, spec, connection_of("rediss://cache:6379"))["spec"]["triggers"]
    assert all(t["authenticationRef"] == {"name": "parser-redis"} for t in triggers)


# --- Redis URL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "address", "db", "tls", "user", "has_password"),
    [
        ("redis://localhost", "localhost:6379", 0, False, None, False),
        ("redis://:secret@redis:6380/2", "redis:6380", 2, False, None, True),
        ("rediss://user%40corp:s@cache.example:6390", "cache.example:6390", 0, True, "user@corp", True),
        ("redis://[::1]:7000?db=5", "[::1]:7000", 5, False, None, False),
    ],
)
def test_redis_connection_facts(
    url: str, address: str, db: int, tls: bool, user: str | None, has_password: bool
) -> None:
    connection = connection_of(url)
    assert (connection.address, connection.database_index, connection.tls) == (address, db, tls)
    assert (connection.username, connection.has_password) == (user, has_password)
    assert "secret" not in repr(connection)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://:Zq7xK9w@redis:6379", "must start with redis:// or rediss://"),
        ("redis://:Zq7xK9w@redis:port/0", "host list is not host[:port]"),
        ("redis://:Zq7xK9w@redis:99999/0", "port is not a number from 1 to 65535"),
        ("redis://:Zq7xK9w@/0", "host list is not host[:port]"),
        ("redis://:Zq7xK9w@redis:6379/zero", "database must be a number"),
        ("redis://:Zq7#xK9w@redis:6379/0", "unescaped '#'"),
        ("redis://:Zq7@xK9w@redis:6379/0", "more than one '@'"),
        ("redis://:Zq7/xK9w@redis:6379/0", "unescaped '/'"),
        ("redis://:Zq7?xK9w@redis:6379/0", "unescaped '?'"),
        ("redis://:Zq7%xK9w@redis:6379/0", "'%' that is no %XX escape"),
        ("redis://:Zq7xK9w@redis:6379/0?ssl_cert_reqs=none", "'ssl_cert_reqs', which Phoenix does not read"),
        ("redis://:Zq7xK9w@a:6379,b:6379/0", "needs REDIS_MODE=sentinel"),
        # No '@': what looks like the host may be the password, so the host is not quoted either.
        ("redis://:Zq7xK9w/0", "host list is not host[:port]"),
    ],
)
def test_bad_redis_urls_are_explained_without_echoing_them(url: str, message: str) -> None:
    with pytest.raises(RedisSpecError) as caught:
        RedisSpec.from_url(url)
    assert message in str(caught.value)
    assert_shows_no_part_of("Zq7xK9w", str(caught.value))


@pytest.mark.parametrize(
    ("url", "seen_from_elsewhere"),
    [
        ("redis://:p%40ss@redis:6379/0", "redis://:***@redis.docs.svc:6379/0"),
        ("rediss://app:pw@cache/2?db=2", "rediss://app:***@cache.docs.svc:6379/2"),
        ("redis://redis.other.svc:6379", "redis://redis.other.svc:6379/0"),
        ("redis://localhost:6379", "redis://localhost:6379/0"),
        ("redis://10.0.0.7:6379", "redis://10.0.0.7:6379/0"),
        ("redis://[::1]:6379", "redis://[::1]:6379/0"),
    ],
)
def test_one_label_redis_hosts_are_services_of_the_stage_namespace(url: str, seen_from_elsewhere: str) -> None:
    seen = in_namespace(RedisSpec.from_url(url), "docs")
    assert seen.redacted == seen_from_elsewhere
    assert seen.password == RedisSpec.from_url(url).password  # credentials kept, for the operator's own client


# --- conditions ----------------------------------------------------------------------------------------

T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2025, 1, 1, 12, 5, 0, 123456, tzinfo=UTC)


def test_condition_is_appended_with_its_transition_time() -> None:
    ready = new_condition(ConditionType.READY, True, "Reconciled", observed_generation=2, now=T0)
    conditions = set_condition([], ready)
    assert conditions == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Reconciled",
            "message": "",
            "lastTransitionTime": "2025-01-01T12:00:00Z",
            "observedGeneration": 2,
        },
    ]


def test_unchanged_status_keeps_the_transition_time_but_takes_the_rest() -> None:
    first = set_condition([], new_condition(ConditionType.READY, True, "Reconciled", now=T0))
    again = set_condition(first, new_condition(ConditionType.READY, True, "Scaled", "3 pods", now=T1))
    assert again[0]["lastTransitionTime"] == "2025-01-01T12:00:00Z"
    assert (again[0]["reason"], again[0]["message"]) == ("Scaled", "3 pods")


def test_changed_status_moves_the_transition_time_in_place() -> None:
    conditions = set_condition([], new_condition(ConditionType.STREAM_READY, True, "GroupExists", now=T0))
    conditions = set_condition(conditions, new_condition(ConditionType.READY, True, "Reconciled", now=T0))
    changed = set_condition(conditions, new_condition(ConditionType.STREAM_READY, None, "RedisUnreachable", now=T1))
    assert [c["type"] for c in changed] == ["StreamReady", "Ready"]
    assert changed[0]["status"] == "Unknown"
    assert changed[0]["lastTransitionTime"] == "2025-01-01T12:05:00Z"
    assert changed[1] == conditions[1]


def test_the_scale_down_window_is_the_hpa_behavior_and_unsetting_it_nulls_it() -> None:
    """KEDA passes advanced.horizontalPodAutoscalerConfig.behavior to the HPA it owns; a stage whose window is
    unset again gets the HPA's default back (the merge patch nulls the behavior, it would stay otherwise)."""
    connection = connection_of("redis://:pw@redis:6379/0")
    windowed = make_spec(redis=REDIS_WITH_PASSWORD, autoscaling={"scaleDownStabilizationSeconds": 30})
    behavior = {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 30}}}
    assert build_scaled_object(OWNER, windowed, connection)["spec"]["advanced"] == {
        "horizontalPodAutoscalerConfig": behavior
    }
    patch = scaled_object_patch(build_scaled_object(OWNER, make_spec(redis=REDIS_WITH_PASSWORD), connection))
    assert patch["spec"]["advanced"]["horizontalPodAutoscalerConfig"] is None
    with pytest.raises(ValidationError, match="scaleDownStabilizationSeconds"):
        make_spec(autoscaling={"scaleDownStabilizationSeconds": 3601})


def test_unpausing_patch_removes_the_pause_annotations() -> None:
    connection = connection_of("redis://:pw@redis:6379/0")
    unpaused = build_scaled_object(OWNER, make_spec(redis=REDIS_WITH_PASSWORD), connection)
    patch = scaled_object_patch(unpaused)
    assert patch["metadata"]["annotations"] == {
        "autoscaling.keda.sh/paused": None,
        "autoscaling.keda.sh/paused-replicas": None,
    }
    nulled = {"scalingModifiers": None, "horizontalPodAutoscalerConfig": None}  # no formula, no HPA behavior
    assert patch["spec"] == {**unpaused["spec"], "advanced": nulled}
    paused = build_scaled_object(OWNER, make_spec(paused=True, redis=REDIS_WITH_PASSWORD), connection)
    assert scaled_object_patch(paused)["metadata"]["annotations"] == {
        "autoscaling.keda.sh/paused": "true",
        "autoscaling.keda.sh/paused-replicas": "0",
    }


def test_named_outputs_reach_the_worker_as_outputs_with_each_next_stages_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    router = replace(OWNER, name="router")
    spec = make_spec(outputs=[{"name": "parser", "stage": "parser"}, {"name": "imaging", "stage": "imaging"}])
    env = env_of(build_deployment(router, spec, named_partitions={"imaging": 4}))
    assert env["OUTPUT_QUEUE"] is None
    monkeypatch.setenv("OUTPUTS", env["OUTPUTS"])  # read from the environment, as the worker reads it
    worker = WorkerSettings(service_name="router", processor="router")
    assert {name: (o.queue, o.partitions) for name, o in worker.outputs.items()} == {
        "parser": (input_stream("parser", OWNER.namespace), 1),
        "imaging": (input_stream("imaging", OWNER.namespace), 4),
    }
    # A stage of one partition forwarding to one of four: that output's forwards are relayed, KEDA counts the outbox.
    assert relayed_partitions(router, spec, 1, {"imaging": 4}) == frozenset({None})
    assert relayed_partitions(router, spec, 1) == frozenset()
    assert env_of(build_deployment(OWNER, make_spec()))["OUTPUTS"] is None
