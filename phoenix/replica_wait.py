"""Writes, then WAIT for replicas on the connection that made them: MIN_REPLICAS_ACK of the producer and of the
settler alike.

WAIT counts the writes of its own connection and names no key, so a cluster client would send it to a node of its
own choosing: on a Redis Cluster the commands and their WAIT go in one pipeline of the primary that serves the slot
of the key the caller names (every command's keys in that slot). There a MOVED or ASK reply patches the client's
slot map and a node that stopped answering makes it read the map again, and the error is raised for the caller's
retry; a script a promoted replica never got is loaded once and its commands run again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, NoScriptError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from phoenix.redis_spec import as_connection_error


async def run_then_wait(
    client: aioredis.Redis | RedisCluster,
    key: str,
    commands: Sequence[tuple[Any, ...]],
    replicas: int,
    timeout_ms: int,
    *,
    script: AsyncScript | None = None,
) -> tuple[list[Any], int]:
    """Run `commands`, then WAIT up to `timeout_ms` for `replicas` on the same connection: the commands' replies
    in order and how many replicas acknowledged them. `key`: on a cluster, the key whose slot's primary runs them.
    `script`: the script the commands EVALSHA, loaded where the server lacks it. Raises the first error a command
    or WAIT replied (see the module docstring for a cluster's)."""
    if not isinstance(client, RedisCluster):
        # `async with`: a pipeline whose execute fails before it sends (its scripts checked on a primary that is
        # gone) keeps its connection otherwise, and redis-py prints "Unclosed Pipeline client" into the JSON logs.
        async with client.pipeline(transaction=False) as pipe:
            if script is not None:
                # What script(client=pipe) does: the pipeline loads it first where the server lacks it. (redis-py
                # types the set as holding synchronous scripts, though AsyncScript adds itself there too.)
                pipe.scripts.add(script)  # type: ignore[arg-type]
            for command in commands:
                pipe.execute_command(*command)
            pipe.wait(replicas, timeout_ms)
            *replies, acked = await pipe.execute()
        return replies, int(acked)
    # A client that has sent nothing yet has no slot map: get_node_from_key would find no node for any slot.
    # initialize() reads it once and returns at once afterwards.
    await client.initialize()
    node = client.get_node_from_key(key)
    assert node is not None  # a slot without a node raises SlotNotCoveredError
    for attempt in range(2):
        pipeline = [PipelineCommand(position, *command) for position, command in enumerate(commands)]
        pipeline.append(PipelineCommand(len(pipeline), "WAIT", replicas, timeout_ms))
        try:
            await node.execute_pipeline(pipeline)
        except (RedisConnectionError, RedisTimeoutError):
            await _refresh_slots(client)
            raise
        except RuntimeError as exc:
            raise as_connection_error(exc) from exc
        *replies, acked = (command.result for command in pipeline)
        # Every command refused for want of the script (a replica promoted since never got it): none ran, so all
        # run again once it is loaded.
        if (
            script is not None
            and attempt == 0
            and replies
            and all(isinstance(reply, NoScriptError) for reply in replies)
        ):
            await client.script_load(script.script)
            continue
        break
    for reply in replies:
        if isinstance(reply, AskError):  # MovedError too: the slot moved; the next attempt goes to its new primary
            await client.nodes_manager.move_slot(reply)
            break
    for reply in (*replies, acked):
        if isinstance(reply, Exception):
            raise reply
    return replies, int(acked)


async def _refresh_slots(cluster: RedisCluster) -> None:
    """The slot map again, after a node stopped answering (a failover may be under way); a failure to refresh is
    left to the next command, which retries it."""
    with contextlib.suppress(Exception):
        await cluster.nodes_manager.initialize()
