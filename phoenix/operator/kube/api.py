"""The few Kubernetes API calls the operator makes, as coroutines over the blocking official client.

Calls run in threads (asyncio.to_thread) and return plain dicts read straight from the JSON: deserializing
into the client's model classes costs more than the request itself when a cycle lists hundreds of objects.
Status merge patches, hundreds per refresh cycle, go through StatusPatcher's aiohttp session instead.

Every call has a request timeout: the official client has none by default, so an API server that accepts a
connection and never answers would hold a reconcile (and its stage's lock) forever, and fill the thread pool.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.util.retry import Retry

from phoenix.crds import GROUP, PLURAL, VERSION, SecretKeyRef
from phoenix.crds.pipeline import PIPELINE_PLURAL
from phoenix.kube_names import MANAGED_BY, MANAGED_BY_LABEL, PIPELINE_LABEL
from phoenix.operator.builders.keda import KEDA_API_VERSION
from phoenix.operator.errors import StageError
from phoenix.operator.kube.status_patcher import StatusPatcher

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
KEDA_GROUP, KEDA_VERSION = KEDA_API_VERSION.split("/")
KEDA_PLURALS = {"ScaledObject": "scaledobjects", "TriggerAuthentication": "triggerauthentications"}
# The children reached through the generic object calls (get/create/patch/delete_child_object), by kind.
CHILD_RESOURCES: dict[str, tuple[str, str, str]] = {
    **{kind: (KEDA_GROUP, KEDA_VERSION, plural) for kind, plural in KEDA_PLURALS.items()},
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
}
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# Discovery is cheap but 200 stages reconciling at once would still ask 200 times.
KEDA_CHECK_TTL_SECONDS = 10.0
# The API server refuses longer Event messages.
EVENT_MESSAGE_LIMIT = 1024
# (connect, read) seconds per call: a list of every managed Deployment of a big cluster stays well inside.
REQUEST_TIMEOUT_SECONDS = (10.0, 30.0)

Json = dict[str, Any]
Timeout = float | tuple[float, float]


def _annotation_path(key: str) -> str:
    """The JSON pointer of an annotation (RFC 6901 escapes `~` and `/`)."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


