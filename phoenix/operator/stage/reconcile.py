"""Reconcile one PhoenixStage: bring its world in line with its spec (Redis streams and group, then the
Deployment, KEDA objects and PodDisruptionBudget of stage/children.py), then write its status and Events.

reconcile_stage is the one entry, run by the kopf handler on a create, a spec change or the operator's start
(handlers.stage_changed) and by the converger for a drift repair or a KEDA re-check (stage/converge.py); apply_spec is
its Redis-and-children step. Also here: what marks a stage for repair from watch events (child_changed,
next_stage_seen). Its deletion is stage/delete.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import kopf
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix.crds import Condition, ConditionType, PhoenixStage, StreamsStatus
from phoenix.errors import StartRefused
from phoenix.keys import LegacyStageKeys, StageKeys, foreign_scope, input_stream, markable
from phoenix.kube_names import STAGE_LABEL
from phoenix.operator.builders import Owner, resolve_streams
from phoenix.operator.context import OperatorContext
from phoenix.operator.errors import StageError, retry_delay
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.kube.secrets import SecretReads, read_pod_secrets
from phoenix.operator.record import StageRecord
from phoenix.operator.redis.pool import RedisPool
from phoenix.operator.redis.target import read_redis_target
from phoenix.operator.stage.children import ActionTaken, apply_autoscaling, apply_deployment, apply_disruption_budget
from phoenix.operator.stage.drift import describe, differences
from phoenix.operator.status.conditions import new_condition
from phoenix.operator.status.readiness import (
    CHILD_NOT_OWNED,
    deployment_condition,
    replica_status,
    waits_for_keda,
)
from phoenix.redis_spec import RedisSpec, RedisSpecError
from phoenix.worker_runtime.ownership import KeysHeld, NameHeld, claim, release_names
from phoenix.worker_runtime.tracing import operation_span

# Sources of Warnings, each de-duplicated on its own (events.EventRecorder.warning); stage/delete.py has its own.
RECONCILE, OWNERSHIP = "reconcile", "ownership"
# Ready reasons of a stage refused its Redis keys besides the StartRefused ones (worker_runtime/ownership.py: keys
# held by another stage, a layout of another partition count); all retried, so the stage converges by itself.
LEGACY_KEYS = "LegacyKeysFound"


async def reconcile_stage(ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any]) -> None:
    """Reconcile the stage with `body`, then write its status and post its Events: what both the kopf handler
    (handlers.stage_changed) and the converger (stage/converge.py: drift repair, KEDA re-check) run. Raises StageError
    when the stage cannot run; the kopf handler turns it into a kopf retry (kopf_retry), the converger into its
    own wait (errors.retry_delay either way)."""
    attributes = {"k8s.namespace.name": record.namespace, "phoenix.stage": record.name}
    async with record.reconcile_lock:
        generation = record.generation
        # A span per reconcile, its status write and Events included (nothing unless OTEL_* configures tracing); a
        # StageError marks it failed. Log lines inside it carry its trace_id and span_id.
        with operation_span("reconcile", {**attributes, "phoenix.generation": generation or 0}):
            await _apply_and_report(ctx, record, body, generation)


async def _apply_and_report(
    ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any], generation: int | None
) -> None:
    done: list[ActionTaken] = []
    try:
        async with ctx.events.reporting(record, RECONCILE):
            result = await apply_spec(ctx, record, body, done)
    except StageError as error:
        record.error = new_condition(ConditionType.READY, False, error.reason, error.message)
        await ctx.writer.update(record, *failed_status(error, generation))
        for action in done:
            await ctx.events.normal(record, action.reason, action.message)
        raise
    record.error = None
    await retain_clients(ctx)
    await ctx.writer.update(record, *reconciled_status(result, generation))
    for action in result.actions:
        await ctx.events.normal(record, action.reason, action.message)
    if result.autoscaling.reason == CHILD_NOT_OWNED:
        # The stage runs (at replicas.min) but leaves another's KEDA object alone: a Warning once per cause.
        await ctx.events.warning(record, OWNERSHIP, StageError(CHILD_NOT_OWNED, result.autoscaling.message))
    else:
        ctx.events.resolved(record, OWNERSHIP)


def kopf_retry(error: StageError, retry: int) -> kopf.TemporaryError | kopf.PermanentError:
    """kopf's signal for a reconcile that failed at its attempt `retry`: a permanent error waits for a spec
    change, any other is retried after errors.retry_delay."""
    if error.permanent:
        return kopf.PermanentError(str(error))
    return kopf.TemporaryError(str(error), delay=retry_delay(retry))


async def retain_clients(ctx: OperatorContext) -> None:
    """Close the Redis clients no stage uses any more: after a deletion, or a rotation that made a new spec."""
    await ctx.pool.retain({r.redis for r in ctx.registry.records() if r.redis is not None})


@dataclass(frozen=True)
class Reconciled:
    """What a successful reconcile found and did, for status and events."""

    streams: StageKeys
    deployment: dict[str, Any]
    autoscaling: Condition
    actions: list[ActionTaken] = field(default_factory=list)


async def apply_spec(
    ctx: OperatorContext, record: StageRecord, body: Mapping[str, Any], actions: list[ActionTaken]
) -> Reconciled:
    """Make the stage's Redis keys and children what its spec says (status and Events are the caller's).

    Idempotent: safe on create, update, drift and operator restart, and writes only what differs from the
    spec. Raises StageError when the stage cannot run. `actions` gets what was done as it is done, so that a
    failure further on still reports it (keys adopted are adopted only once)."""
    kube, pool = ctx.kube, ctx.pool
    stage = parse_stage(body)
    owner = Owner.from_body(body, ctx.cluster)
    streams = resolve_streams(owner.name, owner.namespace, stage.spec)
    reads = SecretReads(kube, stage.namespace)
    target = await read_redis_target(reads, stage.spec.redis)
    secrets = await read_pod_secrets(reads, stage.spec)
    # Kept before Redis is reached: the Secret check follows these Secrets also while Redis refuses them.
    record.secret_versions = secrets.versions
    # With Redis ACL users, the operator reaches an administered Redis with the admin's credentials.
    administered = None if ctx.users is None else await ctx.users.operator_spec(target)
    redis = administered or target
    existed_before = record.streams is not None or bool(record.status.get("streams"))
    actions += await prepare_streams(pool, redis, streams, owner.uid, existed_before, owner.cluster)
    freed = await _release_unused_names(pool, redis, record.streams, streams, owner.cluster)
    user = None
    if administered is not None and ctx.users is not None:
        await ctx.users.forget_names(owner.namespace, freed)
        namespace_user = await ctx.users.ensure(owner.namespace, streams.claimed_streams)
        user = namespace_user.user
        # Its password's Secret rolls the workers when rotated, like a Secret of spec.redis.
        secrets = replace(secrets, versions=(*secrets.versions, (user.secret, namespace_user.version)))
        record.secret_versions = secrets.versions
    try:
        forward_partitions, next_partitions = await output_partitions(kube, pool.client(redis), stage)
        named_partitions, named_asked = await outputs_partitions(kube, pool.client(redis), stage)
    except (RedisError, OSError) as exc:
        pool.failed(redis, exc)
        raise StageError("RedisUnavailable", f"cannot reach Redis: {redis.masked(str(exc))}") from None
    output = stage.spec.output
    record.next_partitions = named_asked | ({output.stage: next_partitions} if output and output.stage else {})
    record.streams, record.redis = streams, redis
    record.redis_user = None if user is None else user.username
    async with record.deployment_lock:
        connection = target if user is None else target.model_copy(update={"username": user.username})
        autoscaling, keda_actions, watched = await apply_autoscaling(
            kube, owner, stage, connection, forward_partitions, user, named_partitions
        )
        actions += keda_actions
        keda_scales = autoscaling.status == "True"
        deployment, deployment_actions, watched["Deployment"] = await apply_deployment(
            kube, owner, stage, keda_scales, secrets, forward_partitions, user, named_partitions
        )
        actions += deployment_actions
        budget_actions, budget = await apply_disruption_budget(kube, owner, stage)
        if budget is not None:
            watched["PodDisruptionBudget"] = budget
    actions += budget_actions + _transitions(record, stage, autoscaling)
    record.children, record.paused = watched, stage.spec.paused
    return Reconciled(streams, deployment, autoscaling, actions)


def reconciled_status(result: Reconciled, generation: int | None) -> tuple[dict[str, Any], list[Condition]]:
    """The status fields and conditions a successful reconcile writes."""
    streams = new_condition(
        ConditionType.STREAM_READY,
        True,
        "StreamReady",
        f"stream {result.streams.input} with consumer group {result.streams.consumer_group}, DLQ {result.streams.dlq}"
        + (f", in {result.streams.partitions} partitions" if result.streams.partitions > 1 else ""),
        observed_generation=generation,
    )
    fields = {
        "observedGeneration": generation,
        "streams": StreamsStatus.of(result.streams).to_k8s(),
        "replicas": replica_status(result.deployment).to_k8s(),
    }
    return fields, [streams, result.autoscaling, deployment_condition(result.deployment, generation)]


def failed_status(error: StageError, generation: int | None) -> tuple[dict[str, Any], list[Condition]]:
    condition = new_condition(
        ConditionType.STREAM_READY, False, error.reason, error.message, observed_generation=generation
    )
    return {"observedGeneration": generation}, [condition]


def stage_model(body: Mapping[str, Any]) -> PhoenixStage:
    """The stage as the models read it; what they reject is a permanent InvalidSpec error."""
    try:
        return PhoenixStage.from_body(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False))
        raise StageError("InvalidSpec", problems, permanent=True) from None


def parse_stage(body: Mapping[str, Any]) -> PhoenixStage:
    """The validated stage, ready to run; rules the schema cannot express fail as a permanent InvalidSpec error."""
    stage = stage_model(body)
    streams = resolve_streams(stage.metadata.name, stage.namespace, stage.spec)
    check_stream_names(streams)
    for output in stage.spec.outputs or []:
        if input_stream(output.stage, stage.namespace) == streams.input:
            raise StageError(
                "InvalidSpec",
                f"spec.outputs {output.name!r} names stage {output.stage!r}, whose input is this stage's own: the "
                "stage would feed itself (its workers refuse to start so); name another stage",
                permanent=True,
            )
    return stage


def check_stream_names(streams: StageKeys) -> None:
    """Input, output and DLQ must be three different streams, and each the stage's own to name: none inside
    another namespace's keys or Phoenix's (keys.foreign_scope), none that no marker could be put beside. Checked
    here rather than by a CEL rule because the defaults derive from the stage's name and the rule from its
    namespace, which CEL cannot read (phoenix.keys spells those key formats once)."""
    named = (("spec.input", streams.input), ("spec.dlq", streams.dlq), ("spec.output.stream", streams.output))
    for field_name, stream in named:
        if stream is None:
            continue
        if (why := foreign_scope(stream, streams.namespace)) is not None:
            raise StageError(
                "InvalidSpec",
                f"{field_name} {stream!r} is not this stage's to use: {why}; a stage reads and writes its own "
                f"namespace's keys (phoenix:{{{streams.namespace}}}:...) or streams named outside phoenix:",
                permanent=True,
            )
        if not markable(stream):
            raise StageError(
                "InvalidSpec",
                f"{field_name} {stream!r} holds a '}}' outside a hash tag, so no marker can share its Redis Cluster "
                "slot: rename it (or give it a hash tag, `{...}`)",
                permanent=True,
            )
    if streams.output == streams.input:
        raise StageError(
            "InvalidSpec",
            f"output stream {streams.output!r} is the stage's own input stream: the stage would "
            "feed itself (its workers refuse to start so); point spec.output at another stream or stage",
            permanent=True,
        )
    if streams.dlq in (streams.input, streams.output):
        raise StageError(
            "InvalidSpec", f"the DLQ {streams.dlq!r} must differ from the input and output streams", permanent=True
        )


async def redis_of(kube: KubeApi, stage: PhoenixStage) -> RedisSpec:
    """The stage's Redis as the operator and KEDA reach it from their own namespaces, read from its Secrets."""
    return await read_redis_target(SecretReads(kube, stage.namespace), stage.spec.redis)


