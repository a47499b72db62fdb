"""The local control plane the operator tests run against: API, RBAC, controllers, manifests, kubelet player."""

from __future__ import annotations

import json
import textwrap
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.fixtures.cluster_objects import (
    KEDA_CRDS,
    MANIFESTS,
    OPERATOR_NAMESPACE,
    OPERATOR_SERVICE_ACCOUNT,
    ensure_namespace,
    service_account_kubeconfig,
)
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import eventually
from tests.fixtures.kube_cluster import PlayKubelet
from tests.fixtures.kube_models import metadata_of, name_of, status_of, uid_of

pytestmark = pytest.mark.kube

# A stand-in "container": serves what it was started with on HEALTH_PORT, the way a worker serves /readyz.
ECHO_SERVER = textwrap.dedent(
    """
    import http.server, json, os

    class Echo(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({key: os.environ.get(key) for key in ("HOSTNAME", "GREETING", "SALUTATION", "TOKEN")})
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

    http.server.HTTPServer(("127.0.0.1", int(os.environ["HEALTH_PORT"])), Echo).serve_forever()
    """
)


def _deployment(name: str, replicas: int, container: client.V1Container) -> client.V1Deployment:
    labels = {"app": name}
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[container], termination_grace_period_seconds=5),
            ),
        ),
    )


def test_api_server_serves_the_built_version(kube_cluster: ControlPlane, kube_api: client.ApiClient) -> None:
    version = client.VersionApi(kube_api).get_code()
    built = (kube_cluster.bin_dir / ".versions").read_text().split()[0].removeprefix("kubernetes=")
    assert version.git_version == f"v{built}"
    namespaces = {name_of(ns) for ns in client.CoreV1Api(kube_api).list_namespace().items}
    assert {"default", "kube-system"} <= namespaces
    assert kube_cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"


def test_keda_crds_are_served_and_can_be_removed(kube_cluster: ControlPlane, without_keda: None) -> None:
    resources = kube_cluster.kubectl("api-resources", "--api-group=keda.sh", "-o", "name")
    assert resources.returncode == 0
    assert resources.stdout.split() == []


def test_keda_crds_are_back_after_removal(kube_cluster: ControlPlane) -> None:
    # Holds at session start and again after any test that used `without_keda`.
    resources = kube_cluster.kubectl("api-resources", "--api-group=keda.sh", "-o", "name")
    assert sorted(resources.stdout.split()) == ["scaledobjects.keda.sh", "triggerauthentications.keda.sh"]
    names = [doc["metadata"]["name"] for doc in yaml.safe_load_all(KEDA_CRDS.read_text())]
    assert sorted(names) == sorted(resources.stdout.split())


def test_rbac_denies_a_service_account_without_a_role(
    kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, tmp_path: Path
) -> None:
    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(
        kube_namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
    )
    kubeconfig = service_account_kubeconfig(kube_cluster, kube_namespace, "reader", tmp_path / "reader.kubeconfig")

    with kube_cluster.api_client(kubeconfig) as reader_api:
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(reader_api).list_namespaced_config_map(kube_namespace)
        assert denied.value.status == 403

        rbac = client.RbacAuthorizationV1Api(kube_api)
        rbac.create_namespaced_role(
            kube_namespace,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="read-config-maps"),
                rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])],
            ),
        )
        rbac.create_namespaced_role_binding(
            kube_namespace,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="reader-reads-config-maps"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="read-config-maps"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=kube_namespace)],
            ),
        )

        def can_list() -> bool:
            try:
                client.CoreV1Api(reader_api).list_namespaced_config_map(kube_namespace)
            except client.ApiException as exc:
                assert exc.status == 403
                return False
            return True

        eventually(can_list, "the RoleBinding to take effect")
        with pytest.raises(client.ApiException) as still_denied:
            client.CoreV1Api(reader_api).list_namespaced_secret(kube_namespace)
        assert still_denied.value.status == 403


