"""`make bench-latency`: the end-to-end latency of a three-stage pipeline at a fixed offered load.

Three `phoenix worker` processes with bench/noop.py's no-op processor, chained on the embedded Valkey (lat-1's
output is lat-2's input, lat-2's is lat-3's; lat-3 writes to a stream nobody reads, with OUTPUT_HIGH_WATER=0 so
that it never pauses for it). Then:

1. the maximum sustainable rate: --saturate records written at once into lat-1's input, and the rate at which the
   last stage commits them (its first to its last commit); then that rate offered open loop for a few seconds, as
   below, and the rate the last stage commits at meanwhile (the producer's own cost included, as in the runs
   below): the lower of the two is the maximum;
2. an open-loop producer at 50%, then 90%, of that rate for --seconds each: records are written on a fixed
   timetable whatever the pipeline does, each stamped `entered_at` as it is written. A record's latency runs from
   its entered_at to the last stage's commit (the id of its entry in lat-3's output: the server's clock, in
   milliseconds, like entered_at). p50, p99 and p99.9 of each run, and the rate it achieved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis

from bench.worker_throughput import GROUP, VARIANTS, Entries, start_worker, worker_env
from phoenix.embedded import embedded_valkey
from phoenix.keys import StageKeys
from phoenix.producer import Producer, Record

STAGES = [StageKeys.for_stage(f"lat-{i}") for i in (1, 2, 3)]
SINK = StageKeys.for_stage("lat-sink").input
LOADS = (0.5, 0.9)
# The producer's timetable is kept this finely: at 1,000 records/s a tick writes 2.
TICK_SECONDS = 0.002
READ_CHUNK = 10_000
SUSTAIN_SECONDS = 6.0


@dataclass(frozen=True)
class LatencyRun:
    offered: float  # records/s asked
    achieved: float  # records/s the producer wrote
    latencies_ms: list[int]  # in the order of the last stage's commits

    def describe(self) -> str:
        cuts = statistics.quantiles(self.latencies_ms, n=1000, method="inclusive")
        p50, p99, p999 = statistics.median(self.latencies_ms), cuts[989], cuts[998]
        # A rate over what the pipeline sustains shows as a latency growing through the run.
        fifth = len(self.latencies_ms) // 5
        first, last = (statistics.median(part) for part in (self.latencies_ms[:fifth], self.latencies_ms[-fifth:]))
        return (
            f"offered {self.offered:7,.0f}/s, achieved {self.achieved:7,.0f}/s, {len(self.latencies_ms):,} records: "
            f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, p99.9 {p999:.0f} ms, max {max(self.latencies_ms)} ms "
            f"(p50 of the first fifth {first:.0f} ms, of the last {last:.0f} ms)"
        )


def _id_ms(entry_id: bytes) -> int:
    return int(entry_id.partition(b"-")[0])


async def committed_since(client: aioredis.Redis, after: bytes) -> Entries:
    """The last stage's output entries after the id `after`, in order."""
    entries: Entries = []
    while chunk := cast(Entries, await client.xrange(SINK, min=b"(" + after, count=READ_CHUNK)):
        entries += chunk
        after = chunk[-1][0]
    return entries


async def last_id(client: aioredis.Redis) -> bytes:
    last = cast(Entries, await client.xrevrange(SINK, count=1))
    return last[0][0] if last else b"0-0"


async def wait_for(client: aioredis.Redis, count: int, workers: list[asyncio.subprocess.Process]) -> None:
    """Until the last stage's output holds `count` entries."""
    while await client.xlen(SINK) < count:
        if any(w.returncode is not None for w in workers):
            raise RuntimeError("a phoenix worker exited")
        await asyncio.sleep(0.05)


async def saturate(
    client: aioredis.Redis, producer: Producer, n: int, workers: list[asyncio.subprocess.Process]
) -> float:
    """Records per second the pipeline finishes with `n` waiting at once at its start."""
    before, after = await client.xlen(SINK), await last_id(client)
    await producer.send_many(Record(f"max-{i}", {"i": i}) for i in range(n))
    await wait_for(client, before + n, workers)
    ids = [entry_id for entry_id, _ in await committed_since(client, after)]
    return n / max(_id_ms(ids[-1]) - _id_ms(ids[0]), 1) * 1000


