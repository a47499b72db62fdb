"""`make demo`: the example pipeline router -> parser -> grouper on this machine, with a live queue table.

Starts an embedded Valkey (or uses `--redis-url`), runs each stage as its own `phoenix worker` process, enqueues
the sample lab reports, redraws a per-stage table until every record is grouped, prints one record's grouped
biomarkers and stops everything. Worker logs go to files under `--work-dir`, so the terminal shows only the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from phoenix import producer
from phoenix.cli.stage import add_connection_arguments, redis_env, redis_spec
from phoenix.console import TableDisplay, format_columns
from phoenix.embedded import embedded_valkey
from phoenix.errors import PhoenixError
from phoenix.keys import DEFAULT_NAMESPACE, StageKeys, input_stream
from phoenix.producer import Producer
from phoenix.redis_replies import text_range
from phoenix.redis_spec import RedisSpec, RedisSpecError, connect
from phoenix.stages.data_keys import grouped_key, parsed_key
from phoenix.stages.models import BiomarkerGroup, Findings, GroupList
from phoenix.stages.samples import ensure_samples
from phoenix.tools.queue_stats import QueueStats, RateMeter, acknowledged, collect
from phoenix.worker_runtime.settings import WorkerSettings

SHOWCASE_SAMPLE = "02-diabetes-follow-up.pdf"  # the report whose biomarkers come in several names and units
REFRESH_SECONDS = 0.25
STOP_WAIT_SECONDS = 30.0


class DemoError(PhoenixError):
    """The pipeline did not finish as expected; the message says what to look at."""


@dataclass(frozen=True)
class DemoStage:
    name: str  # also the processor entry point
    output: str  # next stage's input stream; "" for the last stage
    reads_documents: bool = False  # fetches each record's document_url: files only under DOCUMENT_ROOT

    @property
    def queues(self) -> StageKeys:
        return StageKeys.for_stage(self.name)


PIPELINE = (
    DemoStage("router", input_stream("parser"), reads_documents=True),
    DemoStage("parser", input_stream("grouper")),
    DemoStage("grouper", ""),
)


@dataclass(frozen=True)
class Record:
    record_id: str
    user_id: str
    document: Path


# -- worker processes ---------------------------------------------------------------------------------------------


def worker_env(stage: DemoStage, redis: dict[str, str], base: dict[str, str], documents: Path) -> dict[str, str]:
    """`redis`: REDIS_URL and the other connection variables the demo itself was given; `documents`: the
    directory of the sample PDFs."""
    # A worker variable left in the caller's shell (INPUT_QUEUE, CONCURRENCY, ...) must not rewire the demo.
    worker_vars = {name.upper() for name in WorkerSettings.model_fields}
    env = {k: v for k, v in base.items() if k.upper() not in worker_vars}
    env.update(
        SERVICE_NAME=stage.name,
        PROCESSOR=stage.name,
        **redis,
        HEALTH_PORT="0",  # several workers on one host: no probe ports to collide
        LOG_FORMAT="json",
    )
    if stage.output:
        env["OUTPUT_QUEUE"] = stage.output
    if stage.reads_documents:
        env["DOCUMENT_ROOT"] = str(documents.resolve())
    return env


@dataclass
class WorkerProcess:
    stage: DemoStage
    popen: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, stage: DemoStage, redis: dict[str, str], log_dir: Path, documents: Path) -> WorkerProcess:
        log_path = log_dir / f"{stage.name}.log"
        with log_path.open("wb") as log:
            # Own session: Ctrl-C reaches only the demo, which then stops the workers in order.
            popen = subprocess.Popen(
                [sys.executable, "-m", "phoenix", "worker"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker_env(stage, redis, dict(os.environ), documents),
                start_new_session=True,
            )
        return cls(stage, popen, log_path)

    def check_running(self) -> None:
        if (code := self.popen.poll()) is not None:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
            raise DemoError(f"the {self.stage.name} worker exited with code {code}; {self.log_path} ends with:\n{tail}")


def stop_workers(workers: Sequence[WorkerProcess]) -> None:
    """SIGTERM all (they finish in-flight work and exit), then SIGKILL whatever is still running."""
    for worker in workers:
        if worker.popen.poll() is None:
            worker.popen.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    for worker in workers:
        try:
            worker.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.popen.kill()
            worker.popen.wait()


@contextlib.contextmanager
def running_workers(redis: dict[str, str], log_dir: Path, documents: Path) -> Iterator[list[WorkerProcess]]:
    log_dir.mkdir(parents=True, exist_ok=True)
    workers: list[WorkerProcess] = []
    try:
        for stage in PIPELINE:
            workers.append(WorkerProcess.start(stage, redis, log_dir, documents))
        yield workers
    finally:
        stop_workers(workers)


# -- the live table -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageRow:
    name: str
    backlog: int | None  # entries not yet delivered to any worker (the group's lag)
    in_flight: int  # delivered, not yet acknowledged (pending)
    done: int | None  # delivered and acknowledged
    dlq: int
    workers: int
    rate: float  # acknowledged entries per second over the last RATE_WINDOW_SECONDS

    @classmethod
    def of(cls, name: str, stats: QueueStats, rate: float) -> StageRow:
        return cls(name, stats.lag, stats.pending, acknowledged(stats), stats.dlq_length, stats.consumers, rate)

    def counts(self) -> tuple[int | None, ...]:
        return self.backlog, self.in_flight, self.done, self.dlq, self.workers


TABLE_HEADER = ("STAGE", "BACKLOG", "IN-FLIGHT", "DONE", "DLQ", "WORKERS", "RATE")


def render_table(rows: Sequence[StageRow]) -> list[str]:
    def cell(value: int | None) -> str:
        return "-" if value is None else str(value)

    lines = [TABLE_HEADER] + [(row.name, *(cell(v) for v in row.counts()), f"{row.rate:.1f}/s") for row in rows]
    return format_columns(lines)


# -- the pipeline run ---------------------------------------------------------------------------------------------


def plan_records(samples: Sequence[Path], copies: int, run_id: str) -> list[Record]:
    """Each sample `copies` times under fresh record ids (a rerun is new work, not a duplicate) and varied users."""
    records: list[Record] = []
    for copy in range(copies):
        for path in samples:
            n = len(records) + 1
            records.append(Record(f"demo-{run_id}-{n:03d}", f"user-{copy % 3 + 1}", path))
    return records


async def enqueue(client: aioredis.Redis, stage: str, records: Sequence[Record]) -> None:
    await Producer(client, stage).send_many(
        producer.Record(r.record_id, {"document_url": r.document.resolve().as_uri()}, r.user_id) for r in records
    )


async def finished_records(client: aioredis.Redis, records: Sequence[Record], since_id: str) -> tuple[int, int]:
    """(grouped, dead-lettered) among `records`: every record ends in exactly one of the two."""
    grouped = await client.exists(*(grouped_key(DEFAULT_NAMESPACE, r.record_id) for r in records))
    ours = {r.record_id for r in records}
    dead = 0
    for stage in PIPELINE:
        entries = await text_range(client, stage.queues.dlq, first=since_id)
        dead += sum(1 for _, fields in entries if fields.get("record_id") in ours)
    return grouped, dead


async def snapshot(client: aioredis.Redis, meter: RateMeter) -> list[StageRow]:
    stats = await collect(client, [stage.queues for stage in PIPELINE])
    now = time.monotonic()
    return [
        StageRow.of(s.name, st, meter.rate(s.name, now, acknowledged(st)))
        for s, st in zip(PIPELINE, stats, strict=True)
    ]


def drained(rows: Sequence[StageRow]) -> bool:
    return all(row.backlog == 0 and row.in_flight == 0 for row in rows)


async def run_pipeline(
    client: aioredis.Redis, workers: Sequence[WorkerProcess], records: Sequence[Record], timeout: float, out: TextIO
) -> None:
    since_id = f"{int(time.time() * 1000)}-0"  # DLQ entries of this run are newer than this
    await enqueue(client, PIPELINE[0].queues.name, records)
    started = time.monotonic()
    display, meter = TableDisplay(out, started), RateMeter()
    while True:
        for worker in workers:
            worker.check_running()
        grouped, dead = await finished_records(client, records, since_id)
        rows = await snapshot(client, meter)
        # Rows are read after the records: once all are finished, an empty pipeline here means nothing is left.
        if grouped + dead == len(records) and drained(rows):
            display.show(render_table(rows), [row.counts() for row in rows], final=True)
            break
        display.show(render_table(rows), [row.counts() for row in rows])
        if time.monotonic() - started > timeout:
            raise DemoError(
                f"the pipeline did not drain within {timeout:.0f} s ({grouped + dead} of "
                f"{len(records)} records finished); see the worker logs"
            )
        await asyncio.sleep(REFRESH_SECONDS)
    if dead:
        raise DemoError(f"{dead} records were dead-lettered; inspect them with `phoenix dlq list --service <stage>`")


# -- the result ---------------------------------------------------------------------------------------------------


def _number(value: float) -> str:
    return f"{value:g}"


def render_groups(groups: Sequence[BiomarkerGroup]) -> list[str]:
    """One line per measurement; a group's canonical name on its first line, values also in the group's unit."""
    lines: list[tuple[str, ...]] = [("BIOMARKER", "REPORTED AS", "VALUE", "AS CANONICAL", "FLAG", "REFERENCE", "PAGE")]
    for group in groups:
        for i, m in enumerate(group.measurements):
            canonical = "-" if m.normalized_value is None else f"{_number(m.normalized_value)} {group.unit}"
            lines.append(
                (
                    group.name if i == 0 else "",
                    m.name,
                    f"{m.comparator or ''}{_number(m.value)} {m.unit}",
                    canonical,
                    m.flag,
                    m.reference_range or "-",
                    str(m.page),
                )
            )
    return format_columns(lines)


async def print_grouped(client: aioredis.Redis, record: Record, out: TextIO) -> None:
    key = grouped_key(DEFAULT_NAMESPACE, record.record_id)
    if (raw := await client.get(key)) is None:
        raise DemoError(f"no grouped biomarkers at {key}")
    groups = GroupList.validate_json(raw)
    mixed = sum(g.mixed_units for g in groups)
    out.write(
        f"\nGrouped biomarkers of record {record.record_id} ({record.document.name}, {record.user_id}): "
        f"{len(groups)} groups, {mixed} reported in mixed units\n"
    )
    out.write("\n".join(render_groups(groups)) + "\n")


async def print_unparsed(client: aioredis.Redis, records: Sequence[Record], out: TextIO) -> None:
    """Lines that look like results but fit no grammar: the parser keeps them, the summary shows them."""
    found: Counter[tuple[str, int, str]] = Counter()
    for record in records:
        if (raw := await client.get(parsed_key(DEFAULT_NAMESPACE, record.record_id))) is not None:
            rows = Findings.model_validate_json(raw).unparsed
            found.update((record.document.name, row.page, row.text) for row in rows)
    out.write(
        f"\nUnparsed result-like lines: {found.total()} (kept in {parsed_key(DEFAULT_NAMESPACE, '<record_id>')}, "
        "counted in phoenix_parser_unparsed_rows_total)\n"
    )
    for (document, page, text), count in found.most_common(5):
        out.write(f"  {document} page {page} ({count} records): {text}\n")


# -- entry point --------------------------------------------------------------------------------------------------


async def demo(
    redis: RedisSpec, workers: Sequence[WorkerProcess], records: Sequence[Record], timeout: float, out: TextIO
) -> None:
    async with connect(redis, decode_responses=True) as client:
        await run_pipeline(client, workers, records, timeout, out)
        showcase = next((r for r in records if r.document.name == SHOWCASE_SAMPLE), records[0])
        await print_grouped(client, showcase, out)
        await print_unparsed(client, records, out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m phoenix.demo", description=__doc__.splitlines()[0])
    # --redis-url: this Redis 7+ / Valkey instead of an embedded Valkey; the other options (or their variables,
    # which the workers read too) say how to reach it.
    add_connection_arguments(p).set_defaults(redis_url=None)  # not $REDIS_URL: the demo starts its own Valkey
    p.add_argument("--work-dir", type=Path, default=Path(".cache/demo"), help="sample PDFs and worker logs")
    p.add_argument("--copies", type=int, default=10, help="times each of the 5 sample reports is enqueued")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for the pipeline to drain")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.copies < 1:
        _parser().error("--copies must be at least 1")
    # SIGTERM (e.g. from a CI runner) cleans up exactly like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    out = sys.stdout
    began = time.monotonic()
    documents = args.work_dir / "samples"
    samples = ensure_samples(documents)
    records = plan_records(samples, args.copies, secrets.token_hex(3))
    log_dir = args.work_dir / "logs"
    try:
        with contextlib.ExitStack() as stack:
            if args.redis_url:
                redis = redis_spec(args)
                out.write(f"Using Redis at {redis.redacted}\n")
            else:
                args.redis_url = stack.enter_context(embedded_valkey())
                redis = RedisSpec.from_url(args.redis_url)
                out.write(f"Started embedded Valkey at {args.redis_url}\n")
            workers = stack.enter_context(running_workers(redis_env(args), log_dir, documents))
            out.write(
                f"Workers: {' -> '.join(s.name for s in PIPELINE)} (logs in {log_dir}/)\n"
                f"Enqueueing {len(records)} records ({len(samples)} sample reports x {args.copies})\n\n"
            )
            out.flush()
            asyncio.run(demo(redis, workers, records, args.timeout, out))
            out.write("\nStopping workers...\n")
            out.flush()
    except KeyboardInterrupt:
        print("\nInterrupted: workers stopped.", file=sys.stderr)
        return 130
    except DemoError as exc:
        print(f"\ndemo failed: {exc}", file=sys.stderr)
        return 1
    except RedisSpecError as exc:
        print(f"demo: invalid Redis configuration: {exc}", file=sys.stderr)
        return 2
    except RedisError as exc:
        # The message names host and port, never the password.
        print(f"\ndemo failed: Redis error: {exc}", file=sys.stderr)
        return 1
    out.write(f"Done in {time.monotonic() - began:.1f} s.\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
