"""run_then_wait (phoenix/replica_wait.py), the producer's and the settler's writes-then-WAIT, on one Valkey and on a
cluster node: replies in order, a script the server lacks loaded and run once, an error reply raised after the WAIT.
The replica count against a real replica is the producer's test (tests/test_producer.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from phoenix.redis_spec import RedisSpec, connect
from phoenix.replica_wait import run_then_wait
from tests.fixtures.valkey_cluster import single_node_cluster

KEY = "{replica-wait}:counter"


@pytest.fixture(params=["standalone", "cluster"])
async def client(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A client as the runtime builds it: of the session's Valkey, or of a one-node cluster."""
    if request.param == "standalone":
        built = connect(RedisSpec.from_url(redis_url), decode_responses=True)
        await built.delete(KEY)
        yield built
        await built.aclose()
        return
    with single_node_cluster() as url:
        built = connect(RedisSpec.from_url(url, mode="cluster"), decode_responses=True)
        try:
            yield built  # fresh: its slot map not read yet, as a producer's first send finds it
        finally:
            await built.aclose()


async def test_the_commands_replies_come_back_in_order_with_the_replica_count(client: aioredis.Redis) -> None:
    commands = [("SET", KEY, "5"), ("INCRBY", KEY, "2"), ("GET", KEY)]
    replies, acked = await run_then_wait(client, KEY, commands, 0, 100)
    assert replies == [True, 7, "7"]
    assert acked == 0  # no replica here


async def test_a_script_the_server_lacks_is_loaded_and_runs_once(client: aioredis.Redis) -> None:
    # A script no test loaded before: the server answers NOSCRIPT first.
    script = client.register_script(f"-- {uuid.uuid4()}\nreturn redis.call('INCR', KEYS[1])")
    assert await client.script_exists(script.sha) == [False]
    commit = ("EVALSHA", script.sha, 1, KEY)
    (result,), acked = await run_then_wait(client, KEY, [commit], 0, 100, script=script)
    assert (result, acked) == (1, 0)
    assert await client.get(KEY) == "1"  # once, not once per attempt
    (result,), _ = await run_then_wait(client, KEY, [commit], 0, 100, script=script)
    assert result == 2


async def test_an_error_reply_is_raised_and_the_client_stays_usable(client: aioredis.Redis) -> None:
    with pytest.raises(ResponseError, match="not an integer"):
        await run_then_wait(client, KEY, [("SET", KEY, "text"), ("INCR", KEY)], 0, 100)
    assert await client.get(KEY) == "text"  # the command before the error ran
    assert await client.ping()
