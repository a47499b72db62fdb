"""`make bench`: phoenix worker against the floor and the original design's loop, same process, same Valkey.

(a) floor: XREADGROUP COUNT 100 and one XACK per batch, no guarantees;
(b) the original design, one message at a time: XREADGROUP COUNT 1, SET NX, GETEX, SET marker, XADD, XACK, DEL;
(c) `phoenix worker` (a real subprocess) with every guarantee on and a no-op processor, and the same with a
    no-op batch processor (process_batch);
with --peers-python, also the no-op workers of taskiq-redis, dramatiq and arq (bench/peers/, in their own
virtualenv) on the same Valkey.
(c0) the same worker with input trimming and output backpressure off (TRIM_INTERVAL one day,
     OUTPUT_HIGH_WATER=0): what those cost is 1 - c/c0.
(ct) the same worker tracing every message (OTEL_TRACES_SAMPLER=always_on), its spans exported over OTLP/HTTP to a
     sink in this process that reads and drops them: what tracing costs per message is ct's CPU - c's.
(cs) the same with tracing on at the workers' default sampling (OTEL_TRACES_SAMPLER unset: 1% of new traces).
With --compare-with DIR, a checkout of another commit (`git worktree add ../base <commit>`): its worker, started
from DIR, runs in every round too, and the bench prints how this worker's CPU and Redis time per message compare.
(d1) the same worker (process()) on a Redis Cluster of one shard (one node holding every slot), right after (c) in
     every round, and (a1) the floor on that cluster right before it: the cluster costs Redis no more than 10% more
     per message than standalone (Valkey process CPU, same round), or no more than 10 points over what it costs the
     floor (Valkey's own cost of cluster mode). --cluster-only runs (a), (c), (a1) and (d1) alone, standalone and
     cluster first in turn.
(d3) the same worker on a cluster of 3 shards, the stage and the next in 8 partitions (each forward in its
     commit, in the record's slot): the Valkey CPU of each shard per message, to show the load spread.
(a), (c0), (c) and (d1) run in rounds, each (c) right after its (a), and report medians, ratios per round; (b) and
the peers are slow enough to be steady in one.
Redis time per message is Valkey's own count (INFO commandstats: scripts plus reads) and its process CPU
(INFO cpu), both taken over the worker's run only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer

from phoenix.embedded import embedded_valkey
from phoenix.keys import StageKeys
from phoenix.producer import Producer, Record
from phoenix.redis_spec import RedisSpec, connect
from tests.fixtures.valkey_cluster import single_node_cluster, valkey_cluster

ROOT = Path(__file__).resolve().parent.parent
GROUP = "bench-group"
# Each round runs these workers: (processor, extra environment).
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "process": ("bench.noop:NoopProcessor", {}),
    "batch": ("bench.noop:BatchNoopProcessor", {}),
    # (c0): no background trimming within the run, no backpressure measurement.
    "untrimmed": ("bench.noop:NoopProcessor", {"TRIM_INTERVAL": "86400", "OUTPUT_HIGH_WATER": "0"}),
    # (cl): a stage limit and a per-user limit far above the rate: the limiter's cost alone (issue 34).
    "limited": (
        "bench.noop:NoopProcessor",
        {"RATE_LIMITS": json.dumps([{"rate": 1_000_000, "burst": 1_000_000}, {"rate": 1_000_000, "scope": "user"}])},
    ),
}
# (ct): every message traced. The span queue holds a whole run, so that spans are exported rather than dropped and
# the exporter's work is in the figure too (a production stage this fast samples, or raises the queue likewise).
TRACED_ENV = {
    "OTEL_TRACES_SAMPLER": "always_on",
    "OTEL_BSP_MAX_QUEUE_SIZE": "1000000",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2048",
    "OTEL_BSP_SCHEDULE_DELAY": "200",
}
# The worker's environment on a cluster.
CLUSTER_ENV = {"REDIS_MODE": "cluster"}
# (d3): primaries of the cluster, partitions of the stage and of the next (8 slots over 3 shards: 3, 3, 2 or so).
SHARDS, SHARD_PARTITIONS = 3, 8
# Commands of trimming and backpressure (run by trim.lua and the measuring job), counted apart.
TRIM_COMMANDS = {"cmdstat_xtrim", "cmdstat_xinfo|groups", "cmdstat_xpending", "cmdstat_type"}


async def fill(client: aioredis.Redis, stream: str, n: int) -> None:
    await client.delete(stream)
    await client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    await Producer(client, stream=stream).send_many(records(n))


# redis-py's replies of a bytes client, as typed for the reads below (its own hints cover every client kind).
Entries = list[tuple[bytes, dict[bytes, bytes]]]
GroupRead = list[tuple[bytes, Entries]]


def records(n: int) -> Iterator[Record]:
    return (Record(f"r{i}", {"i": i}, "u1") for i in range(n))


@dataclass
class FloorRun:
    rate: float
    redis_cpu_us_per_msg: float


async def floor(client: aioredis.Redis, n: int) -> FloorRun:
    stream = "bench:floor"
    await fill(client, stream, n)
    done = 0
    redis_cpu_start = await _redis_cpu(client)
    start = time.perf_counter()
    while done < n:
        reply = cast(GroupRead, await client.xreadgroup(GROUP, "c1", {stream: ">"}, count=100))
        ids = [entry_id for entry_id, _ in reply[0][1]]
        await client.xack(stream, GROUP, *ids)
        done += len(ids)
    rate = n / (time.perf_counter() - start)
    return FloorRun(rate, (await _redis_cpu(client) - redis_cpu_start) / n * 1e6)


async def original(client: aioredis.Redis, n: int) -> float:
    stream, out = "bench:original", "bench:original:out"
    await fill(client, stream, n)
    start = time.perf_counter()
    for _ in range(n):
        reply = cast(GroupRead, await client.xreadgroup(GROUP, "c1", {stream: ">"}, count=1))
        entry_id, fields = reply[0][1][0]
        record = fields[b"record_id"].decode()
        await client.set(f"lock:orig:{record}", "token", nx=True, ex=600)
        await client.getex(f"processed:orig:{record}", ex=86400)
        await client.set(f"processed:orig:{record}", "1", ex=86400)
        await client.xadd(out, {"record_id": record, "data": fields[b"data"]}, maxlen=100_000, approximate=True)
        await client.xack(stream, GROUP, entry_id)
        await client.delete(f"lock:orig:{record}")
    return n / (time.perf_counter() - start)


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _proc_stat(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MiB) of a running process, from /proc."""
    cpu = sum(cpu_times(pid))
    hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return cpu, int(hwm.split()[1]) / 1024


