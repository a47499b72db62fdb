"""The Redis ACL user of a namespace (operator/redis/acl.py) on a Valkey of its own: what the worker runtime, the
producer and the tools send, read from MONITOR while they run as the user, is exactly USER_COMMANDS, and the
server refused none of it (ACL LOG); the user reaches none of another namespace's keys, nor a stream another
namespace claimed, nor the server-wide commands that would let it see or harm them.

The flows: the operator (the admin) claims three stages of namespace team-a; as the user, two partitioned stages
(2 lanes forwarding to 3: a relayed hop, the last under a rate limit that holds records back) and a stage with a
named input and output run with retries, dead letters, billing, backpressure, MIN_REPLICAS_ACK, a database other
than 0 and a dead consumer forgotten; the producer sends; people's repairs, replays, inspection, queue figures and
audit run."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.exceptions import ResponseError

from phoenix.embedded import start_valkey
from phoenix.keys import StageKeys, name_marker
from phoenix.operator.redis.acl import USER_COMMANDS, user_rules, username
from phoenix.producer import Producer, Record
from phoenix.rate_limits import RateLimit
from phoenix.record_format import DONE, LOCKED
from phoenix.tools import audit, dlq, inspection, queue_stats, repair
from phoenix.worker_runtime import ownership
from phoenix.worker_runtime.billing import ApiKeyProvider
from phoenix.worker_runtime.settings import WorkerSettings
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import drained, running_worker
from tests.fixtures.key_service import running_key_service
from tests.fixtures.replies import add_entry
from tests.processors import OutcomeProcessor

pytestmark = pytest.mark.subprocess  # a Valkey server of its own: ACL users are server-wide
NS, OTHER, CLUSTER = "team-a", "team-b", "cluster-1"
USER, PASSWORD = username(NS, CLUSTER), "s3cret-team-a-password"
FIRST = StageKeys.for_stage("first", NS, partitions=2)
SECOND = StageKeys.for_stage("second", NS, partitions=3)
NAMED = StageKeys.for_stage("named", NS, input="orders-in", output="orders-out")
THEIRS = StageKeys.for_stage("first", OTHER)
# The commands whose first argument is a subcommand, as ACL names them (`xinfo|groups`).
CONTAINERS = {"xinfo", "xgroup", "client", "script", "config", "acl", "object", "memory", "command"}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, int]]:
    valkey = start_valkey()
    try:
        yield valkey.host, valkey.port
    finally:
        valkey.stop()


@pytest.fixture
async def admin(server: tuple[str, int]) -> AsyncIterator[aioredis.Redis]:
    """The operator's side: the default user on database 1, the user written as the operator writes it."""
    host, port = server
    client = aioredis.Redis(host=host, port=port, db=1, decode_responses=True)
    await client.flushall()
    rules = user_rules(NS, NAMED.claimed_streams, PASSWORD, None)
    await client.execute_command("ACL", "SETUSER", USER, *rules)
    await client.execute_command("ACL", "LOG", "RESET")
    yield client
    await client.aclose()


def _user_url(server: tuple[str, int]) -> str:
    return f"redis://{USER}:{PASSWORD}@{server[0]}:{server[1]}/1"