async def prepare_streams(
    pool: RedisPool, redis: RedisSpec, streams: StageKeys, uid: str, existed_before: bool, cluster: str = ""
) -> list[ActionTaken]:
    """Claim the stage's keys for the PhoenixStage `uid` (of the Kubernetes cluster `cluster`) and create the
    stream, group and DLQ; an ActionTaken for each that had to be created (after a Redis flush: again) and for keys
    adopted from an earlier stage of the name."""
    try:
        client = pool.client(redis)  # builds the TLS context: a CA or certificate that does not load fails here
        await refuse_unmigrated(client, streams)
        created = await claim(client, streams, uid, adopt=True, cluster=cluster)
    except StartRefused as exc:
        raise StageError(exc.reason, _held_message(exc, streams) if isinstance(exc, KeysHeld) else str(exc)) from None
    except RedisSpecError as exc:
        # The CA or client certificate of spec.redis.tls cannot be loaded: the Secret must change.
        raise StageError("InvalidSecret", f"spec.redis.tls: {exc}") from None
    except ResponseError as exc:
        # WRONGTYPE: a key of that name exists and is not a stream; retrying will not change that by itself.
        raise StageError("StreamConflict", redis.masked(str(exc))) from None
    except (RedisError, OSError) as exc:
        pool.failed(redis, exc)
        detail = f"{type(exc).__name__}: {redis.masked(redis.explain(exc))}"
        raise StageError("RedisUnavailable", f"cannot reach Redis at {redis.redacted}: {detail}") from None
    again = " again: it was missing (Redis flushed, or restarted without persistence)" if existed_before else ""
    actions = []
    if created.group:
        message = f"created consumer group {streams.consumer_group} on {streams.input}{again}"
        actions.append(ActionTaken("ConsumerGroupCreated", message))
    if created.dlq:
        actions.append(ActionTaken("DlqCreated", f"created the dead-letter stream {streams.dlq}{again}"))
    if created.adopted_from is not None:
        earlier = (
            "moved there by `phoenix migrate`"
            if not created.adopted_from
            else f"left by an earlier PhoenixStage of this name (uid {created.adopted_from}, deleted with Retain)"
        )
        actions.append(ActionTaken("RedisKeysAdopted", f"adopted the keys of {streams.input}, {earlier}"))
    return actions