@dataclass
class WorkerRun:
    rate: float
    peak_rss_mb: float
    cpu_us_per_msg: float
    script_us_per_msg: float
    read_us_per_msg: float
    redis_cpu_us_per_msg: float
    trim_us_per_msg: float  # of the scripts' and reads' time: trimming and backpressure commands (trim.lua too)


async def _redis_cpu(client: aioredis.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# (c)'s stage: its input, filled before the worker starts, and its output.
INPUT, OUTPUT = "phoenix:{default}:bench:input", "phoenix:{default}:bench:output"


def bench_stage(extra_env: Mapping[str, str]) -> dict[str, str]:
    """(c)'s stage's settings, with `extra_env` over them."""
    return {"INPUT_QUEUE": INPUT, "OUTPUT_QUEUE": OUTPUT, **extra_env}


def worker_env(
    url: str, service: str, processor: str, concurrency: int, log_level: str, stage: Mapping[str, str]
) -> dict[str, str]:
    """The environment of a bench's `phoenix worker`, with its `stage`'s settings."""
    return dict(
        os.environ,
        SERVICE_NAME=service,
        PROCESSOR=processor,
        REDIS_URL=url,
        CONSUMER_GROUP=GROUP,
        CONCURRENCY=str(concurrency),
        HEALTH_PORT="0",
        LOG_LEVEL=log_level,
        **stage,
    )


async def start_worker(env: dict[str, str], root: Path = ROOT) -> asyncio.subprocess.Process:
    """`phoenix worker` from the source tree `root`. Logs go to /dev/null: a terminal's speed is not the worker's."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "phoenix",
        "worker",
        env={**env, "PYTHONPATH": str(root)},
        cwd=root,
        stdout=asyncio.subprocess.DEVNULL,
    )


async def phoenix_worker(
    client: aioredis.Redis,
    url: str,
    n: int,
    concurrency: int,
    log_level: str,
    processor: str,
    extra_env: dict[str, str],
    root: Path = ROOT,
) -> WorkerRun:
    """`phoenix worker` started from the source tree `root`, over n messages."""
    await client.flushdb()
    await fill(client, INPUT, n)
    await client.config_resetstat()
    env = worker_env(url, "bench", processor, concurrency, log_level, bench_stage(extra_env))
    proc = await start_worker(env, root)
    try:
        while not await client.xlen(OUTPUT):
            await asyncio.sleep(0.001)
        cpu_start, _ = _proc_stat(proc.pid)
        redis_cpu_start = await _redis_cpu(client)
        while await client.xlen(OUTPUT) < n:
            if proc.returncode is not None:
                raise RuntimeError(f"phoenix worker exited with {proc.returncode}")
            await asyncio.sleep(0.02)
        cpu_end, rss = _proc_stat(proc.pid)
        redis_cpu = await _redis_cpu(client) - redis_cpu_start
    finally:
        proc.terminate()
        await proc.wait()
    # Output ids carry the server's clock at each commit: first to last commit is the processing time.
    first = cast(Entries, await client.xrange(OUTPUT, count=1))
    last = cast(Entries, await client.xrevrange(OUTPUT, count=1))
    seconds = max(_id_ms(last[0][0]) - _id_ms(first[0][0]), 1) / 1000
    stats = await client.info("commandstats")
    scripts, reads = stats["cmdstat_evalsha"]["usec"], stats["cmdstat_xreadgroup"]["usec"]
    trim = sum(c["usec"] for name, c in stats.items() if name in TRIM_COMMANDS)
    return WorkerRun(
        n / seconds, rss, (cpu_end - cpu_start) / n * 1e6, scripts / n, reads / n, redis_cpu / n * 1e6, trim / n
    )


@dataclass
class ShardedRun:
    rate: float
    shard_cpu_us_per_msg: list[float]  # Valkey process CPU of each primary over the run, per message of the run


async def sharded_worker(
    url: str, ports: list[int], n: int, concurrency: int, log_level: str, partitions: int
) -> ShardedRun:
    """`phoenix worker` with REDIS_MODE=cluster over a stage of `partitions` partitions that forwards to a next
    stage of as many, on the cluster whose primaries listen on `ports`."""
    stage = StageKeys.for_stage("bench", partitions=partitions)
    out = StageKeys.for_stage("bench-out", partitions=partitions)
    client = connect(RedisSpec.from_url(url, mode="cluster"), decode_responses=False)
    nodes = [aioredis.Redis(host="127.0.0.1", port=port) for port in ports]
    try:
        for lane in stage.lanes:
            await client.xgroup_create(lane.input, GROUP, id="0", mkstream=True)
        await Producer(client, "bench", partitions=partitions).send_many(records(n))
        env = worker_env(
            url,
            "bench",
            VARIANTS["process"][0],
            concurrency,
            log_level,
            {
                "OUTPUT_QUEUE": out.input,
                "OUTPUT_PARTITIONS": str(partitions),
                "PARTITIONS": str(partitions),
                **CLUSTER_ENV,
            },
        )
        cpu_start = [await _redis_cpu(node) for node in nodes]
        start = time.perf_counter()
        proc = await start_worker(env)
        try:
            while sum([await client.xlen(lane.input) for lane in out.lanes]) < n:
                if proc.returncode is not None:
                    raise RuntimeError(f"phoenix worker exited with {proc.returncode}")
                await asyncio.sleep(0.05)
            seconds = time.perf_counter() - start
            cpu = [await _redis_cpu(node) - before for node, before in zip(nodes, cpu_start, strict=True)]
        finally:
            proc.terminate()
            await proc.wait()
    finally:
        await client.aclose()
        for node in nodes:
            await node.aclose()
    # Wall clock from the worker's start (its startup included): the rate is indicative; the CPU split is the point.
    return ShardedRun(n / seconds, [c / n * 1e6 for c in cpu])


def _id_ms(entry_id: bytes) -> int:
    return int(entry_id.decode().partition("-")[0])


def peer_rates(peers_python: str, url: str, cluster_url: str, n: int) -> list[dict[str, Any]]:
    """Each peer's no-op worker on the same Valkey (taskiq's cluster broker on the same one-shard cluster as (d1)),
    through bench/peers/driver.py in the peers' virtualenv."""
    rates = []
    for peer, peer_url in (("taskiq", url), ("taskiq-cluster", cluster_url), ("dramatiq", url), ("arq", url)):
        done = subprocess.run(
            [peers_python, str(ROOT / "bench" / "peers" / "driver.py"), peer, peer_url, str(n)],
            capture_output=True,
            text=True,
            check=True,
            timeout=1800,
        )
        rates.append(json.loads(done.stdout.splitlines()[-1]))
    return rates


