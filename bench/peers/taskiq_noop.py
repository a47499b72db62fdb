"""taskiq with its Redis Streams broker (consumer group, acknowledged after the task ran)."""

import os

from taskiq_redis import RedisStreamBroker

QUEUE = "peers:taskiq"
# consumer_id "0": the group starts at the beginning, so jobs enqueued before the worker are read.
broker = RedisStreamBroker(url=os.environ["PEER_REDIS_URL"], queue_name=QUEUE, consumer_id="0")


@broker.task
async def noop(i: int) -> None:
    return None