async def _release_unused_names(
    pool: RedisPool, redis: RedisSpec, before: StageKeys | None, now: StageKeys, cluster: str
) -> list[str]:
    """The streams claimed by name that the stage's last reconcile used and its spec no longer names are given
    up (their data stays, as a stream the stage no longer reads); those freed for anyone are returned."""
    unused = [] if before is None else [s for s in before.claimed_streams if s not in now.claimed_streams]
    if not unused:
        return []
    try:
        return await release_names(pool.client(redis), now, unused, cluster)
    except (RedisError, OSError) as exc:
        pool.failed(redis, exc)
        raise StageError("RedisUnavailable", f"cannot reach Redis: {redis.masked(str(exc))}") from None


def _held_message(error: KeysHeld, streams: StageKeys) -> str:
    if isinstance(error, NameHeld):
        fix = "name streams of this namespace's own (spec.input, spec.dlq, spec.output.stream)"
        return f"{error}: this stage is refused rather than sharing it; {fix}. It starts once the name is free"
    if error.holder:
        fix = "give this stage streams of its own (spec.input, spec.dlq) or delete that stage"
    else:
        fix = (
            "stop that worker and destroy its group, or give this stage its own spec.input or spec.consumerGroup "
            f"(v1-layout data is moved with `phoenix migrate --namespace {streams.namespace} --service {streams.name}`)"
        )
    return f"{error}: this stage is refused rather than sharing them; {fix}. It starts once the keys are free"