def median_run(runs: list[WorkerRun]) -> WorkerRun:
    rate = statistics.median_high([r.rate for r in runs])
    return next(r for r in runs if r.rate == rate)


def redis_us(run: WorkerRun) -> float:
    return run.script_us_per_msg + run.read_us_per_msg


def describe(runs: list[WorkerRun]) -> str:
    run = median_run(runs)
    return (
        f"{run.rate:10,.0f} msg/s  (rounds: {', '.join(f'{r.rate:,.0f}' for r in runs)})\n"
        f"    worker: peak RSS {run.peak_rss_mb:.0f} MiB, CPU {run.cpu_us_per_msg:.0f} us/msg;  Redis per message: "
        f"{redis_us(run):.1f} us (scripts {run.script_us_per_msg:.1f} + reads "
        f"{run.read_us_per_msg:.1f}), Valkey process CPU {run.redis_cpu_us_per_msg:.1f} us"
    )


def per_redis_core(us_per_msg: float) -> str:
    """Records a second one Valkey core serves at this CPU per message: the ceiling of a stage whatever its workers
    do (a shard's, on a cluster)."""
    return f"{1e6 / us_per_msg:,.0f}" if us_per_msg > 0 else "-"


def compared(mine: list[WorkerRun], theirs: list[WorkerRun]) -> str:
    """This worker against the other checkout's, per message: medians of the rounds."""

    def change(figure: Callable[[WorkerRun], float]) -> str:
        ours, other = (statistics.median(figure(r) for r in runs) for runs in (mine, theirs))
        return f"{other:.1f} -> {ours:.1f} us ({ours / other - 1:+.0%})"

    return (
        f"worker CPU {change(lambda r: r.cpu_us_per_msg)}, Redis time {change(redis_us)} (target -33%), "
        f"Valkey CPU {change(lambda r: r.redis_cpu_us_per_msg)}"
    )


