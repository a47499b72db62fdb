"""Which PhoenixStage holds a stage's keys: the ownership marker `StageKeys.owner`, claimed atomically.

The marker is a hash with these fields:
- `stage`: "<namespace>/<name>" of the PhoenixStage that holds the keys.
- `uid`: that PhoenixStage's metadata.uid; "" when `phoenix migrate` wrote it (the PhoenixStage of that name adopts
  it at its next reconcile).
- `input`, `dlq`, `group`: the input stream, DLQ stream and consumer group as last claimed.
- `created`: which of them the stage created, a comma-separated subset of `input,dlq,group`. deletionPolicy Delete
  removes only those (operator/redis/ops.py). Absent: all three (what `phoenix migrate` moves is the stage's own).
- `cluster`: the Kubernetes cluster of that PhoenixStage (the operator's --cluster-id, by default its kube-system
  namespace's uid), so that two clusters sharing one Redis never adopt each other's keys. Absent (a marker written
  before it was kept, or by an operator that knows none): taken by the first cluster that claims the keys.

The claim (claim_keys.lua: checks and creation in one script, so two claimants cannot both pass the check):
- refused when the marker, or the marker of the stage whose default input or DLQ name the stage's explicit
  spec.input/spec.dlq is (StageKeys.holder_markers), names another stage; or when there is no marker of this stage
  but its consumer group exists on the input already (a worker run by hand, or data moved there by hand);
- refused when the marker names another Kubernetes cluster (the same namespace and name there);
- a marker of this stage with another uid (the earlier PhoenixStage of that name was deleted with Retain, or
  `phoenix migrate` moved the data) is adopted by the operator, and refused to a worker;
- otherwise the group (from id 0, MKSTREAM) and an empty DLQ are created where missing, and the marker written. An
  input stream no group reads yet counts as created by the stage: the entries in it were enqueued for it.

A stream the stage names itself outside every namespace's scope (keys.claimed_by_name: `spec.input: orders`, a
custom DLQ, `output.stream`) is held by a name marker (StageKeys.name_marker, claim_name.lua), in the stream's
own slot: fields `namespace`, `cluster` and `stage:<name>` for each stage of that namespace using it. A stage of
another namespace or cluster is refused the name (NameHeld); the stages of one namespace share it (a pipeline
writes it and reads it). Claimed before the lanes; released by the operator when its stage stops using it or is
deleted with Delete (release_name.lua: the last stage deletes the marker, and the name is free again).

A stage of several partitions has a marker per partition (each lane's keys are in their own slot, so each lane is
claimed by its own script) and, once its lanes are claimed, a stage-wide one (`stage`, `uid` only) beside its audit,
ledgers and layout (`StageKeys.layout`: `partitions`), checked and written first (layout_check.lua; a stage of one
partition has none: no layout means one): a count that differs from the layout is refused (LayoutDiffers), since
the records sit in the lanes of the old count; docs/operations.md says how to change it.

The operator claims before it creates the stage's Deployment, and passes the uid to its pods (STAGE_UID), whose
workers claim again at start and when they re-create a lost group (Redis flushed), never adopting. A worker run by
hand (no STAGE_UID) only checks at start that no marker holds its keys (holder_at_start) and otherwise starts as
it always did, writing no marker: an operator-managed stage of those keys is then refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from redis.asyncio import Redis

from phoenix import lua
from phoenix.errors import StartRefused
from phoenix.keys import StageKeys, input_stream, name_marker
from phoenix.redis_replies import text


@dataclass(frozen=True)
class Claimed:
    """What the claim had to create, and the uid it took the keys over from (None: no adoption)."""

    group: bool
    dlq: bool
    adopted_from: str | None = None


# The refusals below are not frozen: a frozen exception cannot pass through a `contextlib.contextmanager`, which
# writes its __traceback__ (operator/errors.py says the same of StageError).
@dataclass(eq=False)
class KeysHeld(StartRefused):
    """The stage's keys are held by `holder` ("<namespace>/<name>"; "" when a group exists with no marker)."""

    holder: str
    input: str
    reason: ClassVar[str] = "KeysHeldByAnotherStage"

    def worker_line(self) -> str:
        return (
            f"refusing to start: {self}; only that stage's own workers (STAGE_UID) run on them: give this worker keys "
            "of its own (KEY_NAMESPACE, SERVICE_NAME, INPUT_QUEUE)"
        )

    def __str__(self) -> str:
        if not self.holder:
            return (
                f"the consumer group on {self.input} exists and no ownership marker says whose it is (a worker run "
                "by hand, or keys moved by hand)"
            )
        return f"the keys of {self.input} are held by PhoenixStage {self.holder}"


