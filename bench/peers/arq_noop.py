"""arq (asyncio jobs in a sorted set, results kept as its defaults do)."""

import os
from typing import Any

from arq.connections import RedisSettings


async def noop(ctx: dict[str, Any], i: int) -> None:
    return None


class WorkerSettings:
    functions = [noop]
    redis_settings = RedisSettings.from_dsn(os.environ["PEER_REDIS_URL"])
    max_jobs = 1000