async def sustained(
    client: aioredis.Redis, producer: Producer, rate: float, workers: list[asyncio.subprocess.Process]
) -> float:
    """The rate the last stage commits at while `rate` is offered for SUSTAIN_SECONDS, its first second left out
    (the pipeline filling)."""
    before, after = await client.xlen(SINK), await last_id(client)
    start_ms = time.time() * 1000
    await offer(producer, "sustain", rate, SUSTAIN_SECONDS)
    end_ms = time.time() * 1000
    await wait_for(client, before + round(rate * SUSTAIN_SECONDS), workers)
    window = (start_ms + 1000, end_ms)
    committed = [_id_ms(entry_id) for entry_id, _ in await committed_since(client, after)]
    return sum(window[0] <= ms <= window[1] for ms in committed) / (window[1] - window[0]) * 1000


async def offer(producer: Producer, name: str, rate: float, seconds: float) -> float:
    """Writes round(rate x seconds) records on a fixed timetable (open loop: a late tick writes all that is due);
    returns the rate achieved."""
    total, sent = round(rate * seconds), 0
    start = time.perf_counter()
    while sent < total:
        due = min(total, int(rate * (time.perf_counter() - start)) + 1)
        if due > sent:
            await producer.send_many(Record(f"{name}-{i}", {"i": i}) for i in range(sent, due))
            sent = due
        await asyncio.sleep(TICK_SECONDS)
    return total / (time.perf_counter() - start)


async def latency_run(
    client: aioredis.Redis,
    producer: Producer,
    rate: float,
    seconds: float,
    workers: list[asyncio.subprocess.Process],
) -> LatencyRun:
    before, after = await client.xlen(SINK), await last_id(client)
    achieved = await offer(producer, f"at-{rate:.0f}", rate, seconds)
    await wait_for(client, before + round(rate * seconds), workers)
    latencies = [
        _id_ms(entry_id) - int(fields[b"entered_at"]) for entry_id, fields in await committed_since(client, after)
    ]
    return LatencyRun(rate, achieved, latencies)


async def run(saturate_n: int, seconds: float, concurrency: int) -> int:
    load_before, started = os.getloadavg(), time.monotonic()
    with embedded_valkey() as url:
        client = aioredis.Redis.from_url(url)
        for stage in STAGES:
            await client.xgroup_create(stage.input, GROUP, id="0", mkstream=True)
        outputs = [*(s.input for s in STAGES[1:]), SINK]
        workers = [
            await start_worker(
                worker_env(
                    url,
                    stage.name,
                    VARIANTS["process"][0],
                    concurrency,
                    "warning",
                    {"INPUT_QUEUE": stage.input, "OUTPUT_QUEUE": output}
                    | ({"OUTPUT_HIGH_WATER": "0"} if output == SINK else {}),
                )
            )
            for stage, output in zip(STAGES, outputs, strict=True)
        ]
        try:
            producer = Producer(client, stream=STAGES[0].input)
            # Every worker up and its first batch through before anything is measured.
            await producer.send_many(Record(f"warm-{i}", {"i": i}) for i in range(100))
            await wait_for(client, 100, workers)
            burst = await saturate(client, producer, saturate_n, workers)
            maximum = min(burst, await sustained(client, producer, burst, workers))
            runs = [await latency_run(client, producer, maximum * load, seconds, workers) for load in LOADS]
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                await worker.wait()
            await client.aclose()
    load_after = os.getloadavg()
    print(
        f"3 chained stages, `phoenix worker` each (no-op process(), CONCURRENCY={concurrency}), one embedded "
        f"Valkey; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} cores)"
    )
    print(
        f"maximum sustainable rate: {maximum:7,.0f} records/s ({saturate_n:,} records at once: {burst:,.0f}/s; "
        f"that offered for {SUSTAIN_SECONDS:.0f} s: {maximum:,.0f}/s committed)"
    )
    for load, latency in zip(LOADS, runs, strict=True):
        print(f"{load:4.0%} of it, {seconds:.0f} s open loop: {latency.describe()}")
    print(
        "latency: entered_at (written by the producer) to the last stage's commit (its output entry's id), ms; "
        f"the whole bench took {time.monotonic() - started:.0f} s"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--saturate", type=int, default=5_000, help="records of the maximum-rate run")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each fixed-rate run")
    parser.add_argument("--concurrency", type=int, default=100, help="each worker's CONCURRENCY")
    args = parser.parse_args()
    return asyncio.run(run(args.saturate, args.seconds, args.concurrency))


if __name__ == "__main__":
    sys.exit(main())
