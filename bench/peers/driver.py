"""Run with the peers' virtualenv: enqueue N no-op jobs for one peer, start its worker (its own CLI, one
process), and print one JSON line with its throughput. Phoenix is not importable here, by design.

    python bench/peers/driver.py {taskiq,taskiq-cluster,dramatiq,arq} REDIS_URL MESSAGES
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent


def enqueue_taskiq(module_name: str) -> Callable[[int], Callable[[redis.Redis], int]]:
    """The enqueuer of a taskiq broker module (taskiq_noop: one Redis, taskiq_cluster_noop: a Redis Cluster)."""

    def enqueue(n: int) -> Callable[[redis.Redis], int]:
        module = importlib.import_module(module_name)

        async def send() -> None:
            await module.broker.startup()  # creates the stream's consumer group at 0
            for i in range(n):
                await module.noop.kiq(i)
            await module.broker.shutdown()

        asyncio.run(send())

        def remaining(r: redis.Redis) -> int:
            group = next(g for g in r.xinfo_groups(module.QUEUE) if g["name"] == b"taskiq")
            return int(group["lag"] or 0) + int(group["pending"])

        return remaining

    return enqueue


def taskiq_worker(module_name: str) -> list[str]:
    return [
        "-m",
        "taskiq",
        "worker",
        f"{module_name}:broker",
        "--workers",
        "1",
        "--max-async-tasks",
        "1000",
        "--no-configure-logging",
    ]


def enqueue_dramatiq(n: int) -> Callable[[redis.Redis], int]:
    from dramatiq_noop import noop

    for i in range(n):
        noop.send(i)
    return lambda r: r.hlen("dramatiq:default.msgs")  # message bodies stay until acknowledged


def enqueue_arq(n: int) -> Callable[[redis.Redis], int]:
    from arq import create_pool
    from arq_noop import WorkerSettings

    async def send() -> None:
        pool = await create_pool(WorkerSettings.redis_settings)
        for i in range(n):
            await pool.enqueue_job("noop", i)
        await pool.aclose()

    asyncio.run(send())
    return lambda r: r.zcard("arq:queue")  # a job leaves the queue when it finished and its result is stored


PEERS: dict[str, tuple[Callable[[int], Callable[[redis.Redis], int]], list[str], str]] = {
    "taskiq": (
        enqueue_taskiq("taskiq_noop"),
        taskiq_worker("taskiq_noop"),
        "taskiq-redis RedisStreamBroker, 1 process, --max-async-tasks 1000",
    ),
    # On the one-shard cluster the bench runs Phoenix's (d1) on (a single node holds every slot, so the driver's
    # plain client reads the group's figures).
    "taskiq-cluster": (
        enqueue_taskiq("taskiq_cluster_noop"),
        taskiq_worker("taskiq_cluster_noop"),
        "taskiq-redis RedisStreamClusterBroker, one-shard cluster, 1 process, --max-async-tasks 1000",
    ),
    "dramatiq": (
        enqueue_dramatiq,
        ["-m", "dramatiq", "dramatiq_noop", "--processes", "1", "--threads", "8"],
        "dramatiq RedisBroker, 1 process, 8 threads",
    ),
    "arq": (enqueue_arq, ["-m", "arq", "arq_noop.WorkerSettings"], "arq, 1 process, max_jobs 1000"),
}


def _stop(worker: subprocess.Popen[bytes]) -> None:
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def main() -> int:
    name, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["PEER_REDIS_URL"] = url
    sys.path.insert(0, str(HERE))
    client = redis.Redis.from_url(url)
    client.flushdb()
    enqueue, argv, setup = PEERS[name]
    remaining = enqueue(n)
    env = dict(os.environ, PYTHONPATH=str(HERE))
    # A session of its own: taskiq runs its worker in a child process, and both must go at the end.
    worker = subprocess.Popen(
        [sys.executable, *argv],
        cwd=HERE,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Timed from the first finished job to the last: the worker's start-up is not its throughput.
        while (left := remaining(client)) >= n:
            if worker.poll() is not None:
                raise RuntimeError(f"{name} worker exited with {worker.returncode}")
            time.sleep(0.005)
        start, done_at_start = time.perf_counter(), n - left
        while remaining(client) > 0:
            if worker.poll() is not None:
                raise RuntimeError(f"{name} worker exited with {worker.returncode}")
            time.sleep(0.02)
        seconds = time.perf_counter() - start
    finally:
        _stop(worker)
    print(json.dumps({"peer": name, "setup": setup, "rate": (n - done_at_start) / seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