async def refuse_unmigrated(client: Redis, streams: StageKeys) -> None:
    """A stage with no v2 data yet whose v1-layout input holds its consumer group is not started empty beside it
    (its records would wait there unseen, and `phoenix migrate` moves nothing onto existing v2 keys)."""
    if streams.input != input_stream(streams.name, streams.namespace) or await client.exists(streams.owner):
        return
    legacy = LegacyStageKeys(streams.name)
    try:
        groups = await client.xinfo_groups(legacy.input)
    except ResponseError:  # no such stream
        return
    if any(group["name"] == streams.consumer_group for group in groups):
        raise StageError(
            LEGACY_KEYS,
            f"{legacy.input} holds the consumer group {streams.consumer_group} of this stage in the v1 key layout; "
            f"move it with `phoenix migrate --namespace {streams.namespace} --service {streams.name}` (the stage "
            "starts once it is moved, not empty beside it)",
        )


async def output_partitions(kube: KubeApi, client: Redis, stage: PhoenixStage) -> tuple[int, int]:
    """The partitions of the stage `output.stage` names, which its workers forward each record to its partition
    of: its layout in Redis (where its records are, also while a change of its count is refused), else its spec,
    else 1 (no such stage yet). Also the count its spec asks for (1 when it does not exist): when it changes, this
    stage is reconciled again (next_stage_seen). (1, 1) for an output stream."""
    output = stage.spec.output
    if output is None or output.stage is None:
        return 1, 1
    return await _next_partitions(kube, client, stage.namespace, output.stage)