@pytest.mark.skipif(not list((MANIFESTS / "rbac").glob("*.yaml")), reason="manifests/rbac is not written yet")
def test_operator_kubeconfig_acts_as_the_operator_service_account(
    kube_cluster: ControlPlane, operator_kubeconfig: Path
) -> None:
    whoami = kube_cluster.kubectl(
        "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=operator_kubeconfig
    )
    assert whoami.stdout == f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}"
    # Whatever manifests/rbac grants, it is not cluster-admin.
    assert kube_cluster.kubectl("auth", "can-i", "*", "*", kubeconfig=operator_kubeconfig).stdout.strip() == "no"


def test_a_deployment_gets_a_replicaset_and_pods(kube_api: client.ApiClient, kube_namespace: str) -> None:
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    container = client.V1Container(name="main", image="busybox", command=["sleep", "3600"])
    deployment = apps.create_namespaced_deployment(kube_namespace, _deployment("web", 3, container))

    replica_sets = eventually(lambda: apps.list_namespaced_replica_set(kube_namespace).items, "a ReplicaSet")
    assert [[ref.uid for ref in metadata_of(rs).owner_references or []] for rs in replica_sets] == [
        [uid_of(deployment)]
    ]

    def three_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(kube_namespace).items
        return pods if len(pods) == 3 else []

    pods = eventually(three_pods, "three pods")
    assert {ref.uid for pod in pods for ref in metadata_of(pod).owner_references or []} == {uid_of(replica_sets[0])}


def test_deleting_an_owner_garbage_collects_what_it_owns(kube_api: client.ApiClient, kube_namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    owner = core.create_namespaced_config_map(
        kube_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    reference = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=uid_of(owner))
    core.create_namespaced_config_map(
        kube_namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owned", owner_references=[reference]))
    )
    core.delete_namespaced_config_map("owner", kube_namespace)

    def owned_is_gone() -> bool:
        names = {name_of(cm) for cm in core.list_namespaced_config_map(kube_namespace).items}
        return "owned" not in names

    eventually(owned_is_gone, "the garbage collector to delete the owned ConfigMap")


# Every kustomization under manifests/, e.g. the installation and the samples, as users apply them with -k.
KUSTOMIZATIONS = sorted(path.parent for path in MANIFESTS.rglob("kustomization.yaml"))


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=lambda path: str(path.relative_to(MANIFESTS.parent)))
def test_every_kustomization_passes_a_server_side_dry_run(kube_cluster: ControlPlane, kustomization: Path) -> None:
    rendered = kube_cluster.kubectl("kustomize", str(kustomization))
    assert rendered.returncode == 0, rendered.stderr
    documents = [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert documents
    # A dry run creates nothing, so the namespaces the objects live in (or create) must exist for real.
    for doc in documents:
        if doc["kind"] == "Namespace":
            ensure_namespace(kube_cluster, doc["metadata"]["name"])
        elif "namespace" in doc["metadata"]:
            ensure_namespace(kube_cluster, doc["metadata"]["namespace"])
    result = kube_cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered.stdout)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(documents)


def _echo(port: int) -> dict[str, str | None]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
        return json.loads(response.read())


