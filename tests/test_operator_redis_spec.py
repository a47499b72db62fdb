"""spec.redis on the real API server: what the builders make of a Sentinel + mTLS stage is accepted as it is
(KEDA's CRDs, a worker pod under the restricted Pod Security level), and Secrets that do not fit the spec become
the stage's condition and a Warning Event, without any of their values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from phoenix.crds import PhoenixStageSpec
from phoenix.operator.builders import Owner, build_deployment, build_scaled_object, build_trigger_authentication
from phoenix.operator.builders.redis_address import redis_connection
from phoenix.operator.record import SecretsRead
from phoenix.redis_spec import RedisSpec
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.operator_process import (
    existing_stage,
    kubectl_apply,
    ready_reason,
    running_operator,
    stage_condition,
    stage_events,
)

pytestmark = pytest.mark.kube

SENTINEL_MTLS = {
    "urlSecretRef": {"name": "phoenix-redis", "key": "url"},
    "passwordSecretRef": {"name": "phoenix-redis", "key": "password"},
    "mode": "sentinel",
    "sentinel": {"masterName": "mymaster", "passwordSecretRef": {"name": "sentinel-auth", "key": "password"}},
    "tls": {"caSecretRef": {"name": "redis-ca", "key": "ca.crt"}, "clientCertSecretRef": {"name": "phoenix-client"}},
}


def _dry_run(plane: ControlPlane, namespace: str, document: dict[str, Any]) -> None:
    result = plane.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(document))
    assert result.returncode == 0, f"{document['kind']}: {result.stderr}"


def test_the_objects_of_a_sentinel_mtls_stage_are_admitted(
    kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str
) -> None:
    """The Deployment, a pod of its template in a namespace enforcing the restricted Pod Security level (the
    read-only projected Secret volume included), the ScaledObject and the TriggerAuthentication, as KEDA's CRDs
    validate them."""
    ns = kube_namespace
    client.CoreV1Api(kube_api).patch_namespace(
        ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    spec = PhoenixStageSpec.model_validate({"processor": "parser", "image": "img:1", "redis": SENTINEL_MTLS})
    owner = Owner("phoenix.io/v1alpha1", "PhoenixStage", "parser", ns, "0b5c1f4e-0000-4000-8000-000000000001")
    deployment = build_deployment(owner, spec, secrets=SecretsRead(versions=(("phoenix-redis", "1"),)))
    redis = RedisSpec.from_url(
        "rediss://:pw@sentinel-0.sentinel:26379,sentinel-1.sentinel:26379/0", mode="sentinel", sentinel_master="m"
    )
    authentication = build_trigger_authentication(owner, spec)
    assert authentication is not None
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "parser-pod", "labels": deployment["spec"]["template"]["metadata"]["labels"]},
        "spec": deployment["spec"]["template"]["spec"],
    }
    for document in (deployment, pod, build_scaled_object(owner, spec, redis_connection(redis)), authentication):
        # Owner references to a stage that does not exist are fine for a dry run; the server checks the rest.
        _dry_run(kube_cluster, ns, document)


def test_the_scaled_object_of_a_relayed_partitioned_cluster_stage_is_admitted(
    kube_cluster: ControlPlane, kube_namespace: str
) -> None:
    """A cluster stage of 3 partitions forwarding to a plain stream (another slot: every lane relays): its lag,
    pending, retry and outbox triggers per partition, the formula summing them and the HPA's scale-down window, as
    KEDA's CRDs validate them."""
    spec = PhoenixStageSpec.model_validate(
        {
            "processor": "parser",
            "image": "img:1",
            "partitions": 3,
            "output": {"stream": "results"},
            "autoscaling": {"scaleDownStabilizationSeconds": 30},
            "redis": {**SENTINEL_MTLS, "mode": "cluster", "sentinel": None},
        }
    )
    owner = Owner(
        "phoenix.io/v1alpha1", "PhoenixStage", "parser", kube_namespace, "0b5c1f4e-0000-4000-8000-000000000002"
    )
    redis = RedisSpec.from_url("rediss://:pw@valkey-0.valkey:6379,valkey-1.valkey:6379/0", mode="cluster")
    scaled_object = build_scaled_object(owner, spec, redis_connection(redis))
    assert [t["name"] for t in scaled_object["spec"]["triggers"]][3::4] == ["outbox0", "outbox1", "outbox2"]
    assert set(scaled_object["spec"]["advanced"]) == {"scalingModifiers", "horizontalPodAutoscalerConfig"}
    _dry_run(kube_cluster, kube_namespace, scaled_object)