@dataclass(eq=False)
class NameHeld(KeysHeld):
    """The stream `input` that the stage names itself is claimed by the stages of namespace `holder` (with its
    Kubernetes cluster when that is what differs)."""

    def worker_line(self) -> str:
        return f"refusing to start: {self}; give this stage streams of its own (INPUT_QUEUE, DLQ_NAME, OUTPUT_QUEUE)"

    def __str__(self) -> str:
        return f"the stream {self.input} is claimed by the stages of namespace {self.holder}"


@dataclass(eq=False)
class KeyOfAnotherType(StartRefused):
    """A key of the name of one of the stage's streams exists and is not a stream."""

    key: str
    type: str
    reason: ClassVar[str] = "StreamConflict"

    def __str__(self) -> str:
        return f"WRONGTYPE: {self.key} is a {self.type}, not a stream"


# How to change the partitions of a stage with data; the worker and the operator say it with their refusal.
REPARTITION_HOWTO = (
    "its records are in the lanes of the old count: set partitions back to {layout}, or drain the stage (stop its "
    "producers and let its workers empty its input and retry set, handle its DLQ), delete its Redis keys (delete "
    "the PhoenixStage with deletionPolicy Delete, which deletes them and the layout), then create it with "
    "partitions {wanted} (docs/operations.md, Changing partitions)"
)


@dataclass(eq=False)
class LayoutDiffers(StartRefused):
    """The stage's layout in Redis has `layout` partitions; it was asked to run with `wanted`."""

    stage: str
    layout: int
    wanted: int
    reason: ClassVar[str] = "PartitionsChanged"

    def worker_line(self) -> str:
        return f"refusing to start with PARTITIONS={self.wanted}: {self}"

    def __str__(self) -> str:
        howto = REPARTITION_HOWTO.format(layout=self.layout, wanted=self.wanted)
        return (
            f"stage {self.stage} is laid out in {self.layout} partition(s) in Redis, not the {self.wanted} asked for; "
            f"{howto}"
        )


def stage_ref(keys: StageKeys) -> str:
    return f"{keys.namespace}/{keys.name}"


async def check_layout(client: Redis, keys: StageKeys) -> None:
    """Raise LayoutDiffers unless the stage's layout has `keys.partitions`; write it when the stage has none (and
    more than one partition)."""
    script = lua.register(client, "layout_check.lua", __package__)
    reply = await script(keys=[keys.layout, input_stream(keys.name, keys.namespace)], args=[keys.partitions])
    if text(reply[0]) == "differs":
        raise LayoutDiffers(stage_ref(keys), int(text(reply[1])), keys.partitions)


async def laid_out(client: Redis, stages: Sequence[StageKeys]) -> list[StageKeys]:
    """The stages as their layouts in Redis have them: a stage whose layout has K > 1 partitions gets its K lanes
    (its input and DLQ derived); one with no layout or one partition stays as given. One round trip."""
    pipe = client.pipeline(transaction=False)
    for keys in stages:
        pipe.hget(keys.layout, "partitions")
    out = []
    for keys, found in zip(stages, await pipe.execute(), strict=True):
        partitions = 1 if found is None else int(found)
        if partitions != keys.partitions:
            keys = StageKeys.for_stage(
                keys.name,
                keys.namespace,
                group=keys.consumer_group,
                output=keys.output,
                partitions=partitions,
                **({"input": keys.input, "dlq": keys.dlq} if partitions == 1 else {}),
            )
        out.append(keys)
    return out


async def claim(client: Redis, keys: StageKeys, uid: str, *, adopt: bool, cluster: str = "") -> Claimed:
    """Check the stage's layout (LayoutDiffers), claim the streams it names itself (claim_names), then claim each
    lane's keys for the PhoenixStage `uid` of the Kubernetes cluster `cluster` ("": unknown) and create the missing
    ones; raises KeysHeld (NameHeld) or KeyOfAnotherType (nothing written to that lane then). The result: what
    any lane created, and the uid any lane was adopted from."""
    await check_layout(client, keys)
    await claim_names(client, keys, cluster)
    claims = [await _claim_lane(client, lane, uid, adopt, cluster) for lane in keys.lanes]
    if keys.partitions > 1 and uid:
        # The stage-wide marker, beside its audit, ledgers and layout (one slot): deleting them checks it.
        await client.hset(keys.owner, mapping={"stage": stage_ref(keys), "uid": uid})
        if cluster:
            await client.hset(keys.owner, "cluster", cluster)
    return Claimed(
        group=any(c.group for c in claims),
        dlq=any(c.dlq for c in claims),
        adopted_from=next((c.adopted_from for c in claims if c.adopted_from is not None), None),
    )