def test_the_kubelet_player_runs_the_pods_of_a_deployment(
    kube_cluster: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, kubelet_player: PlayKubelet
) -> None:
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    core.create_namespaced_secret(
        kube_namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="echo-secret"), string_data={"token": "s3cr3t"}),
    )
    container = client.V1Container(
        name="echo",
        image="phoenix:dev",
        command=["python", "-c", ECHO_SERVER],
        env=[
            client.V1EnvVar(name="GREETING", value="hello"),
            client.V1EnvVar(name="SALUTATION", value="$(GREETING) world"),
            client.V1EnvVar(
                name="TOKEN",
                value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(name="echo-secret", key="token")
                ),
            ),
            client.V1EnvVar(name="HEALTH_PORT", value="8080"),
        ],
        readiness_probe=client.V1Probe(http_get=client.V1HTTPGetAction(path="/", port=8080)),
    )
    apps.create_namespaced_deployment(kube_namespace, _deployment("echo", 2, container))
    player = kubelet_player(kube_namespace, "echo")

    def rolled_out() -> bool:
        player.sync()
        deployment = apps.read_namespaced_deployment("echo", kube_namespace)
        status = status_of(deployment)
        return (
            status.observed_generation == metadata_of(deployment).generation
            and status.replicas == status.updated_replicas == status.ready_replicas == 2
        )

    eventually(rolled_out, "two ready replicas")
    first_processes = player.processes()
    pod_names = {name_of(pod) for pod in core.list_namespaced_pod(kube_namespace).items}
    assert set(first_processes) == pod_names
    for pod_name, port in player.health_ports().items():
        assert _echo(port) == {
            "HOSTNAME": pod_name,
            "GREETING": "hello",
            "SALUTATION": "hello world",
            "TOKEN": "s3cr3t",
        }
        pod = core.read_namespaced_pod(pod_name, kube_namespace)
        assert status_of(pod).phase == "Running"
        assert [s.ready for s in status_of(pod).container_statuses or []] == [True]

    restart = kube_cluster.kubectl("rollout", "restart", "deployment/echo", "-n", kube_namespace)
    assert restart.returncode == 0, restart.stderr

    def replaced() -> bool:
        return rolled_out() and not set(player.processes()) & set(first_processes)

    eventually(replaced, "the rollout to replace both pods")
    assert all(not process.alive for process in first_processes.values())
    assert set(player.processes()) == {name_of(pod) for pod in core.list_namespaced_pod(kube_namespace).items}
    assert player.start_errors == {}

    current = list(player.processes().values())
    player.stop()
    assert all(not process.alive for process in current)


def test_the_kubelet_player_in_the_background_follows_scaling_and_deletion(
    kube_api: client.ApiClient, kube_namespace: str, kubelet_player: PlayKubelet
) -> None:
    apps = client.AppsV1Api(kube_api)
    container = client.V1Container(
        name="sleeper", image="phoenix:dev", command=["python", "-c", "import time; time.sleep(3600)"]
    )
    apps.create_namespaced_deployment(kube_namespace, _deployment("sleeper", 1, container))
    player = kubelet_player(kube_namespace, "sleeper")
    player.start(interval=0.2)

    def ready_replicas() -> int:
        return status_of(apps.read_namespaced_deployment("sleeper", kube_namespace)).ready_replicas or 0

    eventually(lambda: ready_replicas() == 1, "one ready replica")
    apps.patch_namespaced_deployment_scale("sleeper", kube_namespace, {"spec": {"replicas": 3}})
    eventually(lambda: ready_replicas() == 3 and len(player.processes()) == 3, "three ready replicas")
    processes = list(player.processes().values())
    assert all(process.alive for process in processes)

    apps.delete_namespaced_deployment("sleeper", kube_namespace)
    eventually(lambda: not player.processes(), "the processes of the deleted Deployment's pods to stop")
    assert all(not process.alive for process in processes)


def test_the_kubelet_player_restarts_a_process_that_exits(
    kube_api: client.ApiClient, kube_namespace: str, kubelet_player: PlayKubelet
) -> None:
    core = client.CoreV1Api(kube_api)
    container = client.V1Container(
        name="crasher", image="phoenix:dev", command=["python", "-c", "print('starting'); raise SystemExit(3)"]
    )
    client.AppsV1Api(kube_api).create_namespaced_deployment(kube_namespace, _deployment("crasher", 1, container))
    player = kubelet_player(kube_namespace, "crasher")

    def restarted_and_reported() -> bool:
        player.sync()
        pods = core.list_namespaced_pod(kube_namespace).items
        statuses = (status_of(pods[0]).container_statuses or []) if pods else []
        # Each start appends to the pod's log, so a second run shows as a second line.
        runs = player.log_path(name_of(pods[0])).read_text().split().count("starting") if statuses else 0
        return runs >= 2 and statuses[0].restart_count >= 1

    eventually(restarted_and_reported, "a restarted process and its reported restart count")
