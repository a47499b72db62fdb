"""taskiq with its Redis Cluster streams broker (consumer group, acknowledged after the task ran)."""

import os

from taskiq_redis import RedisStreamClusterBroker

QUEUE = "peers:taskiq-cluster"
# consumer_id "0": the group starts at the beginning, so jobs enqueued before the worker are read.
broker = RedisStreamClusterBroker(url=os.environ["PEER_REDIS_URL"], queue_name=QUEUE, consumer_id="0")


@broker.task
async def noop(i: int) -> None:
    return None
