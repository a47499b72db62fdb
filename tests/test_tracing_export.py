"""The export path for real: `phoenix worker` subprocesses configured by the standard OTEL_* environment send their
spans over OTLP/HTTP to a receiver on loopback (tests/fixtures/otlp_receiver.py), which decodes them with
opentelemetry-proto. One record through router -> parser -> grouper is one trace there; a retried record's second
attempt is in its trace; the workers' JSON log lines carry the trace's id; the operator's reconciles are spans."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from pathlib import Path

import pytest
import redis as sync_redis
import redis.asyncio as aioredis

from phoenix.demo import PIPELINE, SHOWCASE_SAMPLE
from phoenix.keys import input_stream
from phoenix.stages.samples import ensure_samples
from tests.fixtures.cli import phoenix
from tests.fixtures.control_plane import ControlPlane
from tests.fixtures.eventually import wait_until
from tests.fixtures.operator_process import final_stage, kubectl_apply, running_operator
from tests.fixtures.otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.fixtures.records import committed
from tests.fixtures.sample_stage import OUT, add, outputs
from tests.fixtures.workers import WorkerPool, WorkerProcess

CONSUMER_KIND = 5  # opentelemetry.proto's Span.SpanKind


def otel_env(receiver: OtlpReceiver, sampler: str = "always_on") -> dict[str, str]:
    # Spans sent within a fifth of a second rather than the SDK's 5 s, so the test waits little; every record traced
    # (a worker's own default samples 1% of new traces).
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_TRACES_SAMPLER": sampler,
        "LOG_FORMAT": "json",
    }


def of_record(receiver: OtlpReceiver, record_id: str) -> list[ReceivedSpan]:
    return [s for s in receiver.spans if s.attributes.get("phoenix.record_id") == record_id]


def lines_with(worker: WorkerProcess, trace_id: str) -> list[dict[str, object]]:
    return [line for line in worker.events() if line.get("trace_id") == trace_id]


@pytest.mark.timeout(150)
async def test_one_record_through_three_stages_is_one_trace(
    redis: aioredis.Redis, workers: WorkerPool, tmp_path: Path
) -> None:
    document = {s.name: s for s in ensure_samples(tmp_path / "samples")}[SHOWCASE_SAMPLE]
    async with otlp_receiver() as receiver:
        stages = {
            stage.name: workers.start(
                stage.name,
                processor=stage.name,
                **({"OUTPUT_QUEUE": stage.output} if stage.output else {}),
                **({"DOCUMENT_ROOT": str(document.parent)} if stage.reads_documents else {}),
                **otel_env(receiver),
            )
            for stage in PIPELINE
        }
        data = json.dumps({"document_url": document.resolve().as_uri()})
        await redis.xadd(input_stream("router"), {"record_id": "rec-1", "user_id": "u1", "data": data})

        expected = {f"{stage.name} process" for stage in PIPELINE}

        async def traced() -> str | None:
            # The record's process spans are found by its id, everything else of its trace by the trace id. Each
            # stage exports on its own schedule: the grouper's spans may arrive before the parser's.
            ids = {s.trace_id for s in of_record(receiver, "rec-1")}
            done = ids and expected <= {s.name for s in receiver.trace(next(iter(ids)))}
            return next(iter(ids)) if done and len(ids) == 1 else None

        trace_id = await wait_until(traced, "every stage's spans in the record's one trace", timeout=120)
        spans = receiver.trace(trace_id)
        print(receiver.render(trace_id))  # the text docs/observability.md shows
    by_name = {s.name: s for s in spans}
    assert set(by_name) == expected
    assert len(spans) == 3  # one span a stage, none twice
    # The right parents: each stage's span continues the previous stage's.
    assert by_name["router process"].parent_id == ""
    assert by_name["parser process"].parent_id == by_name["router process"].span_id
    assert by_name["grouper process"].parent_id == by_name["parser process"].span_id
    for stage in PIPELINE:
        process = by_name[f"{stage.name} process"]
        assert process.service == stage.name and process.kind == CONSUMER_KIND
        # The stage's messaging attributes came once, on the tracer's scope; the record's on its span.
        assert process.scope["messaging.system"] == "redis" and process.scope["phoenix.stage"] == stage.name
        assert process.scope["messaging.destination.name"] == input_stream(stage.name)
        assert process.attributes["phoenix.record_id"] == "rec-1" and process.attributes["phoenix.attempt"] == 1
        assert process.attributes["phoenix.outcome"] == "commit"
        assert process.attributes["phoenix.queue_wait_ms"] >= 0
        assert 0 <= process.attributes["phoenix.process_ms"] * 1e6 <= process.end_ns - process.start_ns
        # The batch write that made it durable came too, linked to the record's span, and ended with it.
        (settle,) = [s for s in receiver.spans if s.name == f"{stage.name} settle" and process.span_id in s.links]
        assert settle.end_ns == process.end_ns and settle.trace_id != trace_id
        # Every stage wrote a line in the record's trace: its processing_complete, with the record's span id.
        (line,) = [line for line in lines_with(stages[stage.name], trace_id) if line["event"] == "processing_complete"]
        assert line["record_id"] == "rec-1" and line["span_id"] == process.span_id


@pytest.mark.timeout(90)
async def test_a_retried_record_stays_in_its_trace_and_its_failure_line_carries_it(
    redis: aioredis.Redis, redis_url: str, workers: WorkerPool
) -> None:
    await redis.set("dependency-down:s", 1)
    await add(redis, "r1")
    async with otlp_receiver() as receiver:
        worker = workers.start("s", OUTPUT_QUEUE=OUT, **otel_env(receiver))
        await wait_until(lambda: worker.logged("processing_failed_will_retry"), "the first attempt failed")
        await redis.delete("dependency-down:s")
        await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed on a later attempt", timeout=60)

        async def both_attempts() -> list[ReceivedSpan] | None:
            processes = [s for s in of_record(receiver, "r1") if s.name == "s process"]
            done = [s for s in processes if s.attributes.get("phoenix.outcome") == "commit"]
            return processes if done else None

        processes = sorted(
            await wait_until(both_attempts, "the committed attempt's span received"), key=lambda s: s.start_ns
        )
    assert {s.trace_id for s in processes} == {processes[0].trace_id}
    assert [s.attributes["phoenix.outcome"] for s in processes[:-1]] == ["retry"] * (len(processes) - 1)
    assert [s.attributes["phoenix.attempt"] for s in processes] == list(range(1, len(processes) + 1))
    for before, after in itertools.pairwise(processes):
        assert after.parent_id == before.span_id  # each attempt continues the one that failed
    # The failure's line is written inside the failed attempt's span.
    failed = [line for line in worker.events() if line["event"] == "processing_failed_will_retry"]
    assert failed[0]["trace_id"] == processes[0].trace_id and failed[0]["span_id"] == processes[0].span_id
    # `phoenix inspect` names the trace (from the retried entry and the forwarded one; the first carried none).
    text = phoenix(redis_url, "inspect", "--service", "s", "r1", "--output", OUT)
    assert f"  trace:  {processes[0].trace_id}\n" in text
    report = json.loads(phoenix(redis_url, "inspect", "--service", "s", "r1", "--output", OUT, "--json"))
    assert report["trace_ids"] == [processes[0].trace_id]


@pytest.mark.timeout(90)
async def test_a_batch_processors_failure_lines_carry_each_records_trace(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """process_batch decides many records' outcomes after one call: each record's failure line is written inside its
    own process span, whether the record failed alone or the whole call raised."""
    await add(redis, "once", action="fail-once")
    await add(redis, "gone", action="missing")
    async with otlp_receiver() as receiver:
        worker = workers.start(
            "s", processor="tests.processors:ScriptedBatchProcessor", OUTPUT_QUEUE=OUT, **otel_env(receiver)
        )
        await wait_until(lambda: committed(redis, "s", "once"), "once committed on its retry", timeout=60)
        await redis.set("batch-down:s", 1)
        await add(redis, "down")
        await wait_until(lambda: worker.logged("processing_failed_will_retry"), "the failures logged")

        async def failed_attempts() -> dict[str, ReceivedSpan] | None:
            spans = {
                record: [s for s in of_record(receiver, record) if s.name == "s process"]
                for record in ("once", "gone", "down")
            }
            if not all(spans.values()):
                return None
            return {record: min(found, key=lambda s: s.start_ns) for record, found in spans.items()}

        first = await wait_until(failed_attempts, "each record's first attempt received")

        async def lines() -> dict[str, dict[str, object]] | None:
            failures = ("processing_failed_will_retry", "message_dead_lettered")
            found = {line["record_id"]: line for line in worker.events() if line["event"] in failures}
            return found if {"once", "gone", "down"} <= set(found) else None

        failed = await wait_until(lines, "each record's failure line")
    assert {record: first[record].attributes["phoenix.outcome"] for record in first} == {
        "once": "retry",
        "gone": "dlq",
        "down": "retry",
    }
    for record, span in first.items():
        assert (failed[record]["trace_id"], failed[record]["span_id"]) == (span.trace_id, span.span_id), record


@pytest.mark.timeout(90)
async def test_a_batch_writes_lines_carry_its_settle_span(redis: aioredis.Redis, workers: WorkerPool) -> None:
    """A line the batch write logs (here replicas_behind: MIN_REPLICAS_ACK=1 and no replica) is inside its settle
    span, which links to the records' process spans."""
    async with otlp_receiver() as receiver:
        env = {"MIN_REPLICAS_ACK": "1", "MIN_REPLICAS_TIMEOUT_MS": "50", **otel_env(receiver)}
        worker = workers.start("s", OUTPUT_QUEUE=OUT, **env)
        await add(redis, "r1")
        await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed")

        async def settled() -> tuple[ReceivedSpan, ReceivedSpan] | None:
            processes = [s for s in of_record(receiver, "r1") if s.name == "s process"]
            links = {p.span_id for p in processes}
            settles = [s for s in receiver.spans if s.name == "s settle" and links & set(s.links)]
            return (processes[0], settles[0]) if settles else None

        process, settle = await wait_until(settled, "r1's process span and its batch write's")
    behind = [line for line in worker.events() if line["event"] == "replicas_behind"]
    assert behind and (behind[0]["trace_id"], behind[0]["span_id"]) == (settle.trace_id, settle.span_id)
    assert behind[0]["trace_id"] != process.trace_id  # the batch's own trace, linked to the record's


