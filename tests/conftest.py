"""Session fixtures: one real Valkey (or the user's Redis via REDIS_URL) for the whole run; the test tiers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis import Redis as SyncRedis

from phoenix.embedded import embedded_valkey, start_valkey
from phoenix.worker_runtime import scrub
from tests.fixtures.valkey_cluster import single_node_cluster
from tests.fixtures.workers import WorkerPool

# fuzzing: the hypothesis profile of the run (a fixed seed unless `make fuzz`), loaded before any suite.
pytest_plugins = ["tests.fixtures.kube_cluster", "tests.fixtures.sentinel", "tests.fixtures.fuzzing"]

# The tiers of DEVELOPMENT.md ("Test tiers"), marked by what a test uses. A fixture that starts something says so
# here; a test that starts it itself carries the marker (a decorator, or `pytestmark` for a whole module).
# pyproject.toml registers them.
FIXTURE_MARKERS = {
    "redis_url": "valkey",
    "cluster_url": "valkey",
    "workers": "subprocess",
    "kube_cluster": "kube",
    "sentinels": "sentinel",
}
# Anything outside the Python process: a test with none of these is `pure`.
RESOURCE_MARKERS = frozenset(
    {"valkey", "ocr", "subprocess", "kube", "helm", "promtool", "sentinel", "cluster", "tls", "e2e", "browser"}
)


# pyproject.toml's `timeout` (30 s) is for one test; the session's API server starts within the first test that
# uses it (11-21 s measured on the loaded 2-core machine), so a test of the API server without a timeout of its own
# gets room for that start as well. The e2e suite keeps the ten minutes it always had (its first test builds and
# loads the image, a pod start on a real node takes what it takes).
KUBE_TEST_TIMEOUT = 90
E2E_TEST_TIMEOUT = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in used:
                item.add_marker(marker)
        if not any(item.get_closest_marker(marker) for marker in RESOURCE_MARKERS):
            item.add_marker("pure")
        if item.get_closest_marker("timeout") is None:
            if item.get_closest_marker("e2e"):
                item.add_marker(pytest.mark.timeout(E2E_TEST_TIMEOUT))
            elif "kube_cluster" in used:
                item.add_marker(pytest.mark.timeout(KUBE_TEST_TIMEOUT))


@pytest.fixture(autouse=True)
def no_exposed_secrets() -> Iterator[None]:
    """Each test starts with no user keys exposed and leaves none behind. scrub.expose keeps a key for the life of
    the task that exposed it; a synchronous test exposes it in the main thread's context, which every later test's
    task would inherit (and mask, say, "sk-a" inside another test's "sk-a4f...")."""
    token = scrub._exposed.set(((), ()))
    yield
    scrub._exposed.reset(token)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """REDIS_URL when the user points the suite at their Redis 7+ / Valkey 8+, else an embedded Valkey."""
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    with embedded_valkey() as url:
        yield url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A decoded client on a database that is flushed before each test."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
def workers(redis_url: str, tmp_path: Path) -> Iterator[WorkerPool]:
    """Real `phoenix worker` subprocesses against the session's Redis; all stopped after the test."""
    pool = WorkerPool(redis_url, tmp_path / "logs")
    yield pool
    pool.stop_all()


@pytest.fixture
async def raw_redis(redis_url: str, redis: aioredis.Redis) -> AsyncIterator[aioredis.Redis]:
    """A bytes client (decode_responses=False) on the same, already flushed, database."""
    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """The embedded Valkey in cluster mode, one node holding every slot (tests/fixtures/valkey_cluster.py)."""
    with single_node_cluster() as url:
        yield url


@pytest.fixture
async def cluster(cluster_url: str) -> AsyncIterator[aioredis.Redis]:
    """A decoded client on the cluster node, flushed before each test."""
    client = aioredis.Redis.from_url(cluster_url, decode_responses=True)
    await client.flushall()
    yield client
    await client.aclose()


@pytest.fixture
def replicated() -> Iterator[tuple[str, int]]:
    """A primary with one replica: its URL and the replica's pid (to freeze it: MIN_REPLICAS_ACK's short count)."""
    primary = start_valkey()
    replica = start_valkey(replicaof=f"{primary.host} {primary.port}")
    try:
        with SyncRedis(host=replica.host, port=replica.port) as copy:
            pid = int(copy.info("server")["process_id"])
        yield f"redis://{primary.host}:{primary.port}/0", pid
    finally:
        replica.stop()
        primary.stop()