def load_client(threads: int) -> client.ApiClient:
    """In a pod: the ServiceAccount; elsewhere: $KUBECONFIG or ~/.kube/config."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    # One pooled connection per API thread: a smaller pool makes busy threads open (TLS-handshake) new ones.
    configuration.connection_pool_maxsize = threads
    # A refused connection is tried again; a request that timed out is not (urllib3 would retry a read three
    # times, making every timeout four): the caller's own retry and backoff take over.
    configuration.retries = Retry(total=2, read=0)
    return client.ApiClient(configuration)


async def _json(timeout: Timeout, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Json:
    response = await asyncio.to_thread(call, *args, _preload_content=False, _request_timeout=timeout, **kwargs)
    return json.loads(response.data) if response.data else {}


async def _json_or_none(timeout: Timeout, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Json | None:
    try:
        return await _json(timeout, call, *args, **kwargs)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def secret_key(secret: Mapping[str, Any], key: str) -> bytes:
    """One key of a Secret read by KubeApi.read_secret, decoded; a missing key is a StageError naming it."""
    data = secret.get("data") or {}
    if key not in data:
        raise StageError("SecretKeyNotFound", f"Secret {secret['metadata']['name']!r} has no key {key!r}")
    return base64.b64decode(data[key])


class KubeApi:
    """The operator's Kubernetes calls, each with a timeout, off the event loop (the official client blocks)."""

    def __init__(self, api_client: client.ApiClient, request_timeout: Timeout = REQUEST_TIMEOUT_SECONDS) -> None:
        self._timeout = request_timeout
        self._status = StatusPatcher(api_client.configuration)
        self._core = client.CoreV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._keda_checked_at = float("-inf")
        self._keda_installed = False

    async def aclose(self) -> None:
        await self._status.aclose()

    async def _patch_unless(
        self,
        statuses: tuple[int, ...],
        call: Callable[..., Any],
        namespace: str,
        name: str,
        body: Any,
        content: str,
        plural: str = PLURAL,
    ) -> bool:
        """Patch a PhoenixStage (or another of phoenix.io's kinds by its `plural`); False instead of an error when
        the API server answers one of `statuses`."""
        try:
            await _json(self._timeout, call, GROUP, VERSION, namespace, plural, name, body, _content_type=content)
        except ApiException as exc:
            if exc.status in statuses:
                return False
            raise
        return True

    async def read_secret(self, namespace: str, name: str) -> Json:
        """The Secret; a missing one is a StageError naming it. Its values stay base64 (`data`) until asked for."""
        secret = await self.get_secret(namespace, name)
        if secret is None:
            raise StageError("SecretNotFound", f"Secret {name!r} does not exist in namespace {namespace!r}")
        return secret

    async def get_secret(self, namespace: str, name: str) -> Json | None:
        return await _json_or_none(self._timeout, self._core.read_namespaced_secret, name, namespace)

    # The Secret writes below are the Redis ACL users' only (--redis-acl-admin-secret): RBAC grants them then only.

    async def create_secret(self, body: Json) -> Json:
        return await _json(self._timeout, self._core.create_namespaced_secret, body["metadata"]["namespace"], body)

    async def replace_secret(self, body: Json) -> Json:
        """Update the Secret as a whole; its metadata.resourceVersion makes the API server refuse (409) a write over
        a change made since it was read."""
        meta = body["metadata"]
        return await _json(self._timeout, self._core.replace_namespaced_secret, meta["name"], meta["namespace"], body)

    async def delete_secret(self, namespace: str, name: str) -> bool:
        """True when it existed and was deleted."""
        try:
            await _json(self._timeout, self._core.delete_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
        return True

    async def namespace_uid(self, name: str) -> str:
        """The uid of the namespace `name` (the cluster's identity, read from kube-system's)."""
        return str((await _json(self._timeout, self._core.read_namespace, name))["metadata"]["uid"])

    async def secret_value(self, namespace: str, ref: SecretKeyRef) -> str:
        """The decoded value of one Secret key; a missing Secret or key is a StageError naming it (not its value)."""
        return secret_key(await self.read_secret(namespace, ref.name), ref.key).decode()

    # -- Deployments -----------------------------------------------------------------------------------------

    async def get_deployment(self, namespace: str, name: str) -> Json | None:
        return await _json_or_none(self._timeout, self._apps.read_namespaced_deployment, name, namespace)

    async def create_deployment(self, body: Json) -> Json:
        return await _json(self._timeout, self._apps.create_namespaced_deployment, body["metadata"]["namespace"], body)

    async def patch_deployment(self, namespace: str, name: str, patch: Json) -> Json:
        # A JSON merge patch replaces lists whole, so an env var dropped from the spec disappears from the pods;
        # a strategic merge would keep it.
        return await _json(
            self._timeout, self._apps.patch_namespaced_deployment, name, namespace, patch, _content_type=MERGE_PATCH
        )

    async def managed_deployments(self, namespaces: tuple[str, ...]) -> list[Json]:
        """Every worker Deployment the operator manages: one list call per watched namespace (or the cluster)."""
        if not namespaces:
            found = await _json(
                self._timeout, self._apps.list_deployment_for_all_namespaces, label_selector=MANAGED_SELECTOR
            )
            return found.get("items", [])
        lists = await asyncio.gather(
            *(
                _json(self._timeout, self._apps.list_namespaced_deployment, ns, label_selector=MANAGED_SELECTOR)
                for ns in namespaces
            )
        )
        return [item for found in lists for item in found.get("items", [])]

    # -- KEDA ------------------------------------------------------------------------------------------------

    async def keda_installed(self) -> bool:
        """Whether the API serves KEDA's ScaledObject and TriggerAuthentication (API discovery, cached briefly)."""
        if time.monotonic() - self._keda_checked_at < KEDA_CHECK_TTL_SECONDS:
            return self._keda_installed
        found = await _json_or_none(self._timeout, self._custom.get_api_resources, KEDA_GROUP, KEDA_VERSION)
        served = {resource["name"] for resource in (found or {}).get("resources", [])}
        self._keda_installed = set(KEDA_PLURALS.values()) <= served
        self._keda_checked_at = time.monotonic()
        return self._keda_installed

    def forget_keda(self) -> None:
        """Drop the cached answer of keda_installed: the next call asks the API server."""
        self._keda_checked_at = float("-inf")

    # -- KEDA objects and PodDisruptionBudgets: the same calls for any kind of CHILD_RESOURCES ------------------

    def _child_args(self, kind: str, namespace: str) -> tuple[str, str, str, str]:
        group, version, plural = CHILD_RESOURCES[kind]
        return (group, version, namespace, plural)

    async def get_child_object(self, kind: str, namespace: str, name: str) -> Json | None:
        return await _json_or_none(
            self._timeout, self._custom.get_namespaced_custom_object, *self._child_args(kind, namespace), name
        )

    async def create_child_object(self, body: Json) -> Json:
        args = self._child_args(body["kind"], body["metadata"]["namespace"])
        return await _json(self._timeout, self._custom.create_namespaced_custom_object, *args, body)

    async def patch_child_object(self, patch: Json) -> Json:
        """Merge-patch the object `patch` names (kind, metadata.namespace and metadata.name)."""
        meta = patch["metadata"]
        return await _json(
            self._timeout,
            self._custom.patch_namespaced_custom_object,
            *self._child_args(patch["kind"], meta["namespace"]),
            meta["name"],
            patch,
            _content_type=MERGE_PATCH,
        )

    async def delete_child_object(self, kind: str, namespace: str, name: str, uid: str) -> bool:
        """True when it existed and was deleted; only the object of that uid (the one checked), never a newer one
        created under the same name meanwhile (the API server answers 409 then)."""
        preconditions = {"preconditions": {"uid": uid}}
        try:
            await _json(
                self._timeout,
                self._custom.delete_namespaced_custom_object,
                *self._child_args(kind, namespace),
                name,
                body=preconditions,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            return False
        return True

    # -- Events ----------------------------------------------------------------------------------------------

    async def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `involved` (an object reference: apiVersion, kind, namespace, name, uid)."""
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        namespace = involved["namespace"]
        body = {
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "type": type_,
            "reason": reason,
            "message": message[:EVENT_MESSAGE_LIMIT],
            "source": {"component": MANAGED_BY},
            "reportingComponent": MANAGED_BY,
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._status.create_event(namespace, body)

    # -- PhoenixStages ---------------------------------------------------------------------------------------

    async def get_stage(self, namespace: str, name: str) -> Json | None:
        """The PhoenixStage; None when there is none of that name."""
        return await _json_or_none(
            self._timeout, self._custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
        )

    async def stage_names(self, namespace: str) -> list[str]:
        """The names of the PhoenixStages of `namespace`, asked of the API server (not of the operator's memory)."""
        found = await _json(
            self._timeout, self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL
        )
        return [item["metadata"]["name"] for item in found.get("items", [])]

    async def patch_stage_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """Merge-patch status (None deletes a field); False when the stage no longer exists."""
        return await self._status.patch(namespace, name, {"status": dict(status)}, MERGE_PATCH)

    async def add_status_field_if_annotated(
        self, namespace: str, name: str, annotation: str, expected: str, field: str, value: Any, has_status: bool
    ) -> bool:
        """Set status.<field> only while annotation `annotation` holds `expected`, checked by the API server in
        the same write (a JSON patch `test`); False when it no longer does or the stage is gone."""
        ops: list[Json] = [{"op": "test", "path": _annotation_path(annotation), "value": expected}]
        if not has_status:
            ops.append({"op": "add", "path": "/status", "value": {}})
        ops.append({"op": "add", "path": f"/status/{field}", "value": value})
        # 422: the test failed (the value changed or is gone); 404: the stage is gone.
        return await self._patch_unless(
            (404, 422), self._custom.patch_namespaced_custom_object_status, namespace, name, ops, JSON_PATCH
        )

    async def remove_stage_annotation(
        self, namespace: str, name: str, key: str, expected: str, plural: str = PLURAL
    ) -> bool:
        """Remove annotation `key` only while it still holds `expected`: a newer request is left for later. Of a
        PhoenixPipeline with its `plural`."""
        path = _annotation_path(key)
        ops = [{"op": "test", "path": path, "value": expected}, {"op": "remove", "path": path}]
        return await self._patch_unless(
            (404, 422), self._custom.patch_namespaced_custom_object, namespace, name, ops, JSON_PATCH, plural
        )

    # -- The PhoenixStages of a PhoenixPipeline -------------------------------------------------------------------

    async def pipeline_stages(self, namespace: str, pipeline: str) -> list[Json]:
        """The PhoenixStages labelled as `pipeline`'s (their owner references say whether it owns them)."""
        found = await _json(
            self._timeout,
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            label_selector=f"{PIPELINE_LABEL}={pipeline}",
        )
        return list(found.get("items", []))

    async def create_stage(self, body: Json) -> Json | None:
        """The PhoenixStage created; None when one of its name exists already (409)."""
        namespace = body["metadata"]["namespace"]
        try:
            return await _json(
                self._timeout, self._custom.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, body
            )
        except ApiException as exc:
            if exc.status == 409:
                return None
            raise

    async def patch_stage(self, namespace: str, name: str, ops: list[Json]) -> Json | None:
        """Apply a JSON patch to a PhoenixStage; None when it is gone or a `test` of the patch failed."""
        try:
            return await _json(
                self._timeout,
                self._custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                ops,
                _content_type=JSON_PATCH,
            )
        except ApiException as exc:
            if exc.status in (404, 422):
                return None
            raise

    async def annotate_stage(self, namespace: str, name: str, key: str, value: str) -> bool:
        """Set one annotation of a PhoenixStage (a merge patch: the others stay); False when it is gone."""
        patch = {"metadata": {"annotations": {key: value}}}
        return await self._patch_unless(
            (404,), self._custom.patch_namespaced_custom_object, namespace, name, patch, MERGE_PATCH
        )

    async def delete_stage(self, namespace: str, name: str, uid: str) -> bool:
        """Delete the PhoenixStage of that uid only (never a newer one of its name); True when it was there."""
        try:
            await _json(
                self._timeout,
                self._custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"preconditions": {"uid": uid}},
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def patch_pipeline_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """Merge-patch a PhoenixPipeline's status (None deletes a field); False when it no longer exists."""
        return await self._status.patch(namespace, name, {"status": dict(status)}, MERGE_PATCH, PIPELINE_PLURAL)
