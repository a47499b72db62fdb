"""`make bench-ingest`: `phoenix ingest` (a real process) under a bounded load on loopback, beside the Python
Producer writing the same records to the same Valkey in the same run.

(p) Producer.send_many: the records in batches of --batch, one pipeline each, sequential (what a Python client
    that writes to Redis itself does);
(o) Producer.send_once: the same through producer_once.lua, once per record id (what the ingest does per request);
(h) HTTP: --requests POSTs of --batch records each, --concurrency at a time, over keep-alive connections, with the
    bearer token; every answer must be 201 with every record created. Throughput in records and requests per
    second, latency per request (p50, p99).
Each part writes to a stage of its own (a namespace each), the Valkey emptied between parts. Bounded: nothing runs
longer than its request count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from phoenix.embedded import embedded_valkey
from phoenix.producer import Producer, Record
from tests.fixtures.ingest import running_ingest

TOKEN = "bench-ingest-token"
STAGE = "first"


def _records(prefix: str, count: int) -> list[Record]:
    return [Record(f"{prefix}-{i}", {"document_url": f"s3://bench/{prefix}/{i}.pdf"}, "u-1") for i in range(count)]


async def producer_rates(redis_url: str, total: int, batch: int) -> dict[str, float]:
    """Records per second of send_many and of send_once, each on a fresh Valkey database."""
    rates = {}
    async with aioredis.Redis.from_url(redis_url, decode_responses=True) as client:
        for name in ("send_many", "send_once"):
            await client.flushdb()
            producer = Producer(client, STAGE, f"bench-{name.replace('_', '-')}")
            records = _records(name, total)
            started = time.perf_counter()
            for at in range(0, total, batch):
                chunk = records[at : at + batch]
                if name == "send_many":
                    await producer.send_many(chunk)
                else:
                    await producer.send_once(chunk, 3600)
            rates[name] = total / (time.perf_counter() - started)
            assert await client.xlen(f"phoenix:{{bench-{name.replace('_', '-')}}}:{STAGE}:input") == total
    return rates


async def http_load(base: str, requests: int, batch: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    url = f"{base}/v1/pipelines/bench/records"
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    bodies = [
        json.dumps(
            [
                {"record_id": f"h{n}-{i}", "user_id": "u-1", "data": {"document_url": f"s3://bench/{n}/{i}.pdf"}}
                for i in range(batch)
            ]
        )
        for n in range(requests)
    ]
    todo = iter(bodies)

    async def client(session: aiohttp.ClientSession) -> None:
        for body in todo:
            started = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as response:
                answer = await response.json()
                assert response.status == 201, answer
                assert all(w["status"] == "created" for w in answer["records"])
            latencies.append(time.perf_counter() - started)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "records_per_second": requests * batch / elapsed,
        "requests_per_second": requests / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="HTTP requests (default 2000)")
    parser.add_argument("--batch", type=int, default=10, help="records per request and per producer batch (10)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at once (default 16)")
    args = parser.parse_args()
    total = args.requests * args.batch
    with embedded_valkey() as redis_url, tempfile.TemporaryDirectory() as workdir:
        rates = asyncio.run(producer_rates(redis_url, total, args.batch))
        given = [f"--redis-url={redis_url}", "--namespace=bench-http", "--pipeline=bench", f"--stage={STAGE}"]
        # --high-water=0: no 429, the load measures the write path.
        with running_ingest(Path(workdir), TOKEN, *given, "--high-water=0") as base:
            http = asyncio.run(http_load(base, args.requests, args.batch, args.concurrency))
    print(f"{total} records, batches of {args.batch}; HTTP: {args.requests} requests, {args.concurrency} in flight")
    print(f"  (p) Producer.send_many    {rates['send_many']:>9.0f} records/s")
    print(f"  (o) Producer.send_once    {rates['send_once']:>9.0f} records/s")
    print(
        f"  (h) phoenix ingest HTTP   {http['records_per_second']:>9.0f} records/s  "
        f"{http['requests_per_second']:.0f} requests/s  p50 {http['p50_ms']:.1f} ms  p99 {http['p99_ms']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
