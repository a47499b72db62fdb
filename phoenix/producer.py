"""Writing records to a stage the way its workers read them, so that producers guess no key name and no partition.

    from phoenix.producer import Producer, Record

    producer = Producer(redis, "router", namespace="team-a")
    await producer.send("doc-17", {"document_url": "s3://..."}, user_id="u-3")
    await producer.send_many(Record(f"doc-{i}", {"i": i}) for i in range(10_000))

`SyncProducer` is the same for a synchronous client. Either takes any client `phoenix.redis_spec.connect` (or
redis-py) builds: one Redis, a Sentinel's master, a Redis Cluster.

- **Where a record goes.** The stage's layout (`keys.StageKeys.layout`, written by the operator when it creates the
  stage, or by its first worker) says how many partitions it has; a record goes to the input of its partition
  (`keys.partition_of`). A stage of one partition goes to the input its owner marker names (`StageKeys.owner`,
  written when its keys are claimed), which its PhoenixStage's `spec.input` may have set. A stage with neither
  has never run: it is taken as one partition under the default names, which is what a stage is unless its
  PhoenixStage says otherwise. `partitions=` overrides the lookup (a producer that knows).
- **Batches.** `send_many` writes in pipelines of `BATCH` entries, grouped by stream: on a cluster, redis-py sends
  each node its own commands.
- **Entry time and deadline.** Each entry carries when it entered the pipeline (`entered_at`: now, unless the
  record says otherwise) and, when the record has one, its `deadline`; the stages carry both on, and a stage
  dead-letters a record past its deadline or its `maxRecordAge` as `Expired`, unprocessed (docs/durability.md).
- **Replicas.** `min_replicas_ack` (the workers' MIN_REPLICAS_ACK) waits until that many replicas have the entries
  (WAIT, on the connection that wrote them, per node on a cluster); fewer in time raises `NotReplicated` with the
  entries' ids: they are written, and only a failover before they replicate could lose them. Sending the same
  records again is safe: a record id the stage committed once is a duplicate.
- **Once per record id.** `Producer.send_once` adds each record only if its record id was not sent so within
  `window_seconds` (an ingest marker per record, `StageKeys.ingest_marker`, set by the same script that adds the
  entry: producer_once.lua): a client retrying a request whose answer it lost adds no second entry, and learns the
  first one's id. The HTTP ingest (`phoenix ingest`) sends so.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Any, TypedDict, Unpack

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from phoenix import keys, lua
from phoenix.errors import PhoenixError
from phoenix.keys import DEFAULT_NAMESPACE, StageKeys
from phoenix.record_format import DEADLINE, ENTERED_AT
from phoenix.replica_wait import run_then_wait

# A batch's entries by stream, each with its position in the batch (ids are returned in input order).
Grouped = dict[str, list[tuple[int, dict[str, str]]]]

# Entries per pipeline: large enough to amortise round trips, small enough to bound a producer's memory.
BATCH = 1000
# One XADD (plain) or one producer_once.lua call (once per record id) from an entry's stream and fields.
Command = Callable[[str, dict[str, str]], tuple[Any, ...]]
ONCE_SCRIPT = lua.source("producer_once.lua", __package__)


@dataclass(frozen=True)
class Record:
    """One record for a stage: `data` is its JSON object (what the stage's processor receives). `deadline`: when
    nobody wants its result any more (an aware datetime, or seconds since the epoch); `entered_at`: when it entered
    the pipeline, the time it is written unless given (a record moved in from elsewhere keeps its own)."""

    record_id: str
    data: Mapping[str, Any] = field(default_factory=dict)
    user_id: str = ""
    traceparent: str | None = None
    deadline: datetime | float | None = None
    entered_at: datetime | float | None = None

    def fields(self) -> dict[str, str]:
        """The stream entry's fields, as the workers parse them (worker_runtime/messages.py)."""
        if not self.record_id:
            raise ValueError("a record needs a record_id")
        entered = time.time() if self.entered_at is None else self.entered_at
        entry = {
            "record_id": self.record_id,
            "user_id": self.user_id,
            "data": json.dumps(self.data),
            ENTERED_AT: _epoch_ms("entered_at", entered),
        }
        if self.deadline is not None:
            entry[DEADLINE] = _epoch_ms("deadline", self.deadline)
        if self.traceparent:
            entry["traceparent"] = self.traceparent
        return entry


def _epoch_ms(name: str, when: datetime | float) -> str:
    """A time as the entry's decimal milliseconds since the epoch; ValueError for a naive datetime (whose zone
    the workers could only guess) or a number that is no time."""
    if isinstance(when, datetime):
        if when.tzinfo is None:
            raise ValueError(f"{name} needs a time zone (a naive datetime means a different time on each host)")
        when = when.timestamp()
    if not (isinstance(when, int | float) and math.isfinite(when) and 0 <= when < 1e10):
        raise ValueError(f"{name} must be seconds since the Unix epoch or an aware datetime, got {when!r}")
    return str(round(when * 1000))


class NotReplicated(PhoenixError):
    """Fewer replicas than asked acknowledged the entries in time; they are written all the same."""

    def __init__(self, entry_ids: Sequence[str], acked: int, wanted: int, timeout_ms: int) -> None:
        self.entry_ids, self.acked, self.wanted = list(entry_ids), acked, wanted
        what = self.entry_ids[0] if len(self.entry_ids) == 1 else f"{len(self.entry_ids)} entries"
        records = "the record" if len(self.entry_ids) == 1 else "the records"
        super().__init__(
            f"{what} acknowledged by {acked} of {wanted} replicas within {timeout_ms} ms: a failover now could lose "
            f"{'it' if len(self.entry_ids) == 1 else 'them'}; sending {records} again is safe (a record id makes a "
            "second entry a duplicate)"
        )


def _batches(records: Iterable[Record]) -> Iterator[list[Record]]:
    it = iter(records)
    while batch := list(islice(it, BATCH)):
        yield batch


class _Target:
    """Where the records of one producer go: a stage (partitioned by its layout) or an explicit stream."""

    def __init__(self, stage: str | None, namespace: str, stream: str | None, partitions: int | None) -> None:
        if (stage is None) == (stream is None):
            raise ValueError("give a stage or a stream, not both")
        self.stage, self.namespace, self.stream, self.partitions = stage, namespace, stream, partitions

    def lookup_keys(self) -> tuple[str, str] | None:
        """The stage's layout (its partitions) and owner marker (the input stream of a stage of one partition, which
        its PhoenixStage may name: spec.input) to read; None when known (given, read before, or a plain stream)."""
        if self.stream is not None or self.partitions is not None:
            return None
        assert self.stage is not None
        keys = StageKeys.for_stage(self.stage, self.namespace)
        return keys.layout, keys.owner

    def learn(self, partitions: bytes | str | None, input_stream: bytes | str | None) -> None:
        """Keep the layout once there is one, or the input of a stage of one partition once its keys are claimed;
        until then each call looks again (the stage may be created meanwhile)."""
        if partitions:
            self.partitions = int(partitions)
        elif input_stream:
            self.partitions, self.stream = 1, _text(input_stream)

    def stream_of(self, record_id: str) -> str:
        if self.stream is not None:
            return self.stream
        assert self.stage is not None
        return keys.forward_stream(self.stage, self.namespace, record_id, self.partitions or 1)

    def ingest_marker(self, stream: str, record_id: str) -> str:
        """The marker saying `record_id` was added to `stream` (the lane of the stage it belongs to)."""
        if self.stage is None:
            raise ValueError("sending once per record id needs a stage (its keys hold the markers), not a stream")
        lane = StageKeys.for_stage(self.stage, self.namespace, partitions=self.partitions or 1).lane_of(record_id)
        return lane.ingest_marker(stream, record_id)

    def grouped(self, batch: list[Record]) -> Grouped:
        by_stream: Grouped = {}
        for position, record in enumerate(batch):
            by_stream.setdefault(self.stream_of(record.record_id), []).append((position, record.fields()))
        return by_stream


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _RecordOptions(TypedDict, total=False):
    """`send`'s keyword arguments: a `Record`'s optional fields (their defaults are the record's)."""

    user_id: str
    traceparent: str | None
    deadline: datetime | float | None


@dataclass(frozen=True)
class _Pipeline:
    """One pipeline of a batch: its XADDs, their records' positions in the batch, and one of its streams (on a
    cluster, the key whose node runs it with its WAIT)."""

    key: str
    positions: list[int]
    commands: list[tuple[Any, ...]]


# What running a pipeline gives: its XADDs' replies and how many replicas its WAIT counted (0 without a WAIT).
PipelineReplies = tuple[Sequence[Any], int]


def _xadd(stream: str, fields: dict[str, str]) -> tuple[Any, ...]:
    return ("XADD", stream, "*", *(part for item in fields.items() for part in item))


def _pipelines(by_stream: Grouped, node_of: Callable[[str], Any] | None, command: Command = _xadd) -> list[_Pipeline]:
    """The pipelines that write a batch's grouped entries, each by `command`: one, or with `node_of` (a cluster
    client's `get_node_from_key`) one for each node, as WAIT counts only the writes of its own connection."""
    groups = list(_by_node(by_stream, node_of).values()) if node_of is not None else [by_stream]
    result = []
    for streams in groups:
        positions, commands = [], []
        for stream, entries in streams.items():
            for position, fields in entries:
                positions.append(position)
                commands.append(command(stream, fields))
        result.append(_Pipeline(next(iter(streams)), positions, commands))
    return result


def _by_node(by_stream: Grouped, node_of: Callable[[str], Any]) -> dict[str, Grouped]:
    """The grouped entries by the cluster node that holds their stream's slot."""
    nodes: dict[str, Grouped] = {}
    for stream, entries in by_stream.items():
        nodes.setdefault(node_of(stream).name, {})[stream] = entries
    return nodes


class _Sender:
    """What the synchronous and asyncio producers share: the target, the batches as pipelines of XADDs, the entry ids
    from their replies and the replica check. A subclass reads the layout and runs a pipeline (`_run`), nothing else."""

    def __init__(
        self,
        client: Any,
        stage: str | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        stream: str | None = None,
        partitions: int | None = None,
        min_replicas_ack: int = 0,
        min_replicas_timeout_ms: int = 1000,
    ) -> None:
        """`client`: of the subclass's kind (asyncio or synchronous; one Redis, a Sentinel's master, a cluster)."""
        self.client = client
        self._target = _Target(stage, namespace, stream, partitions)
        self.min_replicas_ack, self.min_replicas_timeout_ms = min_replicas_ack, min_replicas_timeout_ms

    def _waits_per_node(self) -> bool:
        return bool(self.min_replicas_ack) and isinstance(self.client, RedisCluster | AsyncRedisCluster)

    def _batches(self, records: Iterable[Record], command: Command = _xadd) -> Iterator[tuple[int, list[_Pipeline]]]:
        """Each batch's size and the pipelines that write it (read the layout first: it places the records)."""
        node_of = self.client.get_node_from_key if self._waits_per_node() else None
        for batch in _batches(records):
            yield len(batch), _pipelines(self._target.grouped(batch), node_of, command)

    def _replies(
        self, size: int, runs: Sequence[tuple[_Pipeline, PipelineReplies]], entry_id: Callable[[Any], str] = _text
    ) -> list[Any]:
        """The batch's replies in the records' order; NotReplicated (with the entry ids `entry_id` reads from the
        replies) if a WAIT counted fewer than min_replicas_ack."""
        replies: list[Any] = [""] * size
        for pipeline, (run, _) in runs:
            for position, reply in zip(pipeline.positions, run, strict=False):
                replies[position] = reply
        acked = min(node_acked for _, (_, node_acked) in runs)
        if self.min_replicas_ack and acked < self.min_replicas_ack:
            ids = [entry_id(reply) for reply in replies]
            raise NotReplicated(ids, acked, self.min_replicas_ack, self.min_replicas_timeout_ms)
        return replies

    def _entry_ids(self, size: int, runs: Sequence[tuple[_Pipeline, PipelineReplies]]) -> list[str]:
        """The batch's entry ids in the records' order (NotReplicated as `_replies`)."""
        return [_text(reply) for reply in self._replies(size, runs)]


@dataclass(frozen=True, slots=True)
class Sent:
    """What `send_once` did with one record: its entry's id, and whether it added it now (False: a record of this
    id was added within the window, whose entry id this is)."""

    entry_id: str
    new: bool


def _sent(reply: Sequence[Any]) -> Sent:
    return Sent(_text(reply[1]), bool(reply[0]))


class Producer(_Sender):
    """Sends records to a stage (or an explicit stream) through an asyncio client."""

    client: aioredis.Redis | AsyncRedisCluster
    _once: AsyncScript | None = None

    async def send(
        self, record_id: str, data: Mapping[str, Any] | None = None, **options: Unpack[_RecordOptions]
    ) -> str:
        """Write one record; returns its entry id."""
        (entry_id,) = await self.send_many([Record(record_id, data or {}, **options)])
        return entry_id

    async def send_many(self, records: Iterable[Record]) -> list[str]:
        """Write the records, pipelined; returns their entry ids in order."""
        await self._learn_layout()
        ids: list[str] = []
        for size, batch in self._batches(records):
            ids += self._entry_ids(size, [(pipeline, await self._run(pipeline)) for pipeline in batch])
        return ids

    async def send_once(self, records: Iterable[Record], window_seconds: int) -> list[Sent]:
        """Write each record unless a record of its id was sent so within the last `window_seconds` (to a stage,
        not a stream: the stage's keys hold the markers); what happened to each, in order. A batch that fails on
        the way may be partly written: sending it again adds only the rest."""
        if window_seconds < 1:
            raise ValueError(f"window_seconds must be at least 1, not {window_seconds}")
        if self._once is None:
            self._once = self.client.register_script(ONCE_SCRIPT)
            await self.client.script_load(ONCE_SCRIPT)  # on a cluster, every primary
        sha, target = self._once.sha, self._target
        await self._learn_layout()

        def once(stream: str, fields: dict[str, str]) -> tuple[Any, ...]:
            marker = target.ingest_marker(stream, fields["record_id"])
            return ("EVALSHA", sha, 2, marker, stream, window_seconds, *(p for item in fields.items() for p in item))

        sent: list[Sent] = []
        for size, batch in self._batches(records, once):
            runs = [(pipeline, await self._run(pipeline, self._once)) for pipeline in batch]
            sent += [_sent(reply) for reply in self._replies(size, runs, lambda reply: _sent(reply).entry_id)]
        return sent

    async def _learn_layout(self) -> None:
        if (lookup := self._target.lookup_keys()) is not None:
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(lookup[0], "partitions")
            pipe.hget(lookup[1], "input")
            self._target.learn(*await pipe.execute())

    async def _run(self, pipeline: _Pipeline, script: AsyncScript | None = None) -> PipelineReplies:
        if self.min_replicas_ack:
            return await run_then_wait(
                self.client,
                pipeline.key,
                pipeline.commands,
                self.min_replicas_ack,
                self.min_replicas_timeout_ms,
                script=script,
            )
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            for command in pipeline.commands:
                pipe.execute_command(*command)
            replies = await pipe.execute(raise_on_error=False)
            if script is not None and attempt == 0 and replies and all(isinstance(r, NoScriptError) for r in replies):
                # The server lost it (a restart, a promoted replica): none ran; loaded, they run once more. Loaded
                # once up front rather than checked per pipeline (a SCRIPT EXISTS round trip each).
                await self.client.script_load(script.script)
                continue
            break
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies, 0


class SyncProducer(_Sender):
    """Sends records to a stage (or an explicit stream) through a synchronous client: the same as Producer."""

    client: redis.Redis | RedisCluster

    def send(self, record_id: str, data: Mapping[str, Any] | None = None, **options: Unpack[_RecordOptions]) -> str:
        """Write one record; returns its entry id."""
        (entry_id,) = self.send_many([Record(record_id, data or {}, **options)])
        return entry_id

    def send_many(self, records: Iterable[Record]) -> list[str]:
        """Write the records, pipelined; returns their entry ids in order."""
        if (lookup := self._target.lookup_keys()) is not None:
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(lookup[0], "partitions")
            pipe.hget(lookup[1], "input")
            self._target.learn(*pipe.execute())
        ids: list[str] = []
        for size, batch in self._batches(records):
            ids += self._entry_ids(size, [(pipeline, self._run(pipeline)) for pipeline in batch])
        return ids

    def _run(self, pipeline: _Pipeline) -> PipelineReplies:
        client = self.client
        if self.min_replicas_ack and isinstance(client, RedisCluster):
            # A node's own client: its pipeline runs on one connection, so its WAIT counts these XADDs.
            client = client.get_node_from_key(pipeline.key).redis_connection
        pipe = client.pipeline(transaction=False)
        for command in pipeline.commands:
            pipe.execute_command(*command)
        if not self.min_replicas_ack:
            return pipe.execute(), 0
        pipe.execute_command("WAIT", self.min_replicas_ack, self.min_replicas_timeout_ms)
        *replies, acked = pipe.execute()
        return replies, int(acked)