class OtlpSink:
    """Accepts OTLP/HTTP exports and drops them, counting what came: the cheapest collector there is."""

    def __init__(self) -> None:
        self.bytes = 0

    async def traces(self, request: web.Request) -> web.Response:
        self.bytes += len(await request.read())
        return web.Response(content_type="application/x-protobuf")  # an empty ExportTraceServiceResponse


def traced_cost(plain: list[WorkerRun], traced: list[WorkerRun], exported: int, messages: int) -> str:
    """What tracing every message adds: worker CPU per message (medians of the rounds) and the OTLP bytes sent."""
    ours, base = (statistics.median(r.cpu_us_per_msg for r in runs) for runs in (traced, plain))
    rate = median_run(traced).rate / median_run(plain).rate
    return (
        f"+{ours - base:.0f} us worker CPU ({base:.0f} -> {ours:.0f} us, {ours / base - 1:+.0%}), "
        f"throughput x{rate:.2f}, {exported / messages:.0f} bytes of OTLP exported"
    )


@dataclass
class ClusterRounds:
    """(a), (c), (a1) and (d1) of each round: the floor and the worker on standalone Valkey and on the one-shard
    cluster, for the cluster's cost to Phoenix beside its cost to Valkey alone."""

    floors: list[FloorRun] = field(default_factory=list)
    workers: list[WorkerRun] = field(default_factory=list)
    cluster_floors: list[FloorRun] = field(default_factory=list)
    cluster_workers: list[WorkerRun] = field(default_factory=list)

    def report(self) -> list[str]:
        """Valkey CPU per message, cluster over standalone, per round (each pair ran in the same round): the
        worker's, the floor's, and the ratio of the two ratios, with their spread over the rounds."""
        pairs = zip(self.workers, self.cluster_workers, strict=True)
        worker = [c.redis_cpu_us_per_msg / s.redis_cpu_us_per_msg for s, c in pairs]
        floor_pairs = zip(self.floors, self.cluster_floors, strict=True)
        floor = [c.redis_cpu_us_per_msg / s.redis_cpu_us_per_msg for s, c in floor_pairs]
        of_ratios = [w / f for w, f in zip(worker, floor, strict=True)]

        def spread(ratios: list[float]) -> str:
            each = ", ".join(f"{r:.2f}" for r in ratios)
            return f"median {statistics.median(ratios):.3f} (min {min(ratios):.2f}, max {max(ratios):.2f}; {each})"

        commands = [redis_us(c) / redis_us(s) for s, c in zip(self.workers, self.cluster_workers, strict=True)]
        phoenix_over, floor_over = statistics.median(worker) - 1, statistics.median(floor) - 1
        met = phoenix_over <= 0.10 or phoenix_over <= floor_over + 0.10
        rate = statistics.median(f.rate for f in self.cluster_floors)
        floor_cpu, cluster_cpu = (
            statistics.median(f.redis_cpu_us_per_msg for f in runs) for runs in (self.floors, self.cluster_floors)
        )
        return [
            f"(a1) floor on the one-shard cluster        : {rate:10,.0f} msg/s; Valkey CPU per message: floor "
            f"{floor_cpu:.1f} us standalone, {cluster_cpu:.1f} us on the cluster",
            f"    Valkey CPU per message, one-shard cluster / standalone, {len(worker)} rounds:",
            f"      phoenix worker (d1/c): {spread(worker)}",
            f"      floor (a1/a):          {spread(floor)}",
            f"      ratio of ratios:       {spread(of_ratios)}",
            f"      the worker's commands' time (Valkey's count, not its CPU): {spread(commands)}",
            f"    target (the worker's cluster overhead within +10%, or within the floor's {floor_over:+.1%} + 10 "
            f"points): {phoenix_over:+.1%} -> {'met' if met else 'NOT met'}",
        ]