@pytest.fixture(scope="module")
def operator(kube_cluster: ControlPlane, operator_kubeconfig: Path) -> Any:
    with running_operator(kube_cluster, operator_kubeconfig, log_name="operator-redis-spec") as (process, liveness):
        yield liveness
        assert process.alive, process.failure("died during the tests")


def _secret(namespace: str, name: str, data: dict[str, str], type_: str = "Opaque") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": type_,
        "stringData": data,
    }


def _stage(namespace: str, name: str, redis: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "phoenix.io/v1alpha1",
        "kind": "PhoenixStage",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"processor": "parser", "image": "img:1", "redis": redis, "autoscaling": {"enabled": False}},
    }


@pytest.mark.timeout(210)
def test_secrets_that_do_not_fit_spec_redis_become_conditions_and_events(
    operator: str, kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str
) -> None:
    ns = kube_namespace
    password = "s3cret-never-shown"
    url_ref = {"urlSecretRef": {"name": "plain", "key": "url"}}
    kubectl_apply(
        kube_cluster,
        [
            _secret(ns, "plain", {"url": f"redis://:{password}@127.0.0.1:1/0"}),
            _secret(ns, "tls-url", {"url": f"rediss://:{password}@127.0.0.1:1/0"}),
            _secret(ns, "not-tls", {"tls.crt": "x", "tls.key": password}),
            _secret(ns, "bad-ca", {"ca.crt": "-----BEGIN CERTIFICATE-----\nnot a certificate\n"}),
            # TLS asked for, but the URL is redis://: the workers would refuse to start, so the stage says why.
            _stage(ns, "plain-url", {**url_ref, "tls": {"caSecretRef": {"name": "plain", "key": "url"}}}),
            # A client certificate must be a kubernetes.io/tls Secret (tls.crt and tls.key).
            _stage(
                ns,
                "opaque-cert",
                {
                    "urlSecretRef": {"name": "tls-url", "key": "url"},
                    "tls": {"clientCertSecretRef": {"name": "not-tls"}},
                },
            ),
            # A CA that does not load: the operator cannot build its client, and neither could the workers.
            _stage(
                ns,
                "bad-ca",
                {
                    "urlSecretRef": {"name": "tls-url", "key": "url"},
                    "tls": {"caSecretRef": {"name": "bad-ca", "key": "ca.crt"}},
                },
            ),
            # A CA Secret that does not exist (yet): the stage waits for it like for a missing URL Secret.
            _stage(
                ns,
                "missing-ca",
                {
                    "urlSecretRef": {"name": "tls-url", "key": "url"},
                    "tls": {"caSecretRef": {"name": "no", "key": "ca"}},
                },
            ),
        ],
    )

    def reason(name: str) -> str | None:
        return ready_reason(kube_cluster, ns, name)

    expected = {
        "plain-url": "InvalidRedisUrl",
        "opaque-cert": "InvalidSecret",
        "bad-ca": "InvalidSecret",
        "missing-ca": "SecretNotFound",
    }
    for name, wanted in expected.items():
        eventually(lambda name=name, wanted=wanted: reason(name) == wanted, f"{name}: Ready=False/{wanted}")
        eventually(
            lambda name=name, wanted=wanted: any(
                e.type == "Warning" and e.reason == wanted for e in stage_events(kube_api, ns, name)
            ),
            f"a Warning Event {wanted} on {name}",
        )
    message = stage_condition(kube_cluster, ns, "opaque-cert")["message"]
    assert "kubernetes.io/tls" in message and "kubectl create secret tls" in message
    shown = json.dumps([existing_stage(kube_cluster, ns, name)["status"] for name in expected]) + " ".join(
        e.message or "" for name in expected for e in stage_events(kube_api, ns, name)
    )
    assert password not in shown
