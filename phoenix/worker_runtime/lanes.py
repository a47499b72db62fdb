"""The lanes of a stage and where their commits forward (docs/durability.md, "Partitions").

A stage of PARTITIONS=K reads K lanes (phoenix/keys.py: one full set of per-record keys per partition, under the
tag `{<namespace>~<p>}`); a stage of one partition has one lane, its keys of today. Every commit of a lane is one
settle.lua call whose keys are that lane's, so on Redis Cluster it runs in the lane's slot. Its forward goes:
- straight to the output, in the same script, when every record of the lane goes to one stream and that stream is
  in the lane's slot, or the server is no cluster (one Redis runs a script over any keys): the atomic hop;
- otherwise to the lane's outbox, in the same script, and relay.py moves it on: the relayed hop. That is a
  cluster's forward to another slot (a plain stream, a stage of one partition), and on every server a forward to a
  stage of another partition count, whose stream depends on the record (settle.lua writes one output stream).
The choice is made once per lane, at start, never per message. A stage of named outputs (OUTPUTS) makes it per
lane and output: each output's forwards go straight to its stream or, named by the entry (ROUTE_FIELD), through the
lane's one outbox; a record's forwards to several outputs are all written by its one commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from redis.asyncio import Redis
from redis.crc import key_slot

from phoenix.keys import StageKeys, forward_stream, input_stream, stage_of_input
from phoenix.worker_runtime.ownership import LayoutDiffers
from phoenix.worker_runtime.settings import NamedOutput, WorkerSettings


@dataclass(frozen=True, slots=True)
class NamedForward:
    """Where a lane's forwards to the named output `name` are XADDed: its stream, or the lane's outbox when
    `relayed` (the entry then names the output)."""

    name: str
    stream: str
    relayed: bool


@dataclass(frozen=True, slots=True)
class Route:
    """Where a lane's commits write: `keys` are the lane's; `forward` the stream settle.lua XADDs a result to (the
    output itself, or the lane's outbox when relayed), None for a stage without (one) output; `named`, a stage
    of named outputs: each output's forward, in OUTPUTS order. `relayed`: some forward of the lane goes through
    its outbox (the relay empties it)."""

    keys: StageKeys
    forward: str | None
    relayed: bool = False
    named: tuple[NamedForward, ...] = ()


class Output:
    """The stream a result of the stage goes to: OUTPUT_QUEUE, or, when that is a stage's default input
    (`output.stage`), the record's partition of that stage's OUTPUT_PARTITIONS."""

    def __init__(self, queue: str, partitions: int) -> None:
        """`queue`: OUTPUT_QUEUE (empty: no output); `partitions`: OUTPUT_PARTITIONS."""
        self._queue = queue
        found = stage_of_input(self._queue) if self._queue else None
        # Only the unpartitioned name of a stage's input is `output.stage`; a partitioned name is a stream given.
        self._stage = found if found and self._queue == input_stream(found[1], found[0]) else None
        self._partitions = partitions if self._stage else 1

    @classmethod
    def of(cls, settings: WorkerSettings) -> Output:
        return cls(settings.output_queue, settings.output_partitions)

    @classmethod
    def named(cls, outputs: Mapping[str, NamedOutput]) -> dict[str, Output]:
        """Each named output (OUTPUTS), by name."""
        return {name: cls(output.queue, output.partitions) for name, output in outputs.items()}

    @property
    def next_stage(self) -> tuple[str, str] | None:
        """(namespace, stage) when the output is a stage's input (`output.stage`), else None."""
        return self._stage

    @property
    def streams(self) -> tuple[str, ...]:
        """Every stream results may go to: one, or each partition of the next stage."""
        if not self._queue:
            return ()
        if self._stage is None or self._partitions == 1:
            return (self._queue,)
        namespace, stage = self._stage
        return tuple(input_stream(stage, namespace, p) for p in range(self._partitions))

    def target(self, record_id: str) -> str:
        """The stream the result of `record_id` goes to (the relay's question, per entry)."""
        if self._stage is None or self._partitions == 1:
            return self._queue
        namespace, stage = self._stage
        return forward_stream(stage, namespace, record_id, self._partitions)

    def target_of_lane(self, lane: StageKeys) -> str | None:
        """The one stream every result of `lane` goes to, or None when it depends on the record."""
        if self._stage is None or self._partitions == 1:
            return self._queue
        if self._partitions != lane.partitions:
            return None
        # Same count: partition_of(record, K) is the lane's own partition in both stages.
        namespace, stage = self._stage
        return input_stream(stage, namespace, lane.partition)


class OutputLayoutDiffers(LayoutDiffers):
    """The next stage's layout in Redis has `layout` partitions; this worker was started to forward to `wanted`."""

    reason: ClassVar[str] = "OutputPartitionsDiffer"

    def worker_line(self) -> str:
        return f"refusing to start with OUTPUT_PARTITIONS={self.wanted}: {self}"

    def __str__(self) -> str:
        return (
            f"the next stage {self.stage} is laid out in {self.layout} partition(s) in Redis, not the {self.wanted} "
            "this worker would forward to: its results would go to streams no worker of that stage reads; set "
            f"OUTPUT_PARTITIONS={self.layout} (the operator sets it from that layout)"
        )


async def check_output_layout(client: Redis, settings: WorkerSettings) -> None:
    """Raise OutputLayoutDiffers when an output is a stage's input and that stage's layout (written when its keys
    were claimed) has another count than OUTPUT_PARTITIONS (a named output's: its `partitions`). No layout says
    nothing: a stage of one partition, or one not created yet, whose operator-given count (its spec's) is then
    taken as it is."""
    wanted = [(Output.of(settings), settings.output_partitions)]
    wanted += [(Output(o.queue, o.partitions), o.partitions) for o in settings.outputs.values()]
    for output, partitions in wanted:
        if (found := output.next_stage) is None:
            continue
        namespace, stage = found
        laid_out = await client.hget(StageKeys.for_stage(stage, namespace).layout, "partitions")
        if laid_out is not None and int(laid_out) != partitions:
            raise OutputLayoutDiffers(f"{namespace}/{stage}", int(laid_out), partitions)


def _direct(output: Output, lane: StageKeys, slots_matter: bool) -> str | None:
    """The stream the lane's commits write `output`'s forwards to in their own script, or None: through the outbox."""
    target = output.target_of_lane(lane)
    if target is not None and (not slots_matter or key_slot(target.encode()) == key_slot(lane.input.encode())):
        return target
    return None


def routes(
    keys: StageKeys,
    output_partitions: int,
    *,
    slots_matter: bool,
    named: Mapping[str, NamedOutput] | None = None,
) -> tuple[Route, ...]:
    """Each lane's route, from the stage's keys (their `output`: OUTPUT_QUEUE), OUTPUT_PARTITIONS and the named
    outputs (OUTPUTS) alone, so the operator derives the same from a spec (its KEDA triggers count the relayed
    lanes' outboxes); `slots_matter`: the server is a cluster (a script may touch one slot only)."""
    output = Output(keys.output or "", output_partitions)
    outputs = Output.named(named or {})
    found = []
    for lane in keys.lanes:
        forwards = tuple(
            NamedForward(name, direct, False)
            if (direct := _direct(o, lane, slots_matter))
            else NamedForward(name, lane.outbox, True)
            for name, o in outputs.items()
        )
        if not keys.output:
            found.append(Route(lane, None, any(f.relayed for f in forwards), forwards))
        elif (target := _direct(output, lane, slots_matter)) is not None:
            found.append(Route(lane, target))
        else:
            found.append(Route(lane, lane.outbox, relayed=True))
    return tuple(found)


async def cluster_enabled(client: Redis, mode: str) -> bool:
    """Whether the server checks slots: REDIS_MODE=cluster, or a server in cluster mode reached by a plain client
    (one node holding every slot still refuses CROSSSLOT). A single Redis, primary or Sentinel-managed, does not."""
    if mode == "cluster":
        return True
    info = await client.info("cluster")
    return str(info.get("cluster_enabled", 0)) == "1"