async def run(
    n: int, concurrency: int, rounds: int, log_level: str, peers_python: str | None, other: Path | None
) -> int:
    floors: list[FloorRun] = []
    runs: dict[str, list[WorkerRun]] = {name: [] for name in VARIANTS}
    traced: list[WorkerRun] = []
    sampled: list[WorkerRun] = []
    traced_bytes = 0  # of the sink's, what (ct) sent
    theirs: list[WorkerRun] = []
    sink = OtlpSink()
    app = web.Application()
    app.router.add_post("/v1/traces", sink.traces)
    one_shard: list[WorkerRun] = []
    cluster_floors: list[FloorRun] = []
    with embedded_valkey() as url, single_node_cluster() as cluster_url:
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        sampled_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.port}"}
        traced_env = {**TRACED_ENV, **sampled_env}
        client = aioredis.Redis.from_url(url)
        # One node holds every slot, so a plain client reaches every key (the worker uses its cluster client).
        cluster_client = aioredis.Redis.from_url(cluster_url)
        b = await original(client, n)
        # Each round runs the floor right before the workers, and ratios are taken per round: on a shared
        # machine the load drifts over minutes, and a floor measured in a quiet minute skews every ratio.
        for _ in range(rounds):
            floors.append(await floor(client, n))
            for name, (processor, env) in VARIANTS.items():
                runs[name].append(await phoenix_worker(client, url, n, concurrency, log_level, processor, env))
            noop = VARIANTS["process"][0]
            before = sink.bytes
            traced.append(await phoenix_worker(client, url, n, concurrency, log_level, noop, traced_env))
            traced_bytes += sink.bytes - before
            sampled.append(await phoenix_worker(client, url, n, concurrency, log_level, noop, sampled_env))
            cluster_floors.append(await floor(cluster_client, n))
            one_shard.append(
                await phoenix_worker(cluster_client, cluster_url, n, concurrency, log_level, noop, CLUSTER_ENV)
            )
            if other:
                theirs.append(await phoenix_worker(client, url, n, concurrency, log_level, noop, {}, other))
        await client.aclose()
        await cluster_client.aclose()
        await server.close()
        peers = peer_rates(peers_python, url, cluster_url, n) if peers_python else []
    with valkey_cluster(SHARDS, replicas_each=0) as cluster:
        sharded = await sharded_worker(cluster.url, cluster.primaries(), n, concurrency, log_level, SHARD_PARTITIONS)
    a = statistics.median(f.rate for f in floors)
    c = median_run(runs["process"]).rate
    ratio, batch_ratio = (
        statistics.median(r.rate / f.rate for r, f in zip(runs[k], floors, strict=True)) for k in ("process", "batch")
    )
    print(
        f"messages: {n}, one embedded Valkey, no-op processors, {rounds} rounds of (a) then (c), medians, "
        f"CONCURRENCY={concurrency}, LOG_LEVEL={log_level}"
    )
    print(
        f"(a) floor, XREADGROUP COUNT 100 + XACK/batch : {a:10,.0f} msg/s  "
        f"(rounds: {', '.join(f'{f.rate:,.0f}' for f in floors)})"
    )
    print(f"(b) original design, one message at a time   : {b:10,.0f} msg/s")
    print(f"(c) phoenix worker, process()                : {describe(runs['process'])}")
    print(f"(c) phoenix worker, process_batch()          : {describe(runs['batch'])}")
    c0 = median_run(runs["untrimmed"]).rate
    print(f"(c0) process() without trimming/backpressure : {describe(runs['untrimmed'])}")
    cl = median_run(runs["limited"]).rate
    print(f"(cl) process(), two rate limits far above    : {describe(runs['limited'])}")
    print(f"    rate limits (target <= 10% of c): 1 - cl/c = {1 - cl / c:.1%} (noisy on a loaded machine)")
    print(f"(ct) process(), every message traced       : {describe(traced)}")
    messages = n * rounds
    print(f"    tracing at 100% sampling, per message: {traced_cost(runs['process'], traced, traced_bytes, messages)}")
    print(f"(cs) process(), default sampling (1%)      : {describe(sampled)}")
    print(
        f"    tracing at the default sampling, per message (target within +5%): "
        f"{traced_cost(runs['process'], sampled, sink.bytes - traced_bytes, messages)}"
    )
    print(f"(d1) process() on a one-shard Redis Cluster  : {describe(one_shard)}")
    for line in ClusterRounds(floors, runs["process"], cluster_floors, one_shard).report():
        print(line)
    total = sum(sharded.shard_cpu_us_per_msg)
    spread = ", ".join(f"{us:.1f} us ({us / total:.0%})" for us in sharded.shard_cpu_us_per_msg)
    print(
        f"(d3) process() on {SHARDS} shards, {SHARD_PARTITIONS} partitions: {sharded.rate:10,.0f} msg/s (from the "
        f"worker's start); Valkey CPU per message by shard: {spread}"
    )
    print(
        "records/s per Redis core (1 s / Valkey CPU per message): standalone "
        f"{per_redis_core(median_run(runs['process']).redis_cpu_us_per_msg)}, one-shard cluster "
        f"{per_redis_core(median_run(one_shard).redis_cpu_us_per_msg)}, the busiest of {SHARDS} shards "
        f"{per_redis_core(max(sharded.shard_cpu_us_per_msg))}"
    )
    if other:
        print(f"(c) {other}, process(): {describe(theirs)}")
        print(f"    this worker vs that one, per message: {compared(runs['process'], theirs)}")
    for peer in peers:
        print(f"    peer {peer['setup']:<64}: {peer['rate']:10,.0f} msg/s")
    # Issue 9's targets: 0.30 at CONCURRENCY=1000 and LOG_LEVEL=warning, 0.20 with a log line per message.
    target = 0.30 if log_level in ("warning", "error") else 0.20
    print(
        f"ratios (median of the rounds' own): c/a = {ratio:.2f} (target >= {target:.2f}), "
        f"batch c/a = {batch_ratio:.2f}, c/b = {c / b:.1f}x (target >= 20x)"
    )
    trim_us = statistics.median(r.trim_us_per_msg for r in runs["process"])
    print(
        f"trimming + backpressure (target <= 10% of c): 1 - c/c0 = {1 - c / c0:.1%} (noisy on a loaded machine); "
        f"their own Redis commands {trim_us:.2f} us/msg"
    )
    if peers:
        best = max(peers, key=lambda p: p["rate"])
        print(
            f"        c / best peer ({best['peer']}) = {c / best['rate']:.1f}x, "
            f"batch c / best peer = {median_run(runs['batch']).rate / best['rate']:.1f}x"
        )
    return 0


