"""What `phoenix ui` reads: the PhoenixStages with their status from the API server, and from each stage's Redis its
acknowledgement rate and its dead letters, with the caller's own Kubernetes rights (as `kubectl phoenix inspect`).

Each stage's Redis is the one its Secret names (read through the API, kept in memory only), or its host:port
replaced by --redis-host (a port-forward). A stage's target is read again when the stage changes or a read of its
Redis fails (a rotated password).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from phoenix.cli.kubectl import PluginError, Stages, stage_target
from phoenix.cli.stage import redis_client
from phoenix.cli.ui.pipelines import pipelines_of
from phoenix.keys import StageKeys
from phoenix.record_format import FAILURE_FIELDS, RETRY_STATE_FIELDS
from phoenix.redis_spec import RedisSpec
from phoenix.tools import dlq
from phoenix.tools.queue_stats import RateMeter, acknowledged, collect
from phoenix.worker_runtime.ownership import laid_out

Json = dict[str, Any]
# What a dead letter shows without --show-data: its record id, why it failed, when, how often. The record's own
# fields (data, user_id, whatever else the producer put in the entry) only with --show-data.
DLQ_SHOWN_FIELDS = frozenset({"record_id", "partition", *FAILURE_FIELDS, *RETRY_STATE_FIELDS})
DLQ_PAGE = 50  # dead letters one request shows at most


def shown_fields(fields: Mapping[str, str | int], show_data: bool) -> dict[str, str | int]:
    """A dead letter's fields the page may show: without `show_data`, DLQ_SHOWN_FIELDS only."""
    return {k: v for k, v in fields.items() if show_data or k in DLQ_SHOWN_FIELDS}


@dataclass(frozen=True, slots=True)
class Target:
    redis: RedisSpec
    keys: StageKeys


@dataclass
class StageReader:
    """The stages and their Redis, for the server's poll loop and its DLQ requests."""

    stages: Stages
    namespace: str | None  # None: every namespace
    redis_host: str | None
    show_data: bool
    meter: RateMeter = field(default_factory=RateMeter)
    _targets: dict[tuple[str, str], tuple[str, Target]] = field(default_factory=dict)
    _clients: dict[RedisSpec, Redis] = field(default_factory=dict)

    async def snapshot(self) -> Json:
        """The pipelines now, and one line per stage whose Redis could not be read (its rate then unknown)."""
        bodies = await asyncio.to_thread(self.stages.list, self.namespace)
        rates, problems = await self._rates(bodies)
        return {"pipelines": [p.as_json() for p in pipelines_of(bodies, rates)], "problems": problems}

    async def dead_letters(self, namespace: str, name: str, count: int = DLQ_PAGE) -> Json:
        if self.namespace is not None and namespace != self.namespace:
            raise PluginError(f"this view shows namespace {self.namespace!r} only")
        body = await asyncio.to_thread(self.stages.get, namespace, name)
        target = await self._target(body)
        try:
            client = self._client(target.redis)
            lanes = list((await laid_out(client, [target.keys]))[0].lanes)
            entries = await dlq.oldest(client, lanes, count)
            length = sum([await client.xlen(lane.dlq) for lane in lanes])
        except RedisError as exc:
            self._forget(namespace, name)
            raise PluginError(f"the Redis of {namespace}/{name}: {target.redis.explain(exc)}") from None
        shown = [{"id": entry_id, **shown_fields(fields, self.show_data)} for entry_id, fields in entries]
        return {"namespace": namespace, "stage": name, "length": length, "entries": shown, "data": self.show_data}

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    async def _rates(self, bodies: Sequence[Json]) -> tuple[dict[tuple[str, str], float], list[str]]:
        rates: dict[tuple[str, str], float] = {}
        problems = []
        for body in bodies:
            ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
            try:
                target = await self._target(body)
                (stats,) = await collect(self._client(target.redis), [target.keys])
            except PluginError as exc:
                problems.append(f"{ns}/{name}: {exc}")
                continue
            except RedisError as exc:
                self._forget(ns, name)
                problems.append(f"{ns}/{name}: Redis: {target.redis.explain(exc)}")
                continue
            rates[(ns, name)] = round(self.meter.rate(f"{ns}/{name}", time.monotonic(), acknowledged(stats)), 2)
        return rates, problems

    async def _target(self, body: Json) -> Target:
        meta = body["metadata"]
        where, version = (meta["namespace"], meta["name"]), meta.get("resourceVersion", "")
        known = self._targets.get(where)
        if known is None or known[0] != version:
            redis, settings = await asyncio.to_thread(stage_target, self.stages.api, body, self.redis_host)
            known = self._targets[where] = (version, Target(redis, settings.keys))
        return known[1]

    def _forget(self, namespace: str, name: str) -> None:
        self._targets.pop((namespace, name), None)

    def _client(self, spec: RedisSpec) -> Redis:
        # One client per distinct connection: the stages of one Redis share it.
        if spec not in self._clients:
            self._clients[spec] = redis_client(spec)
        return self._clients[spec]
