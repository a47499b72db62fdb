"""Writing records to a stage the way its workers read them, so that producers guess no key name and no partition.

    from phoenix.producer import Producer, Record

    producer = Producer(redis, "router", namespace="team-a")
    await producer.send("doc-17", {"document_url": "s3://..."}, user_id="u-3")
    await producer.send_many(Record(f"doc-{i}", {"i": i}) for i in range(10_000))

`SyncProducer` is the same for a synchronous client. Either takes any client `phoenix.redis_spec.connect` (or
redis-py) builds: one Redis, a Sentinel's master, a Redis Cluster.

- **Where a record goes.** The stage's layout (`keys.StageKeys.layout`, written by the operator when it creates the
  stage, or by its first worker) says how many partitions it has; a record goes to the input of its partition
  (`keys.partition_of`). A stage with no layout yet has never run: it is taken as one partition, which is what a
  stage is unless its PhoenixStage says otherwise. `partitions=` overrides the lookup (a producer that knows).
- **Batches.** `send_many` writes in pipelines of `BATCH` entries, grouped by stream: on a cluster, redis-py sends
  each node its own commands.
- **Replicas.** `min_replicas_ack` (the workers' MIN_REPLICAS_ACK) waits until that many replicas have the entries
  (WAIT, on the connection that wrote them, per node on a cluster); fewer in time raises `NotReplicated` with the
  entries' ids: they are written, and only a failover before they replicate could lose them. Sending the same
  records again is safe: a record id the stage committed once is a duplicate.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from phoenix import keys
from phoenix.keys import DEFAULT_NAMESPACE, StageKeys
from phoenix.replica_wait import run_then_wait

# A batch's entries by stream, each with its position in the batch (ids are returned in input order).
Grouped = dict[str, list[tuple[int, dict[str, str]]]]

# Entries per pipeline: large enough to amortise round trips, small enough to bound a producer's memory.
BATCH = 1000


@dataclass(frozen=True)
class Record:
    """One record for a stage: `data` is its JSON object (what the stage's processor receives)."""

    record_id: str
    data: Mapping[str, Any] = field(default_factory=dict)
    user_id: str = ""
    traceparent: str | None = None

    def fields(self) -> dict[str, str]:
        """The stream entry's fields, as the workers parse them (worker_runtime/messages.py)."""
        if not self.record_id:
            raise ValueError("a record needs a record_id")
        entry = {"record_id": self.record_id, "user_id": self.user_id, "data": json.dumps(self.data)}
        if self.traceparent:
            entry["traceparent"] = self.traceparent
        return entry


class NotReplicated(Exception):
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

    def layout_key(self) -> str | None:
        """The key to read the partitions from, None when they are known (given, read before, or a plain stream)."""
        if self.stream is not None or self.partitions is not None:
            return None
        assert self.stage is not None
        return StageKeys.for_stage(self.stage, self.namespace).layout

    def learn(self, stored: bytes | str | None) -> None:
        """Keep the layout once there is one; until then each call looks again (the stage may be created meanwhile)."""
        if stored:
            self.partitions = int(stored)

    def stream_of(self, record_id: str) -> str:
        if self.stream is not None:
            return self.stream
        assert self.stage is not None
        return keys.forward_stream(self.stage, self.namespace, record_id, self.partitions or 1)

    def grouped(self, batch: list[Record]) -> Grouped:
        by_stream: Grouped = {}
        for position, record in enumerate(batch):
            by_stream.setdefault(self.stream_of(record.record_id), []).append((position, record.fields()))
        return by_stream


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _commands(by_stream: Grouped) -> tuple[list[int], list[tuple[Any, ...]]]:
    """The XADDs of the grouped entries and, in the same order, their positions in the batch."""
    order, commands = [], []
    for stream, entries in by_stream.items():
        for position, fields in entries:
            order.append(position)
            commands.append(("XADD", stream, "*", *(part for item in fields.items() for part in item)))
    return order, commands


def _place(order: list[int], replies: Sequence[Any], ids: list[str]) -> None:
    for position, entry_id in zip(order, replies, strict=False):
        ids[position] = _text(entry_id)


class _Sender:
    """What the synchronous and asyncio producers share: the target, the batching, the replica check."""

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

    def _wait_command(self) -> tuple[Any, ...]:
        return ("WAIT", self.min_replicas_ack, self.min_replicas_timeout_ms)

    def _check(self, ids: list[str], acked: list[int]) -> None:
        if self.min_replicas_ack and min(acked, default=self.min_replicas_ack) < self.min_replicas_ack:
            raise NotReplicated(ids, min(acked), self.min_replicas_ack, self.min_replicas_timeout_ms)


class Producer(_Sender):
    """Sends records to a stage (or an explicit stream) through an asyncio client."""

    client: aioredis.Redis | AsyncRedisCluster

    async def send(
        self,
        record_id: str,
        data: Mapping[str, Any] | None = None,
        *,
        user_id: str = "",
        traceparent: str | None = None,
    ) -> str:
        """Write one record; returns its entry id."""
        (entry_id,) = await self.send_many([Record(record_id, data or {}, user_id, traceparent)])
        return entry_id

    async def send_many(self, records: Iterable[Record]) -> list[str]:
        """Write the records, pipelined; returns their entry ids in order."""
        if (layout := self._target.layout_key()) is not None:
            self._target.learn(await self.client.hget(layout, "partitions"))
        ids: list[str] = []
        for batch in _batches(records):
            ids.extend(await self._write(self._target.grouped(batch), len(batch)))
        return ids

    async def _write(self, by_stream: Grouped, n: int) -> list[str]:
        ids, acked = [""] * n, []
        if self.min_replicas_ack:
            # WAIT counts the writes of its own connection: on a cluster, each node's XADDs and their WAIT.
            if isinstance(self.client, AsyncRedisCluster):
                groups = list(_by_node(by_stream, self.client.get_node_from_key).values())
            else:
                groups = [by_stream]
            for streams in groups:
                order, commands = _commands(streams)
                replies, node_acked = await run_then_wait(
                    self.client, next(iter(streams)), commands, self.min_replicas_ack, self.min_replicas_timeout_ms
                )
                _place(order, replies, ids)
                acked.append(node_acked)
        else:
            order, commands = _commands(by_stream)
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            _place(order, await pipe.execute(), ids)
        self._check(ids, acked)
        return ids


class SyncProducer(_Sender):
    """Sends records to a stage (or an explicit stream) through a synchronous client: the same as Producer."""

    client: redis.Redis | RedisCluster

    def send(
        self,
        record_id: str,
        data: Mapping[str, Any] | None = None,
        *,
        user_id: str = "",
        traceparent: str | None = None,
    ) -> str:
        """Write one record; returns its entry id."""
        (entry_id,) = self.send_many([Record(record_id, data or {}, user_id, traceparent)])
        return entry_id

    def send_many(self, records: Iterable[Record]) -> list[str]:
        """Write the records, pipelined; returns their entry ids in order."""
        if (layout := self._target.layout_key()) is not None:
            self._target.learn(self.client.hget(layout, "partitions"))
        ids: list[str] = []
        for batch in _batches(records):
            by_stream = self._target.grouped(batch)
            ids.extend(self._write(by_stream, len(batch)))
        return ids

    def _write(self, by_stream: Grouped, n: int) -> list[str]:
        ids, acked = [""] * n, []
        if self.min_replicas_ack and isinstance(self.client, RedisCluster):
            # A node's own client: its pipeline runs on one connection, so its WAIT counts these XADDs.
            groups = list(_by_node(by_stream, self.client.get_node_from_key).values())
            clients = [self.client.get_node_from_key(next(iter(streams))).redis_connection for streams in groups]
        else:
            groups, clients = [by_stream], [self.client]
        for streams, client in zip(groups, clients, strict=True):
            order, commands = _commands(streams)
            pipe = client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            if self.min_replicas_ack:
                pipe.execute_command(*self._wait_command())
            replies = pipe.execute()
            _place(order, replies, ids)
            if self.min_replicas_ack:
                acked.append(int(replies[-1]))
        self._check(ids, acked)
        return ids


def _by_node(by_stream: Grouped, node_of: Any) -> dict[str, Grouped]:
    """The grouped entries by the cluster node that holds their stream's slot."""
    nodes: dict[str, Grouped] = {}
    for stream, entries in by_stream.items():
        nodes.setdefault(node_of(stream).name, {})[stream] = entries
    return nodes
