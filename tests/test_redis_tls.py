"""TLS against a real TLS-only redis-server, with a private CA made in the test: the worker, the `phoenix` commands
and the operator's client verify the server and do work; a wrong CA is refused; with `tls-auth-clients yes` a
client certificate is presented, and without one the connection is refused. Each line of refusal says why."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.operator.errors import StageError
from phoenix.operator.redis.pool import RedisPool
from phoenix.operator.stage.reconcile import prepare_streams
from phoenix.redis_spec import RedisSpec, connect
from tests.fixtures.cli import run_phoenix
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import run_burst
from tests.fixtures.tls_redis import Pki, TlsRedis, make_pki, tls_redis
from tests.fixtures.workers import WorkerPool

# Debian's redis-server with TLS (make tls-redis); the tests skip without it.
pytestmark = pytest.mark.tls
RECORDS = 20
WRONG_CA = "certificate verify failed"
WRONG_CA_HINT = "the server's certificate is not signed by a CA in REDIS_TLS_CA_FILE"
NO_CERTIFICATE = "client certificate: set REDIS_TLS_CERT_FILE and REDIS_TLS_KEY_FILE"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """Verifies nothing of its clients: the client verifies the server."""
    with tls_redis(tmp_path_factory.mktemp("tls-redis"), pki, client_certificates=False) as running:
        yield running


@pytest.fixture(scope="module")
def mtls_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """Requires a client certificate signed by the test CA (`tls-auth-clients yes`)."""
    with tls_redis(tmp_path_factory.mktemp("mtls-redis"), pki, client_certificates=True) as running:
        yield running


def _client_spec(server: TlsRedis) -> RedisSpec:
    """A test's own view of the server, with the client certificate mTLS needs (PEM bytes, as from a Secret)."""
    pki = server.pki
    client = pki.client
    return RedisSpec.from_url(
        server.url, tls_ca=pki.ca.read_bytes(), tls_cert=client.cert.read_bytes(), tls_key=client.key.read_bytes()
    )


@pytest.fixture
async def redis(server: TlsRedis) -> AsyncIterator[aioredis.Redis]:
    client = connect(_client_spec(server), decode_responses=True)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
async def mtls_redis(mtls_server: TlsRedis) -> AsyncIterator[aioredis.Redis]:
    client = connect(_client_spec(mtls_server), decode_responses=True)
    await client.flushdb()
    yield client
    await client.aclose()


def _enqueue_args(service: str, record_id: str) -> tuple[str, ...]:
    return ("enqueue", "--service", service, "--record-id", record_id, "--data", "{}")


async def _processed(redis: aioredis.Redis, service: str) -> int:
    return int(await redis.hlen(f"effects:{service}"))


async def test_a_worker_verifies_the_server_with_the_private_ca_and_works(
    server: TlsRedis, redis: aioredis.Redis
) -> None:
    keys = StageKeys.for_stage("tls")
    for i in range(RECORDS):
        await redis.xadd(keys.input, {"record_id": f"r{i}", "user_id": "u", "data": "{}"})
    await run_burst(server.url, service="tls", redis_tls_ca_file=str(server.pki.ca))
    assert await _processed(redis, "tls") == RECORDS


@pytest.mark.timeout(120)
def test_commands_verify_the_server_with_the_private_ca(server: TlsRedis) -> None:
    ca = ("--redis-tls-ca-file", str(server.pki.ca))
    done = run_phoenix(server.url, *_enqueue_args("tls-cli", "r1"), *ca)
    assert done.returncode == 0, done.stderr
    status = run_phoenix(server.url, "status", "--service", "tls-cli", *ca)
    assert status.returncode == 0, status.stderr
    assert "tls-cli" in status.stdout
    # migrate too (it builds its own client, one that keeps keys as bytes, from the same options).
    migrate = run_phoenix(server.url, "migrate", "--service", "tls-cli", "--dry-run", *ca)
    assert migrate.returncode == 0, migrate.stderr
    assert "nothing to migrate" in migrate.stdout

    refused = run_phoenix(server.url, "status", "--redis-tls-ca-file", str(server.pki.other_ca))
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()
    assert line.startswith("phoenix status: Redis error:") and WRONG_CA in line and WRONG_CA_HINT in line
    # Without REDIS_TLS_CA_FILE the system's CAs are used, which do not know the private CA either.
    assert WRONG_CA in run_phoenix(server.url, "status").stderr


