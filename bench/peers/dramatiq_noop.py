"""dramatiq with its Redis broker (Lua-scripted lists, acknowledged after the actor ran)."""

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker

dramatiq.set_broker(RedisBroker(url=os.environ["PEER_REDIS_URL"]))


@dramatiq.actor
def noop(i: int) -> None:
    return None