async def outputs_partitions(
    kube: KubeApi, client: Redis, stage: PhoenixStage
) -> tuple[dict[str, int], dict[str, int]]:
    """The partitions of each stage spec.outputs names, by output name, read as output_partitions reads them; and
    the count each of those stages asks for in its spec, by stage name (when it changes, this stage is reconciled
    again: next_stage_seen)."""
    found, asked = {}, {}
    for output in stage.spec.outputs or []:
        found[output.name], asked[output.stage] = await _next_partitions(kube, client, stage.namespace, output.stage)
    return found, asked


async def _next_partitions(kube: KubeApi, client: Redis, namespace: str, next_stage: str) -> tuple[int, int]:
    """The next stage's partitions: its layout in Redis, else its spec's (or 1); and its spec's."""
    body = await kube.get_stage(namespace, next_stage)
    asked = ((body or {}).get("spec") or {}).get("partitions", 1)
    # The API server checked it (an int in 1..MAX_PARTITIONS); anything else is read as the default.
    asked = asked if isinstance(asked, int) and asked >= 1 else 1
    laid_out = await client.hget(StageKeys.for_stage(next_stage, namespace).layout, "partitions")
    return (asked if laid_out is None else int(laid_out)), asked


def _transitions(record: StageRecord, stage: PhoenixStage, autoscaling: Condition) -> list[ActionTaken]:
    """Paused/resumed and KEDA adopted, against what this operator saw before."""
    actions = []
    if record.paused is not None and record.paused != stage.spec.paused:
        actions.append(
            ActionTaken("Paused", "scaled to zero; entries wait in the stream")
            if stage.spec.paused
            else ActionTaken("Resumed", f"back to at least replicas.min ({stage.spec.replicas.min})")
        )
    if waits_for_keda({"status": record.status}) and autoscaling.status == "True":
        message = "KEDA is installed now: the stage is handed over to its ScaledObject"
        actions.append(ActionTaken("KedaAdopted", message))
    return actions


# Watch events that mark a stage for repair: the converger then runs reconcile_stage for it.


def next_stage_seen(ctx: OperatorContext, body: Mapping[str, Any]) -> None:
    """A stage was created or changed: the stages whose output.stage it is, or that name it in spec.outputs,
    reconciled while it asked for another partition count (or did not exist), are marked for repair (the converger
    reconciles them: output_partitions, outputs_partitions)."""
    meta = body["metadata"]
    partitions = (body.get("spec") or {}).get("partitions", 1)
    for record in ctx.registry.records():
        if record.namespace != meta["namespace"]:
            continue
        asked = record.next_partitions.get(meta["name"])
        if asked is not None and asked != partitions:
            record.drift[f"the next stage {meta['name']} asks for {partitions} partition(s)"] = "Deployment"
            ctx.wake.set()


def child_changed(ctx: OperatorContext, event_type: str | None, body: Mapping[str, Any]) -> None:
    """A watch event of a Deployment, ScaledObject or TriggerAuthentication the operator manages: when it was
    deleted or departs from what its stage wants, the stage is marked for repair (the converger does it)."""
    meta = body["metadata"]
    record = ctx.registry.get((meta["namespace"], (meta.get("labels") or {}).get(STAGE_LABEL, "")))
    kind, name = body.get("kind", ""), meta["name"]
    wanted = None if record is None else record.children.get(kind)
    if record is None or wanted is None or wanted["metadata"]["name"] != name:
        return
    if event_type == "DELETED":
        cause = f"{kind} {name} was deleted"
    elif paths := differences(wanted, body):
        cause = describe(kind, name, paths)
    else:
        return
    record.drift[cause] = kind
    ctx.wake.set()