async def test_the_operator_verifies_the_server_with_the_ca_from_a_secret(
    server: TlsRedis, redis: aioredis.Redis
) -> None:
    keys = StageKeys.for_stage("tls-operator")
    pool = RedisPool()
    try:
        # The operator holds the CA as the Secret's bytes, not as a file.
        trusted = RedisSpec.from_url(server.url, tls_ca=server.pki.ca.read_bytes())
        actions = await prepare_streams(pool, trusted, keys, "uid-tls", existed_before=False)
        assert {a.reason for a in actions} == {"ConsumerGroupCreated", "DlqCreated"}
        groups = await redis.xinfo_groups(keys.input)
        assert [g["name"] for g in groups] == [keys.consumer_group]

        wrong = RedisSpec.from_url(server.url, tls_ca=server.pki.other_ca.read_bytes())
        with pytest.raises(StageError) as caught:
            await prepare_streams(pool, wrong, keys, "uid-tls", existed_before=True)
        assert caught.value.reason == "RedisUnavailable"
        assert WRONG_CA in caught.value.message and "\n" not in caught.value.message
    finally:
        await pool.close()


@pytest.mark.timeout(90)
async def test_a_worker_told_the_wrong_ca_refuses_the_server_and_says_why(
    server: TlsRedis, redis: aioredis.Redis, tmp_path: Path
) -> None:
    pool = WorkerPool(server.url, tmp_path / "logs")
    try:
        w = pool.start("tls-wrong", REDIS_TLS_CA_FILE=str(server.pki.other_ca))
        await wait_until(lambda: w.logged("redis_unavailable"), "the worker to refuse the server", 60)
        (told, *_) = [e for e in w.events() if e["event"] == "redis_unavailable"]
        assert WRONG_CA in told["error"] and WRONG_CA_HINT in told["error"] and told["redis"] == server.url
        assert w.alive  # it retries: a CA bundle is fixed by a rollout, not by giving up
        assert not await redis.exists(StageKeys.for_stage("tls-wrong").input)  # it never got in
    finally:
        pool.stop_all()


async def test_mtls_a_worker_presents_its_client_certificate_and_works(
    mtls_server: TlsRedis, mtls_redis: aioredis.Redis, tmp_path: Path
) -> None:
    pki = mtls_server.pki
    keys = StageKeys.for_stage("mtls")
    for i in range(RECORDS):
        await mtls_redis.xadd(keys.input, {"record_id": f"r{i}", "user_id": "u", "data": "{}"})
    pool = WorkerPool(mtls_server.url, tmp_path / "logs")
    try:
        pool.start(
            "mtls",
            REDIS_TLS_CA_FILE=str(pki.ca),
            REDIS_TLS_CERT_FILE=str(pki.client.cert),
            REDIS_TLS_KEY_FILE=str(pki.client.key),
        )
        await wait_until(lambda: _has_processed(mtls_redis, "mtls", RECORDS), f"{RECORDS} records over mTLS", 60)
    finally:
        pool.stop_all()


async def _has_processed(redis: aioredis.Redis, service: str, count: int) -> bool:
    return await _processed(redis, service) == count


def test_mtls_without_a_client_certificate_is_refused_with_a_line_that_says_so(mtls_server: TlsRedis) -> None:
    pki = mtls_server.pki
    refused = run_phoenix(mtls_server.url, "status", "--redis-tls-ca-file", str(pki.ca))
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()
    assert line.startswith("phoenix status: Redis error:") and NO_CERTIFICATE in line

    presented = run_phoenix(
        mtls_server.url,
        *_enqueue_args("mtls-cli", "r1"),
        "--redis-tls-ca-file",
        str(pki.ca),
        "--redis-tls-cert-file",
        str(pki.client.cert),
        "--redis-tls-key-file",
        str(pki.client.key),
    )
    assert presented.returncode == 0, presented.stderr


async def test_mtls_the_operator_presents_the_certificate_from_a_secret(
    mtls_server: TlsRedis, mtls_redis: aioredis.Redis
) -> None:
    pool = RedisPool()
    try:
        client = pool.client(_client_spec(mtls_server))
        assert await client.ping()
        without = RedisSpec.from_url(mtls_server.url, tls_ca=mtls_server.pki.ca.read_bytes())
        with pytest.raises(StageError) as caught:
            await prepare_streams(pool, without, StageKeys.for_stage("mtls-operator"), "uid-mtls", existed_before=False)
        assert NO_CERTIFICATE in caught.value.message
    finally:
        await pool.close()