async def cluster_rounds(n: int, concurrency: int, rounds: int, log_level: str) -> int:
    """--cluster-only: (a) and (c) on standalone Valkey, (a1) and (d1) on the one-shard cluster, in every round,
    which of the two goes first alternating."""
    measured = ClusterRounds()
    noop = VARIANTS["process"][0]
    with embedded_valkey() as url, single_node_cluster() as cluster_url:
        client = aioredis.Redis.from_url(url)
        cluster_client = aioredis.Redis.from_url(cluster_url)

        async def standalone() -> None:
            measured.floors.append(await floor(client, n))
            measured.workers.append(await phoenix_worker(client, url, n, concurrency, log_level, noop, {}))

        async def cluster() -> None:
            measured.cluster_floors.append(await floor(cluster_client, n))
            measured.cluster_workers.append(
                await phoenix_worker(cluster_client, cluster_url, n, concurrency, log_level, noop, CLUSTER_ENV)
            )

        for number in range(rounds):
            for side in (standalone, cluster) if number % 2 == 0 else (cluster, standalone):
                await side()
        await client.aclose()
        await cluster_client.aclose()
    print(
        f"messages: {n}, {rounds} rounds of standalone (a, c) and one-shard cluster (a1, d1), first in turn, "
        f"CONCURRENCY={concurrency}, LOG_LEVEL={log_level}; load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"(a) floor, standalone                    : {statistics.median(f.rate for f in measured.floors):10,.0f} msg/s"
    )
    print(f"(c) phoenix worker, process()            : {describe(measured.workers)}")
    print(f"(d1) process() on a one-shard Redis Cluster: {describe(measured.cluster_workers)}")
    for line in measured.report():
        print(line)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--peers-python", help="python of a virtualenv with bench/peers/peers-requirements.txt")
    p.add_argument("--compare-with", type=Path, help="a checkout of another commit, whose worker runs alongside")
    p.add_argument("--cluster-only", action="store_true", help="only (a), (c), (a1) and (d1): the cluster's cost")
    args = p.parse_args()
    if args.cluster_only:
        return asyncio.run(cluster_rounds(args.messages, args.concurrency, args.rounds, args.log_level))
    return asyncio.run(
        run(args.messages, args.concurrency, args.rounds, args.log_level, args.peers_python, args.compare_with)
    )


if __name__ == "__main__":
    sys.exit(main())
