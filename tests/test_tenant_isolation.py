"""Two tenants on one Redis database: two copies of the example pipeline (router -> parser -> grouper) in the
namespaces team-a and team-b run at once, as real `phoenix worker` processes with per-user billing on (one billing
service over real HTTP), with the same record ids and the same users but other documents. Each produces its own
grouped results, and neither reads the other's cached API keys."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from cryptography.fernet import Fernet
from pydantic import SecretStr

from phoenix.keys import StageKeys, billing_cache_key, input_stream, scope
from phoenix.stages.data_keys import grouped_key, pages_key
from phoenix.stages.samples import ensure_samples
from phoenix.worker_runtime.billing import CacheSeal
from tests.fixtures.eventually import wait_until
from tests.fixtures.key_service import running_key_service
from tests.fixtures.replies import get_existing, keys_matching
from tests.fixtures.workers import WorkerPool

TENANTS = ("team-a", "team-b")
RECORDS = (("r-1", "u-1"), ("r-2", "u-2"))  # (record id, user id), the same in both tenants
CBC, DIABETES = "01-cbc-metabolic-panel.pdf", "02-diabetes-follow-up.pdf"
# The same ids, other documents: team-b's r-1 is team-a's r-2, and the other way round.
DOCUMENTS = {"team-a": (CBC, DIABETES), "team-b": (DIABETES, CBC)}
PIPELINE = (("router", "parser"), ("parser", "grouper"), ("grouper", None))  # (stage, the stage it feeds)


def start_pipeline(workers: WorkerPool, namespace: str, env: dict[str, str]) -> None:
    for stage, feeds in PIPELINE:
        output = {"OUTPUT_QUEUE": input_stream(feeds, namespace)} if feeds else {}
        workers.start(stage, processor=stage, KEY_NAMESPACE=namespace, **output, **env)


@pytest.mark.timeout(210)
async def test_two_pipelines_on_one_redis_keep_their_own_documents_and_billing_keys(
    redis: aioredis.Redis, workers: WorkerPool, tmp_path: Path
) -> None:
    samples = {path.name: path for path in ensure_samples(tmp_path / "docs")}
    cache_key = Fernet.generate_key().decode()  # one for both tenants: only the names keep the caches apart
    for namespace in TENANTS:
        for (record_id, user_id), document in zip(RECORDS, DOCUMENTS[namespace], strict=True):
            data = json.dumps({"document_url": samples[document].as_uri()})
            await redis.xadd(
                input_stream("router", namespace), {"record_id": record_id, "user_id": user_id, "data": data}
            )
    grouped = [grouped_key(namespace, record_id) for namespace in TENANTS for record_id, _ in RECORDS]

    async with running_key_service() as billing:
        env = {"BILLING_URL": billing.url, "BILLING_MASTER_KEY": billing.master_key, "BILLING_CACHE_KEY": cache_key}
        env["DOCUMENT_ROOT"] = str(tmp_path / "docs")  # the router's; the other stages read no documents
        for namespace in TENANTS:
            start_pipeline(workers, namespace, env)
        await wait_until(lambda: _all_exist(redis, grouped), "every record of both tenants grouped", timeout=180)
        workers.stop_all()

    groups = {key: json.loads(await get_existing(redis, key)) for key in grouped}
    names = {key: [group["name"] for group in value] for key, value in groups.items()}
    assert "HbA1c" in names[grouped_key("team-a", "r-2")] and "HbA1c" in names[grouped_key("team-b", "r-1")]
    assert "HbA1c" not in names[grouped_key("team-a", "r-1")] and "HbA1c" not in names[grouped_key("team-b", "r-2")]
    # Each tenant's r-1 holds its own document's groups: the one the other tenant sent as r-2.
    assert groups[grouped_key("team-a", "r-1")] == groups[grouped_key("team-b", "r-2")]
    assert groups[grouped_key("team-a", "r-2")] == groups[grouped_key("team-b", "r-1")]
    for namespace in TENANTS:
        for stage, _ in PIPELINE:
            keys = StageKeys.for_stage(stage, namespace)
            assert await redis.xlen(keys.dlq) == 0
            [group] = await redis.xinfo_groups(keys.input)
            assert group["entries-read"] == len(RECORDS)  # each record reached each stage once
        assert not await redis.keys(pages_key(namespace, "*"))  # each parser used up its own tenant's pages
    scopes = tuple(scope(namespace) for namespace in TENANTS)
    assert [key for key in await keys_matching(redis, "*") if not key.startswith(scopes)] == []

    # Each tenant asked the billing service once per user and caches only the keys issued to it.
    asked = Counter((r["metadata"]["phoenix_namespace"], r["user_id"]) for r in billing.requests)
    assert asked == {(namespace, user_id): 1 for namespace in TENANTS for _, user_id in RECORDS}
    for namespace in TENANTS:
        for _, user_id in RECORDS:
            entry = await get_existing(redis, billing_cache_key(namespace, user_id))
            seal = CacheSeal.of(namespace, SecretStr(cache_key), None)
            assert seal is not None
            key, _ = seal.open(user_id, entry, max_age=86400, now=time.time())
            assert key is not None
            issued_for = billing.issued_for[key]
            assert (issued_for["metadata"]["phoenix_namespace"], issued_for["user_id"]) == (namespace, user_id)


async def _all_exist(redis: aioredis.Redis, keys: list[str]) -> bool:
    return await redis.exists(*keys) == len(keys)
