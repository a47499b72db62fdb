"""`make bench`: phoenix worker against the floor and the original design's loop, same process, same Valkey.

(a) floor: XREADGROUP COUNT 100 and one XACK per batch, no guarantees;
(b) the original design, one message at a time: XREADGROUP COUNT 1, SET NX, GETEX, SET marker, XADD, XACK, DEL;
(c) `phoenix worker` (a real subprocess) with every guarantee on and a no-op processor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import redis.asyncio as aioredis

from phoenix.embedded import embedded_valkey

ROOT = Path(__file__).resolve().parent.parent
GROUP = "bench-group"


async def fill(client: aioredis.Redis, stream: str, n: int) -> None:
    await client.delete(stream)
    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.xadd(stream, {"record_id": f"r{i}", "user_id": "u1", "data": json.dumps({"i": i})})
        if len(pipe) >= 1000:
            await pipe.execute()
    await pipe.execute()


async def floor(client: aioredis.Redis, n: int) -> float:
    stream = "bench:floor"
    await fill(client, stream, n)
    done = 0
    start = time.perf_counter()
    while done < n:
        reply = await client.xreadgroup(GROUP, "c1", {stream: ">"}, count=100)
        ids = [entry_id for entry_id, _ in reply[0][1]]
        await client.xack(stream, GROUP, *ids)
        done += len(ids)
    return n / (time.perf_counter() - start)


async def original(client: aioredis.Redis, n: int) -> float:
    stream, out = "bench:original", "bench:original:out"
    await fill(client, stream, n)
    start = time.perf_counter()
    for _ in range(n):
        reply = await client.xreadgroup(GROUP, "c1", {stream: ">"}, count=1)
        entry_id, fields = reply[0][1][0]
        record = fields[b"record_id"].decode()
        await client.set(f"lock:orig:{record}", "token", nx=True, ex=600)
        await client.getex(f"processed:orig:{record}", ex=86400)
        await client.set(f"processed:orig:{record}", "1", ex=86400)
        await client.xadd(out, {"record_id": record, "data": fields[b"data"]}, maxlen=100_000, approximate=True)
        await client.xack(stream, GROUP, entry_id)
        await client.delete(f"lock:orig:{record}")
    return n / (time.perf_counter() - start)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def phoenix_worker(
    client: aioredis.Redis, url: str, n: int, concurrency: int
) -> tuple[float, float, float]:
    stream, out = "phoenix:bench:input", "phoenix:bench:output"
    await client.delete(out)
    await fill(client, stream, n)
    env = dict(
        os.environ, SERVICE_NAME="bench", PROCESSOR="bench.noop:NoopProcessor", REDIS_URL=url,
        INPUT_QUEUE=stream, OUTPUT_QUEUE=out, CONSUMER_GROUP=GROUP, CONCURRENCY=str(concurrency),
        HEALTH_PORT="0", LOG_LEVEL="warning", PYTHONPATH=str(ROOT),
    )
    proc = subprocess.Popen([sys.executable, "-m", "phoenix", "worker"], env=env, cwd=ROOT)
    try:
        while not await client.xlen(out):
            await asyncio.sleep(0.001)
        cpu_start = cpu_seconds(proc.pid)
        while await client.xlen(out) < n:
            if proc.poll() is not None:
                raise RuntimeError(f"phoenix worker exited with {proc.returncode}")
            await asyncio.sleep(0.05)
        rss = peak_rss_mb(proc.pid)
        cpu = cpu_seconds(proc.pid) - cpu_start
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # Output ids carry the server's clock at each commit: the first to the last commit is the processing time.
    first, last = await client.xrange(out, count=1), await client.xrevrange(out, count=1)
    ms = lambda entry: int(entry[0][0].decode().partition("-")[0])  # noqa: E731
    seconds = max(ms(last) - ms(first), 1) / 1000
    return n / seconds, rss, cpu / n * 1e6


async def run(n: int, concurrency: int) -> int:
    with embedded_valkey() as url:
        client = aioredis.Redis.from_url(url)
        a = await floor(client, n)
        b = await original(client, n)
        c, rss, cpu_us = await phoenix_worker(client, url, n, concurrency)
        server = await client.info("commandstats")
        await client.aclose()
    print(f"messages: {n}, one embedded Valkey, no-op processor")
    print(f"(a) floor, XREADGROUP COUNT 100 + XACK/batch : {a:10,.0f} msg/s")
    print(f"(b) original design, one message at a time   : {b:10,.0f} msg/s")
    print(f"(c) phoenix worker, CONCURRENCY={concurrency:<4}         : {c:10,.0f} msg/s  peak RSS {rss:.0f} MiB, "
          f"worker CPU {cpu_us:.0f} us/msg, Redis scripts {server['cmdstat_evalsha']['usec'] / n:.0f} us/msg")
    print(f"ratios: c/a = {c / a:.2f} (target >= 0.25)   c/b = {c / b:.1f}x (target >= 20x)")
    return 0 if c / a >= 0.25 and c / b >= 20 else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=200)
    args = p.parse_args()
    return asyncio.run(run(args.messages, args.concurrency))


if __name__ == "__main__":
    sys.exit(main())
