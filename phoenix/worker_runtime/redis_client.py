"""Typed helpers over the runtime's Redis clients (which phoenix.redis_spec.connect builds)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, NoScriptError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from phoenix.redis_spec import as_connection_error, is_cluster

# redis-py types stream replies for every client and protocol at once (ids `bytes | str | None`, fields possibly None,
# RESP3 maps); these give the shapes the runtime's RESP2 clients really return, checked once here.
TextEntry = tuple[str, dict[str, str]]
# Fields are None for an entry deleted while it was pending.
Entry = tuple[bytes, dict[bytes, bytes] | None]


async def text_range(
    client: aioredis.Redis,
    stream: str,
    *,
    first: str = "-",
    last: str = "+",
    count: int | None = None,
    newest_first: bool = False,
) -> list[TextEntry]:
    """XRANGE (XREVRANGE when `newest_first`) on a client that decodes responses."""
    if newest_first:
        reply = await client.xrevrange(stream, max=last, min=first, count=count)
    else:
        reply = await client.xrange(stream, min=first, max=last, count=count)
    return cast(list[TextEntry], reply or [])


async def read_group(
    client: aioredis.Redis, group: str, consumer: str, stream: str, cursor: str, count: int, block: int | None = None
) -> list[Entry]:
    """XREADGROUP of one stream on a client that returns bytes: its entries ([] when none came)."""
    reply = await client.xreadgroup(group, consumer, {stream: cursor}, count=count, block=block)
    return cast(list[tuple[bytes, list[Entry]]], reply)[0][1] if reply else []


async def read_groups(
    client: aioredis.Redis, group: str, consumer: str, streams: list[str], count: int, block: int
) -> list[tuple[bytes, list[Entry]]]:
    """XREADGROUP of new entries of several streams (one slot on a cluster) at once: (stream, entries) of those that
    had any."""
    reply = await client.xreadgroup(group, consumer, dict.fromkeys(streams, ">"), count=count, block=block)
    return cast(list[tuple[bytes, list[Entry]]], reply or [])


def text(value: object) -> str:
    """A reply item (or error) as str, whether the client decodes responses or not."""
    return value.decode() if isinstance(value, bytes) else str(value)


async def script_then_wait(
    client: aioredis.Redis,
    script: AsyncScript,
    keys: Sequence[Any],
    args: Sequence[Any],
    replicas: int,
    timeout_ms: int,
) -> tuple[Any, int]:
    """Run `script`, then WAIT for `replicas` on the same connection (WAIT counts that connection's writes):
    the script's reply and how many replicas acknowledged. Raises what the script or WAIT raised.

    A cluster pipeline would split the two (WAIT has no key), so on a Redis Cluster both go in one pipeline of
    the primary that serves the script's first key; a MOVED there patches the client's slot map, a lost node
    refreshes it, and the error is raised for the caller's retry."""
    if not is_cluster(client):
        # `async with`: a pipeline whose execute fails before it sends (its scripts checked on a primary that is
        # gone) keeps its connection otherwise, and redis-py prints "Unclosed Pipeline client" into the JSON logs.
        async with client.pipeline(transaction=False) as pipe:
            await script(keys=keys, args=args, client=pipe)
            pipe.wait(replicas, timeout_ms)
            result, acked = await pipe.execute()
        return result, acked
    cluster = cast(RedisCluster, client)
    node = cluster.get_node_from_key(keys[0])
    assert node is not None  # a slot without a node raises SlotNotCoveredError
    for attempt in range(2):
        commands = [
            PipelineCommand(0, "EVALSHA", script.sha, len(keys), *keys, *args),
            PipelineCommand(1, "WAIT", replicas, timeout_ms),
        ]
        try:
            await node.execute_pipeline(commands)
        except (RedisConnectionError, RedisTimeoutError):
            await _refresh_slots(cluster)
            raise
        except RuntimeError as exc:
            raise as_connection_error(exc) from exc
        result, acked = commands[0].result, commands[1].result
        if isinstance(result, NoScriptError) and attempt == 0:  # a replica promoted since: it never got the script
            await cluster.script_load(script.script)
            continue
        break
    if isinstance(result, AskError):  # MovedError too: the slot moved; the next attempt goes to its new primary
        await cluster.nodes_manager.move_slot(result)
    for reply in (result, acked):
        if isinstance(reply, Exception):
            raise reply
    return result, int(acked)


async def _refresh_slots(cluster: RedisCluster) -> None:
    """The slot map again, after a node stopped answering (a failover may be under way); a failure to refresh is
    left to the next command, which retries it."""
    with contextlib.suppress(Exception):
        await cluster.nodes_manager.initialize()