@pytest.mark.timeout(90)
async def test_a_processors_stdlib_log_lines_are_json_lines_in_its_trace(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """A processor (or its libraries) logging with the standard library's `logging` inside process(): the line is one
    of the worker's JSON lines on stdout, with the record's ids and its process span's trace_id and span_id."""
    async with otlp_receiver() as receiver:
        worker = workers.start(
            "s", processor="tests.processors:StdlibLoggingProcessor", OUTPUT_QUEUE=OUT, **otel_env(receiver)
        )
        await add(redis, "r1")
        await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed")

        async def processed() -> ReceivedSpan | None:
            return next((s for s in of_record(receiver, "r1") if s.name == "s process"), None)

        process = await wait_until(processed, "r1's process span")
    (line,) = [line for line in worker.events() if str(line["event"]).startswith("vendor answered slowly")]
    assert line["event"] == "vendor answered slowly for r1" and line["logger"] == "vendor.client"
    assert (line["level"], line["service"], line["record_id"]) == ("warning", "s", "r1")
    assert (line["trace_id"], line["span_id"]) == (process.trace_id, process.span_id)
    assert "timestamp" in line
    assert not [line for line in worker.events() if line["event"] == "connected to the vendor"]  # below WARNING


@pytest.mark.timeout(90)
async def test_the_standard_environment_names_the_service_and_samples(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    """OTEL_SERVICE_NAME names the worker's resource; OTEL_TRACES_SAMPLER=always_off sends nothing, while the record
    still goes on with a trace context (not sampled) for the next stage."""
    async with otlp_receiver() as receiver:
        named = workers.start("s", OUTPUT_QUEUE=OUT, OTEL_SERVICE_NAME="billing-router", **otel_env(receiver))
        await add(redis, "r1")
        await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed")
        await asyncio.to_thread(named.stop)  # its last spans flushed at exit, to the receiver on this loop
        assert {s.service for s in of_record(receiver, "r1")} == {"billing-router"}

        unsampled = workers.start("s", OUTPUT_QUEUE=OUT, **otel_env(receiver, sampler="always_off"))
        await add(redis, "r2")
        await wait_until(lambda: committed(redis, "s", "r2"), "r2 committed")
        await asyncio.to_thread(unsampled.stop)
        assert of_record(receiver, "r2") == []
    (forwarded,) = [o for o in await outputs(redis) if o["record_id"] == "r2"]
    assert int(forwarded["traceparent"].rsplit("-", 1)[1], 16) & 1 == 0  # the flags' sampled bit unset


@pytest.mark.timeout(150)
@pytest.mark.kube
@pytest.mark.parametrize("redis_db", [11], indirect=True)
async def test_the_operator_traces_each_reconcile(
    kube_cluster: ControlPlane,
    operator_kubeconfig: Path,
    kube_namespace: str,
    redis_db: tuple[str, sync_redis.Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = redis_db
    async with otlp_receiver() as receiver:
        for name, value in otel_env(receiver).items():
            monkeypatch.setenv(name, value)  # the operator's environment: start_operator passes the test's on
        # JSON lines (LOG_FORMAT, as the manifests set it), to find the ones written inside the reconcile's span.
        monkeypatch.setenv("LOG_FORMAT", "json")
        with contextlib.ExitStack() as stack:
            # In a thread: the receiver answers on this event loop while the operator starts and reconciles.
            operator = running_operator(kube_cluster, operator_kubeconfig, log_name="operator-tracing")
            process, _ = await asyncio.to_thread(stack.enter_context, operator)
            await asyncio.to_thread(kubectl_apply, kube_cluster, final_stage(url, kube_namespace, name="traced"))

            async def reconciled() -> list[ReceivedSpan]:
                return [
                    s for s in receiver.spans if s.name == "reconcile" and s.attributes["phoenix.stage"] == "traced"
                ]

            spans = await wait_until(reconciled, "the reconcile's span received", timeout=120)
            await asyncio.to_thread(stack.close)
    log = [json.loads(line) for line in process.log_path.read_text().splitlines() if line.startswith("{")]
    span = spans[0]
    assert span.service == "phoenix-operator" and span.parent_id == ""
    assert span.attributes["k8s.namespace.name"] == kube_namespace and span.end_ns >= span.start_ns
    # The Events it posted are logged inside it, with its ids.
    inside = [line for line in log if line.get("trace_id") == span.trace_id]
    assert inside and all(line["span_id"] == span.span_id for line in inside)
    assert any("traced" in str(line.get("message")) for line in inside)