class CommandMonitor:
    """The commands the server ran while the block lasts, as ACL names them, top-level and inside scripts."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self.seen: set[str] = set()

    async def __aenter__(self) -> CommandMonitor:
        self._monitor = self._client.monitor()
        await self._monitor.__aenter__()
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while True:
            words = (await self._monitor.next_command())["command"].split(" ")
            name = words[0].lower()
            if name == "echo" and words[1:] == ["phoenix-acl-monitor-end"]:
                return
            self.seen.add(f"{name}|{words[1].lower()}" if name in CONTAINERS and len(words) > 1 else name)

    async def __aexit__(self, *exc: object) -> None:
        await self._client.echo("phoenix-acl-monitor-end")
        await asyncio.wait_for(self._reader, 60)
        await self._monitor.__aexit__(*exc)


async def _send(client: aioredis.Redis, keys: StageKeys, record_id: str, **data: object) -> None:
    await add_entry(
        client, keys.lane_of(record_id).input, {"record_id": record_id, "user_id": "u1", "data": json.dumps(data)}
    )


@pytest.mark.timeout(180)
async def test_the_runtime_and_tools_send_exactly_the_users_commands_and_none_is_refused(
    server: tuple[str, int], admin: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _user_url(server)
    for keys in (FIRST, SECOND, NAMED):  # the operator's claims, as the admin
        await ownership.claim(admin, keys, f"uid-{keys.name}", adopt=True, cluster=CLUSTER)
    await admin.xgroup_createconsumer(NAMED.input, NAMED.consumer_group, "ghost")  # a consumer long gone
    monkeypatch.setattr("phoenix.worker_runtime.reclaim._FORGET_CONSUMER_AFTER_MS", 0)
    user = aioredis.Redis.from_url(url, decode_responses=True)
    monitor_client = aioredis.Redis(host=server[0], port=server[1], decode_responses=True)
    stages: dict[str, Any] = {"key_namespace": NS, "stage_cluster": CLUSTER, "max_attempts": 2}
    async with CommandMonitor(monitor_client) as monitor, running_key_service() as key_service:
        producer = Producer(user, stage=FIRST.name, namespace=NS)
        await producer.send_many([Record(f"r{i}", {"action": "fail" if i == 1 else ""}) for i in range(8)])
        await _send(user, NAMED, "n1")
        await _send(user, NAMED, "long", action="sleep:1.5")  # its lock renewed while it runs
        for dead in ("n2", "n3"):
            await _send(user, NAMED, dead, action="invalid")  # past DLQ_MAXLEN: trimmed and counted
        async with (
            running_worker(
                url,
                "second",
                OutcomeProcessor,
                partitions=3,
                stage_uid="uid-second",
                # 8 records 1.5 s apart, 1 at once: each further off than a second is held back in the retry set.
                rate_limits=[RateLimit(rate=40, per="minute", burst=1)],
                **stages,
            ) as last,
            running_worker(
                url,
                "first",
                OutcomeProcessor,
                partitions=2,
                output_queue=StageKeys.for_stage("second", NS).input,
                output_partitions=3,
                stage_uid="uid-first",
                output_high_water=2,
                **stages,
            ) as first,
            running_worker(
                url,
                "named",
                OutcomeProcessor,
                input_queue=NAMED.input,
                output_queue=NAMED.output,
                stage_uid="uid-named",
                min_replicas_ack=1,
                min_replicas_timeout_ms=10,
                dlq_maxlen=1,
                **stages,
            ) as named,
        ):
            assert await named.ready() == (True, "ok")  # what /readyz asks
            for worker in (first, last, named):
                await wait_until(lambda w=worker: drained(w), f"{worker.settings.service_name} drained", 90)
            await wait_until(
                lambda: _forgotten(admin, NAMED, "ghost"), "the dead consumer forgotten (XGROUP DELCONSUMER)", 30
            )
        billing = ApiKeyProvider(
            user, stage="named", namespace=NS, billing_url=key_service.url, master_key=SecretStr(key_service.master_key)
        )
        try:
            assert await billing.key_for("u1") is not None
        finally:
            await billing.aclose()
        await _people_tools(user, url)
    await monitor_client.aclose()
    await user.aclose()

    # Refused: only the worker's check of the server's persistence and eviction settings, which CONFIG GET would
    # give with every password of the server's configuration (the worker says it could not check them).
    assert {entry["object"] for entry in await admin.execute_command("ACL", "LOG")} == {"config|get"}
    assert monitor.seen - {"auth", "hello"} == set(USER_COMMANDS)


async def _forgotten(client: aioredis.Redis, keys: StageKeys, consumer: str) -> bool:
    return consumer not in [c["name"] for c in await client.xinfo_consumers(keys.input, keys.consumer_group)]


async def _people_tools(user: aioredis.Redis, url: str) -> None:
    """What `phoenix unlock|reclaim|reprocess|dlq|inspect|audit` and the operator's status figures do, as the user."""
    settings = WorkerSettings(
        service_name="named",
        processor="tests.processors:OutcomeProcessor",
        redis_url=url,
        key_namespace=NS,
        input_queue=NAMED.input,
        claim_idle_ms=1,  # dead-1 is dead a millisecond after its read: reclaim takes its entry
    )
    await _send(user, NAMED, "stuck")
    await user.xreadgroup(NAMED.consumer_group, "dead-1", {NAMED.input: ">"}, count=1)
    await user.set(NAMED.record("stuck"), LOCKED + "dead-1:0123456789ab")
    await inspection.inspect_record(user, settings, "stuck")
    assert (await repair.unlock(user, settings, "stuck", force=True)).status == "released"
    await asyncio.sleep(0.01)
    await repair.reclaim(user, settings, await repair.plan_reclaim(user, settings))
    await user.set(NAMED.record("done"), DONE + "1-0")
    await user.xadd(NAMED.dlq, {"record_id": "done", "user_id": "u1", "data": "{}", "error": "gone"})
    await repair.reprocess(user, settings, await repair.plan_reprocess(user, settings, "done"))
    await user.xadd(NAMED.dlq, {"record_id": "d", "user_id": "u1", "data": "{}", "error": "gone"})
    assert [entry async for entry in dlq.entries(user, NAMED.dlq)]
    assert await dlq.replay(user, NAMED.dlq, NAMED.input, None, ledger=NAMED.replay_ledger("req-1")) >= 1
    last = await add_entry(user, NAMED.dlq, {"record_id": "e", "user_id": "u1", "data": "{}", "error": "gone"})
    assert await dlq.purge_through(user, NAMED.dlq, last) == 1
    await queue_stats.collect_lanes(user, [FIRST, NAMED])
    await audit.record(user, NAMED.audit, audit.Repair(audit.person(), "unlock", 1, "released stuck", "stuck"))
    assert await audit.recent(user, NAMED.audit)


