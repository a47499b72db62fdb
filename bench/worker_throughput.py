"""`make bench`: phoenix worker against the floor and the original design's loop, same process, same Valkey.

(a) floor: XREADGROUP COUNT 100 and one XACK per batch, no guarantees;
(b) the original design, one message at a time: XREADGROUP COUNT 1, SET NX, GETEX, SET marker, XADD, XACK, DEL;
(c) `phoenix worker` (a real subprocess) with every guarantee on and a no-op processor;
(c0) the same worker with input trimming and output backpressure off (TRIM_INTERVAL one day,
     OUTPUT_HIGH_WATER=0): what those cost is 1 - c/c0. Rounds of (c0) and (c) alternate, so load on the
     machine hits both alike.
(a), (c0) and (c) run several rounds and report the median; (b) is slow enough to be steady in one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
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


def _proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MiB) of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return cpu, int(hwm.split()[1]) / 1024


@dataclass
class WorkerRun:
    rate: float
    peak_rss_mb: float
    cpu_us_per_msg: float
    script_us_per_msg: float
    redis_us_per_msg: float  # every command Redis ran for the worker, scripts included
    trim_us_per_msg: float  # of which the commands of trimming and backpressure (inside trim.lua too)


# (c0): no background trimming within the run, no backpressure measurement.
WITHOUT_TRIMMING = {"TRIM_INTERVAL": "86400", "OUTPUT_HIGH_WATER": "0"}


async def phoenix_worker(
    client: aioredis.Redis, url: str, n: int, concurrency: int, log_level: str, extra_env: dict[str, str]
) -> WorkerRun:
    stream, out = "phoenix:bench:input", "phoenix:bench:output"
    await client.delete(out)
    await client.flushdb()
    await fill(client, stream, n)
    await client.config_resetstat()
    env = dict(
        os.environ, SERVICE_NAME="bench", PROCESSOR="bench.noop:NoopProcessor", REDIS_URL=url,
        INPUT_QUEUE=stream, OUTPUT_QUEUE=out, CONSUMER_GROUP=GROUP, CONCURRENCY=str(concurrency),
        HEALTH_PORT="0", LOG_LEVEL=log_level, PYTHONPATH=str(ROOT), **extra_env,
    )
    # Logs go to /dev/null: a terminal's speed is not the worker's.
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "phoenix", "worker", env=env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL
    )
    try:
        while not await client.xlen(out):
            await asyncio.sleep(0.001)
        cpu_start, _ = _proc_stat(proc.pid)
        while await client.xlen(out) < n:
            if proc.returncode is not None:
                raise RuntimeError(f"phoenix worker exited with {proc.returncode}")
            await asyncio.sleep(0.02)
        cpu_end, rss = _proc_stat(proc.pid)
    finally:
        proc.terminate()
        await proc.wait()
    # Output ids carry the server's clock at each commit: first to last commit is the processing time.
    first, last = await client.xrange(out, count=1), await client.xrevrange(out, count=1)
    seconds = max(_id_ms(last[0][0]) - _id_ms(first[0][0]), 1) / 1000
    stats = await client.info("commandstats")
    # XLEN and XRANGE are mostly this loop's own polling; commands run by scripts are counted as well as the script.
    inner = {"cmdstat_xtrim", "cmdstat_xinfo|groups", "cmdstat_xpending", "cmdstat_type"}
    redis_us = sum(c["usec"] for name, c in stats.items()
                   if name not in inner and name not in ("cmdstat_xrange", "cmdstat_xlen"))
    trim_us = sum(c["usec"] for name, c in stats.items() if name in inner)
    return WorkerRun(n / seconds, rss, (cpu_end - cpu_start) / n * 1e6, stats["cmdstat_evalsha"]["usec"] / n,
                     redis_us / n, trim_us / n)


def _id_ms(entry_id: bytes) -> int:
    return int(entry_id.decode().partition("-")[0])


async def run(n: int, concurrency: int, rounds: int, log_level: str) -> int:
    with embedded_valkey() as url:
        client = aioredis.Redis.from_url(url)
        a = statistics.median([await floor(client, n) for _ in range(rounds)])
        b = await original(client, n)
        runs, untrimmed = [], []
        for _ in range(rounds):
            untrimmed.append(await phoenix_worker(client, url, n, concurrency, log_level, WITHOUT_TRIMMING))
            runs.append(await phoenix_worker(client, url, n, concurrency, log_level, {}))
        await client.aclose()
    c = statistics.median_high([r.rate for r in runs])
    c0 = statistics.median_high([r.rate for r in untrimmed])

    median_run = next(r for r in runs if r.rate == c)
    print(f"messages: {n}, one embedded Valkey, no-op processor, median of {rounds} rounds for (a) and (c)")
    print(f"(a) floor, XREADGROUP COUNT 100 + XACK/batch : {a:10,.0f} msg/s")
    print(f"(b) original design, one message at a time   : {b:10,.0f} msg/s")
    print(f"(c) phoenix worker, CONCURRENCY={concurrency:<5}        : {c:10,.0f} msg/s  "
          f"(rounds: {', '.join(f'{r.rate:,.0f}' for r in runs)})")
    print(f"(c0) the same without trimming/backpressure  : {c0:10,.0f} msg/s  "
          f"(rounds: {', '.join(f'{r.rate:,.0f}' for r in untrimmed)})")
    print(f"    worker peak RSS {median_run.peak_rss_mb:.0f} MiB, worker CPU {median_run.cpu_us_per_msg:.0f} us/msg, "
          f"Redis Lua time {median_run.script_us_per_msg:.0f} us/msg, LOG_LEVEL={log_level}")
    print(f"ratios: c/a = {c / a:.2f} (target >= 0.25)   c/b = {c / b:.1f}x (target >= 20x)")
    trim_share = statistics.median(r.trim_us_per_msg / r.redis_us_per_msg for r in runs)
    print(f"trimming + backpressure cost (target <= 10% of c): throughput 1 - c/c0 = {1 - c / c0:.1%}; "
          f"their own Redis commands {statistics.median(r.trim_us_per_msg for r in runs):.2f} us/msg = "
          f"{trim_share:.1%} of the worker's Redis time (the throughput ratio is noisy on a loaded machine)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = p.parse_args()
    return asyncio.run(run(args.messages, args.concurrency, args.rounds, args.log_level))


if __name__ == "__main__":
    sys.exit(main())
