"""The Kubernetes children of a stage: its worker Deployment and KEDA objects, created or patched where they
differ from the spec (the objects themselves come from the pure builders).

An existing object of a child's name is touched only when its owner references name this stage's uid: one
created by hand, by another controller or for an earlier stage of the same name is left as it is (NotOwned), and
the stage says so in a condition and a Warning Event."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from phoenix.crds import Condition, ConditionType, PhoenixStage, PhoenixStageSpec
from phoenix.kube_names import POD_KEYS_ANNOTATION, RETIRED_POD_ANNOTATIONS
from phoenix.operator.builders import (
    AutoscalingConfigError,
    Owner,
    RedisUser,
    build_deployment,
    build_pod_disruption_budget,
    build_scaled_object,
    build_trigger_authentication,
    desired_replicas,
    redis_connection,
    scaled_object_patch,
    trigger_authentication_name,
)
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.record import SecretsRead
from phoenix.operator.stage.drift import describe, differences
from phoenix.operator.status.conditions import new_condition
from phoenix.operator.status.readiness import CHILD_NOT_OWNED, KEDA_NOT_INSTALLED
from phoenix.redis_spec import RedisSpec


@dataclass(frozen=True)
class ActionTaken:
    """Something the operator did for a stage (a child created, patched or deleted, a consumer group created, keys
    adopted, a pause): the reason and message of the Normal Event it posts on the stage."""

    reason: str
    message: str


class NotOwned(StageError):
    """An object of a child's name exists and is not this stage's: the operator neither patches nor deletes it."""


def check_owned(owner: Owner, existing: Mapping[str, Any]) -> None:
    """Raise NotOwned unless `existing` names the stage (by uid) among its owner references."""
    meta = existing.get("metadata") or {}
    references = meta.get("ownerReferences") or []
    if any(ref.get("uid") == owner.uid for ref in references):
        return
    kind, name = existing.get("kind", "object"), meta.get("name", "")
    owners = ", ".join(f"{ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})" for ref in references)
    raise NotOwned(
        CHILD_NOT_OWNED,
        f"{kind} {name} exists and is not owned by this PhoenixStage (owners: {owners or 'none'}): the operator "
        f"leaves it untouched; delete or rename it to let the operator manage {kind} {name}",
    )


def deployment_replicas(spec: PhoenixStageSpec, current: int | None, keda_scales: bool) -> int:
    """The operator's replica count for the Deployment.

    Without KEDA the stage runs exactly replicas.min (0 while paused). When KEDA scales it, the operator only
    creates the Deployment at replicas.min and afterwards keeps KEDA's number, clamped into [min, max]: KEDA
    never goes outside that range either, so the two never fight, and unpausing brings a stage back to min.
    """
    if spec.paused or not keda_scales or current is None:
        return desired_replicas(spec)
    return max(spec.replicas.min, min(spec.replicas.max, current))


def _changed(kind: str, name: str, existing: Mapping[str, Any] | None, paths: list[str]) -> ActionTaken:
    if existing is None:
        return ActionTaken(f"{kind}Created", f"created {kind} {name}")
    return ActionTaken(f"{kind}Updated", f"updated {describe(kind, name, paths)}")


async def apply_deployment(
    kube: KubeApi,
    owner: Owner,
    stage: PhoenixStage,
    keda_scales: bool,
    secrets: SecretsRead,
    output_partitions: int = 1,
    user: RedisUser | None = None,
    named_partitions: Mapping[str, int] | None = None,
) -> tuple[dict[str, Any], list[ActionTaken], dict[str, Any]]:
    """Create the worker Deployment or patch the fields that differ from the spec, keeping its restart stamp and
    KEDA's replica count; nothing is written when nothing differs. `secrets`: what the reconcile read of the
    Secrets the pods use (their resourceVersions: when one differs the patch rolls the workers; the envFrom
    Secrets' keys for MASKED_ENV). `output_partitions`: the partitions of the stage `output.stage` names
    (OUTPUT_PARTITIONS), `named_partitions` those of spec.outputs' stages (OUTPUTS). `user`: the namespace's Redis
    ACL user.

    Returns the Deployment, the actions taken and the form later watch events are compared with (KEDA's
    replica count left out of it)."""
    existing = await kube.get_deployment(owner.namespace, owner.name)
    desired = build_deployment(
        owner,
        stage.spec,
        secrets=secrets,
        output_partitions=output_partitions,
        named_partitions=named_partitions,
        redis_user=user,
    )
    current = None if existing is None else existing.get("spec", {}).get("replicas")
    desired["spec"]["replicas"] = deployment_replicas(stage.spec, current, keda_scales)
    watched = copy.deepcopy(desired)
    if keda_scales and not stage.spec.paused:
        del watched["spec"]["replicas"]
    if existing is None:
        return await kube.create_deployment(desired), [_changed("Deployment", owner.name, None, [])], watched
    check_owned(owner, existing)
    _remove_dropped_pod_keys(desired, existing)
    _remove_dropped_pod_keys(watched, existing)
    paths = differences(desired, existing)
    if not paths:
        return existing, [], watched
    # A merge patch keeps what it does not name, such as the restart stamp in the pod template's annotations.
    patched = await kube.patch_deployment(owner.namespace, owner.name, desired)
    return patched, [_changed("Deployment", owner.name, existing, paths)], watched


def _remove_dropped_pod_keys(desired: dict[str, Any], existing: Mapping[str, Any]) -> None:
    """The labels and annotations spec.pod put on the pod template before (recorded on `existing`) and no longer
    asks for become None in `desired`, as do the operator's retired annotations: the merge patch removes them,
    drift wants them absent."""
    recorded = ((existing.get("metadata") or {}).get("annotations") or {}).get(POD_KEYS_ANNOTATION)
    try:
        previous = json.loads(recorded) if recorded else {}
    except ValueError:
        previous = {}  # edited by hand: nothing known to remove
    template = desired["spec"]["template"]["metadata"]
    for key in RETIRED_POD_ANNOTATIONS:
        template["annotations"].setdefault(key, None)
    for section in ("labels", "annotations"):
        for key in previous.get(section, ()) if isinstance(previous, dict) else ():
            template[section].setdefault(key, None)


async def apply_child_object(kube: KubeApi, owner: Owner, wanted: dict[str, Any]) -> list[ActionTaken]:
    """Create the KEDA object or PodDisruptionBudget, or merge-patch it where it differs from `wanted`; NotOwned
    when it is another's."""
    kind, meta = wanted["kind"], wanted["metadata"]
    existing = await kube.get_child_object(kind, meta["namespace"], meta["name"])
    if existing is None:
        await kube.create_child_object(_present(wanted))
        return [_changed(kind, meta["name"], None, [])]
    check_owned(owner, existing)
    paths = differences(wanted, existing)
    if not paths:
        return []
    # The uid in the patch makes the API server refuse it if the object was replaced since it was read.
    await kube.patch_child_object({**wanted, "metadata": {**meta, "uid": existing["metadata"]["uid"]}})
    return [_changed(kind, meta["name"], existing, paths)]


def _present(wanted: Mapping[str, Any]) -> dict[str, Any]:
    """`wanted` without the nulls that only a patch needs (a create must not carry them), nor the maps left empty
    by dropping them (the pause annotations, a formula that is not there)."""
    present = {}
    for key, value in wanted.items():
        if isinstance(value, Mapping):
            value = _present(value) or None
        if value is not None:
            present[key] = value
    return present


async def apply_autoscaling(
    kube: KubeApi,
    owner: Owner,
    stage: PhoenixStage,
    redis: RedisSpec,
    output_partitions: int,
    user: RedisUser | None = None,
    named_partitions: Mapping[str, int] | None = None,
) -> tuple[Condition, list[ActionTaken], dict[str, dict[str, Any]]]:
    """The ScaledObject and TriggerAuthentication, or the reason there are none: the AutoscalingReady condition,
    the actions taken and the wanted form of each KEDA object by kind (none for an object the stage does not own:
    its watch events are not the stage's drift). `redis`: as KEDA reaches it (as `user`, the namespace's Redis ACL
    user, when there is one). `output_partitions`: as for the Deployment (OUTPUT_PARTITIONS), which tells the
    lanes whose outbox KEDA counts; `named_partitions` as for the Deployment (OUTPUTS)."""
    spec, generation = stage.spec, stage.metadata.generation

    def unscaled(reason: str, message: str) -> Condition:
        return new_condition(
            ConditionType.AUTOSCALING_READY,
            False,
            reason,
            f"{message}; the stage runs at replicas.min ({spec.replicas.min})",
            observed_generation=generation,
        )

    keda_missing = "the API server does not serve keda.sh/v1alpha1 ScaledObjects: install KEDA to autoscale"
    if not await kube.keda_installed():
        return unscaled(KEDA_NOT_INSTALLED, keda_missing), [], {}
    actions: list[ActionTaken] = []
    wanted: dict[str, dict[str, Any]] = {}
    try:
        if not spec.autoscaling.enabled:
            actions += await _remove_autoscaling(kube, owner)
            return unscaled("AutoscalingDisabled", "autoscaling.enabled is false"), actions, {}
        try:
            scaled_object = build_scaled_object(
                owner, spec, redis_connection(redis), output_partitions, user, named_partitions
            )
        except AutoscalingConfigError as exc:
            actions += await _remove_autoscaling(kube, owner)
            condition = new_condition(
                ConditionType.AUTOSCALING_READY, False, "InvalidAutoscaling", str(exc), observed_generation=generation
            )
            return condition, actions, {}
        authentication = build_trigger_authentication(owner, spec, user)
        if authentication is None:
            name = trigger_authentication_name(owner.name)
            actions += await _delete_child_object(kube, "TriggerAuthentication", owner, name)
        else:
            actions += await apply_child_object(kube, owner, authentication)
            wanted["TriggerAuthentication"] = authentication
        wanted["ScaledObject"] = scaled_object_patch(scaled_object)
        actions += await apply_child_object(kube, owner, wanted["ScaledObject"])
    except NotOwned as error:
        return unscaled(error.reason, error.message), actions, {}
    except ApiException as exc:
        # KEDA's CRDs went within the cached answer's life: the kinds are no longer served (404). Ask again now,
        # so the stage says KEDA is missing instead of failing on it until the cache expires.
        if exc.status != 404:
            raise
        kube.forget_keda()
        if await kube.keda_installed():
            raise
        return unscaled(KEDA_NOT_INSTALLED, keda_missing), actions, {}
    state = "paused at 0 replicas" if spec.paused else f"{spec.replicas.min}..{spec.replicas.max} replicas"
    condition = new_condition(
        ConditionType.AUTOSCALING_READY,
        True,
        "ScaledObjectReady",
        f"KEDA scales the stage on lag ({state})",
        observed_generation=generation,
    )
    return condition, actions, wanted


async def _delete_child_object(kube: KubeApi, kind: str, owner: Owner, name: str) -> list[ActionTaken]:
    """Delete the stage's own KEDA object or PodDisruptionBudget of that name; NotOwned when it is another's."""
    existing = await kube.get_child_object(kind, owner.namespace, name)
    if existing is None:
        return []
    check_owned(owner, existing)
    if await kube.delete_child_object(kind, owner.namespace, name, existing["metadata"]["uid"]):
        return [ActionTaken(f"{kind}Deleted", f"deleted {kind} {name}")]
    return []


async def _remove_autoscaling(kube: KubeApi, owner: Owner) -> list[ActionTaken]:
    return [
        *await _delete_child_object(kube, "ScaledObject", owner, owner.name),
        *await _delete_child_object(kube, "TriggerAuthentication", owner, trigger_authentication_name(owner.name)),
    ]


async def apply_disruption_budget(
    kube: KubeApi, owner: Owner, stage: PhoenixStage
) -> tuple[list[ActionTaken], dict[str, Any] | None]:
    """The stage's PodDisruptionBudget created, patched or (for a stage of at most one pod) deleted; returns the
    actions taken and its wanted form (None when the stage has none). NotOwned when one of its name is another's."""
    wanted = build_pod_disruption_budget(owner, stage.spec)
    if wanted is None:
        return await _delete_child_object(kube, "PodDisruptionBudget", owner, owner.name), None
    return await apply_child_object(kube, owner, wanted), wanted