async def test_the_user_reaches_no_key_of_another_namespace_nor_the_server(
    server: tuple[str, int], admin: aioredis.Redis
) -> None:
    await ownership.claim(admin, THEIRS, "uid-theirs", adopt=True, cluster=CLUSTER)
    await admin.xadd(THEIRS.input, {"record_id": "theirs"})
    await admin.set(THEIRS.record("theirs"), DONE + "1-0")
    theirs_claimed = StageKeys.for_stage("payments", OTHER, input="payments-in")
    await ownership.claim(admin, theirs_claimed, "uid-payments", adopt=True, cluster=CLUSTER)
    user = aioredis.Redis.from_url(_user_url(server), decode_responses=True)
    refused = [
        user.xdel(THEIRS.input, "0-1"),
        user.xrange(THEIRS.input),
        user.delete(THEIRS.record("theirs")),
        user.xreadgroup(THEIRS.consumer_group, "thief", {THEIRS.input: ">"}),
        user.xgroup_create(THEIRS.input, "thief-group", id="0"),
        user.xadd("payments-in", {"record_id": "injected"}),
        user.hset(name_marker("payments-in"), "namespace", NS),
        # A script reaches only the keys the user may reach, declared or not.
        user.evalsha(await user.script_load("return redis.call('DEL', KEYS[1])"), 1, THEIRS.input),
        user.evalsha(await user.script_load("return redis.call('DEL', ARGV[1])"), 1, NAMED.input, THEIRS.input),
        user.eval("return 1", 0),
        user.scan(),
        user.keys("*"),
        user.flushall(),
        user.config_get("requirepass"),
        user.execute_command("ACL", "SETUSER", USER, "~*"),
        user.execute_command("SCRIPT", "FLUSH"),
        user.execute_command("CLIENT", "KILL", "TYPE", "normal"),
    ]
    for call in refused:
        # NOPERM; from inside a script, "ACL failure in script: No permissions to access a key".
        with pytest.raises(ResponseError, match=r"(?i)no permissions"):
            await call
    await user.aclose()
    assert await admin.xlen(THEIRS.input) == 1 and await admin.get(THEIRS.record("theirs")) == DONE + "1-0"
    assert [g["name"] for g in await admin.xinfo_groups(THEIRS.input)] == [THEIRS.consumer_group]
    assert await admin.hget(name_marker("payments-in"), "namespace") == OTHER
