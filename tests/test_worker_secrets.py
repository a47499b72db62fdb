"""The values of a processor's own Secrets, named by MASKED_ENV (the operator lists the variables spec.env and
spec.pod.envFrom take from Secrets), never reach the DLQ, the retry entries or the logs of a real worker; a short
one is masked as a whole token, so that ordinary text around it stays as written."""

from __future__ import annotations

import json
import re
import secrets

import pytest
import redis.asyncio as aioredis

from tests.fixtures.eventually import wait_until
from tests.fixtures.replies import stream_entries
from tests.fixtures.sample_stage import DLQ, IN, RETRY
from tests.fixtures.workers import WorkerPool


def _whole(value: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(value)}(?!\w)")


@pytest.mark.timeout(60)
async def test_the_values_masked_env_names_never_reach_the_dlq_the_retries_or_the_logs(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    token, pin, visible = f"vt-{secrets.token_urlsafe(18)}", str(secrets.randbelow(900) + 100), "eu-west-1"
    quote = ["VENDOR_TOKEN", "VENDOR_PIN", "VENDOR_REGION"]
    await redis.xadd(IN, {"record_id": "p1", "user_id": "u", "data": json.dumps({"quote": quote, "permanent": True})})
    await redis.xadd(IN, {"record_id": "t1", "user_id": "u", "data": json.dumps({"quote": quote})})
    w = workers.start(
        "s",
        processor="tests.processors:EnvQuotingProcessor",
        VENDOR_TOKEN=token,
        VENDOR_PIN=pin,
        VENDOR_REGION=visible,
        MASKED_ENV="VENDOR_TOKEN, VENDOR_PIN",
        CIRCUIT_FAILURE_THRESHOLD="100",
    )
    await wait_until(lambda: redis.xlen(DLQ), "the permanent failure dead-lettered")
    await wait_until(lambda: _retried(w.event_names(), 2), "the transient failure retried twice", timeout=30)
    w.stop()

    shown = f"VENDOR_TOKEN=*** VENDOR_PIN=*** VENDOR_REGION={visible}"
    [(_, dead)] = await stream_entries(redis, DLQ)
    assert dead["error"] == shown
    waiting = await redis.zrange(RETRY, 0, -1)
    promoted = [fields for _, fields in await stream_entries(redis, IN) if "last_error" in fields]
    assert waiting and all(shown in member for member in waiting)
    assert promoted and all(f["last_error"] == f"ConnectionError: {shown}" for f in promoted)
    log = w.process.log_path.read_text()
    assert "Traceback" in log and f"detail={shown}" not in log and shown in log
    stored = json.dumps([dead, waiting, promoted])
    for text in (stored, log):
        assert token not in text
        assert not _whole(pin).search(text), f"{pin} is in {text}"


async def _retried(events: list[str], at_least: int) -> bool:
    return events.count("processing_failed_will_retry") >= at_least