async def claim_names(client: Redis, keys: StageKeys, cluster: str) -> None:
    """Claim each stream of the stage held by name (StageKeys.claimed_streams) for its namespace, in the stream's
    slot (claim_name.lua); raises NameHeld, having claimed none, when another namespace or cluster holds one."""
    streams = keys.claimed_streams
    if not streams:
        return
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.hmget(name_marker(stream), "namespace", "cluster")
    for stream, (namespace, held_cluster) in zip(streams, await pipe.execute(), strict=True):
        if (refused := _name_holder(keys, cluster, namespace, held_cluster)) is not None:
            raise NameHeld(refused, stream)
    script = lua.register(client, "claim_name.lua", __package__)
    for stream in streams:
        reply = await script(keys=[name_marker(stream)], args=[keys.namespace, cluster, keys.name])
        if text(reply[0]) == "refused":  # claimed meanwhile by another namespace
            raise NameHeld(text(reply[1]), stream)


def _name_holder(keys: StageKeys, cluster: str, namespace: object, held_cluster: object) -> str | None:
    """Who holds a name marker of those fields, when not the stage's namespace of its cluster; else None."""
    if namespace is None:
        return None
    if text(namespace) != keys.namespace:
        return text(namespace)
    if cluster and held_cluster is not None and text(held_cluster) not in ("", cluster):
        return f"{keys.namespace} of Kubernetes cluster {text(held_cluster)}"
    return None


async def release_names(client: Redis, keys: StageKeys, streams: Sequence[str], cluster: str) -> list[str]:
    """The stage stops using the claimed `streams` (its deletion, or a spec naming others): each loses its field in
    the name marker, and the marker goes with its namespace's last stage (release_name.lua), which frees the name:
    those freed are returned. A marker of another namespace or Kubernetes cluster is left alone."""
    script = lua.register(client, "release_name.lua", __package__)
    freed = []
    for stream in streams:
        if int(await script(keys=[name_marker(stream)], args=[keys.namespace, keys.name, cluster])) == 0:
            freed.append(stream)
    return freed


async def name_users(client: Redis, keys: StageKeys, cluster: str) -> dict[str, set[str]]:
    """The stages of the namespace using each claimed stream of the stage, by stream (its own name included while
    it holds it; "?" for a stream another namespace or cluster holds): what its Delete needs to know before removing
    a stream that others use."""
    streams = keys.claimed_streams
    pipe = client.pipeline(transaction=False)
    for stream in streams:
        pipe.hgetall(name_marker(stream))
    users = {}
    for stream, marker in zip(streams, await pipe.execute(), strict=True):
        fields = {text(k): text(v) for k, v in marker.items()}
        foreign = _name_holder(keys, cluster, fields.get("namespace"), fields.get("cluster")) is not None
        users[stream] = {"?"} if foreign else {f.removeprefix("stage:") for f in fields if f.startswith("stage:")}
    return users


async def _claim_lane(client: Redis, keys: StageKeys, uid: str, adopt: bool, cluster: str) -> Claimed:
    script = lua.register(client, "claim_keys.lua", __package__)
    args = [stage_ref(keys), uid, keys.consumer_group, "1" if adopt else "0", cluster]
    reply = await script(keys=[keys.owner, keys.input, keys.dlq, *keys.holder_markers[1:]], args=args)
    outcome = text(reply[0])
    if outcome == "refused":
        raise KeysHeld(text(reply[1]), keys.input)
    if outcome == "wrongtype":
        raise KeyOfAnotherType(text(reply[1]), text(reply[2]))
    _, adopted, earlier, group, dlq = reply
    return Claimed(group=bool(group), dlq=bool(dlq), adopted_from=text(earlier) if adopted else None)


async def holder_at_start(client: Redis, keys: StageKeys) -> str | None:
    """For a worker run by hand: the stage ("<namespace>/<name>", with its uid) holding its keys (of any lane), or
    the namespace whose stages claimed a stream it names, or None when no marker does (or the only one names this
    stage with no uid: moved by `phoenix migrate`, held by no PhoenixStage). One round trip."""
    markers = list({marker: None for lane in keys.lanes for marker in lane.holder_markers})
    pipe = client.pipeline(transaction=False)
    for marker in markers:
        pipe.hmget(marker, "stage", "uid")
    for stream in keys.claimed_streams:
        pipe.hget(name_marker(stream), "namespace")
    replies = await pipe.execute()
    for stage, uid in replies[: len(markers)]:
        stage, uid = (None if stage is None else text(stage)), ("" if uid is None else text(uid))
        if stage is not None and (stage != stage_ref(keys) or uid):
            return f"{stage} (uid {uid})" if uid else stage
    for stream, namespace in zip(keys.claimed_streams, replies[len(markers) :], strict=True):
        if namespace is not None:
            return f"the stages of namespace {text(namespace)} (they claimed {stream})"
    return None
