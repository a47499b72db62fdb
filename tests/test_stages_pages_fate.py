"""The pages of a record dead-lettered on its way to the parser share the record's fate: kept while its DLQ entry
can be replayed, deleted by `phoenix dlq purge` with the entry, except while the parser still has an entry of the
record to work on (a copy `phoenix reprocess` added, the record sent again). Real `phoenix` commands on the
embedded Valkey; the DLQ entries are what the runtime writes for a record that failed at the parser."""

from __future__ import annotations

import json

import pytest
import redis.asyncio as aioredis

from phoenix.keys import StageKeys
from phoenix.record_format import pack_pairs
from phoenix.stages.data_keys import pages_key
from tests.fixtures.cli import phoenix
from tests.fixtures.replies import add_entry, keys_matching

PARSER = StageKeys.for_stage("parser")


def routed(record_id: str, pages: str | None = None) -> dict[str, str]:
    """The entry the router forwards for a record, as the parser's input and then its DLQ hold it."""
    data = {"pages_key": pages or pages_key("default", record_id), "document_name": "a.pdf", "page_count": 1}
    return {"record_id": record_id, "user_id": "u1", "data": json.dumps(data)}


def dead(record_id: str, pages: str | None = None) -> dict[str, str]:
    return {**routed(record_id, pages), "error": "LLMReplyError: ...", "error_type": "RetriesExhausted"}


@pytest.mark.subprocess
async def test_a_purge_deletes_the_pages_of_its_records_but_those_still_to_be_parsed(
    redis: aioredis.Redis, redis_url: str
) -> None:
    given_up, copied, retried, delivered = "given-up", "reprocessed", "retrying", "in-flight"
    for record_id in (given_up, copied, retried, delivered, "dropped-later"):
        await redis.set(pages_key("default", record_id), "[]")
    other_tenant = pages_key("team-b", "x")
    await redis.set(other_tenant, "[]")
    # What the parser still has to work on: an entry of each kind the lane keeps.
    await redis.xgroup_create(PARSER.input, PARSER.consumer_group, id="0", mkstream=True)
    await add_entry(redis, PARSER.input, routed(delivered))
    await redis.xreadgroup(PARSER.consumer_group, "parser-1", {PARSER.input: ">"})  # pending, not acknowledged
    await add_entry(redis, PARSER.input, routed(copied))  # not delivered yet
    await redis.zadd(PARSER.retry, {pack_pairs(list(sum(routed(retried).items(), ()))): 1})

    through = ""
    for record_id in (given_up, copied, retried, delivered):
        through = await add_entry(redis, PARSER.dlq, dead(record_id))
    await add_entry(redis, PARSER.dlq, dead("foreign", other_tenant))  # a message naming another tenant's pages
    await add_entry(redis, PARSER.dlq, dead("not-pages", PARSER.input))  # or any other key
    await add_entry(redis, PARSER.dlq, dead("dropped-later"))

    out = phoenix(redis_url, "dlq", "purge", "--service", "parser", "--through", through, "--yes")
    assert out.strip() == "deleted 4 entries from phoenix:{default}:parser:dlq, and the pages of 1 records they held"
    left = set(await keys_matching(redis, "*_pages:*"))
    assert pages_key("default", given_up) not in left
    assert {pages_key("default", r) for r in (copied, retried, delivered)} <= left  # still to be parsed
    assert pages_key("default", "dropped-later") in left  # its entry was not purged

    out = phoenix(redis_url, "dlq", "purge", "--service", "parser", "--all", "--yes")
    assert out.strip().endswith(
        "deleted 3 entries from phoenix:{default}:parser:dlq, and the pages of 1 records they held"
    )
    assert pages_key("default", "dropped-later") not in set(await keys_matching(redis, "*_pages:*"))
    assert await redis.exists(other_tenant, PARSER.input) == 2  # keys a message names, never deleted
