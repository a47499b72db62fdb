"""Traces of records: the spans' shape with the OpenTelemetry SDK's in-memory exporter and the real Worker against the
real Valkey; the configuration from the OTEL_* environment; the pass-through when nothing records.

The export path (OTLP over HTTP, three stages as subprocesses) is in test_tracing_export.py."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from phoenix.tools import dlq
from phoenix.worker_runtime.tracing import (
    WORKER_SAMPLE_RATIO,
    TracingConfigError,
    configure_tracing,
    default_sampler,
    otlp_header_values,
)
from tests.fixtures.eventually import wait_until
from tests.fixtures.inprocess import running_worker
from tests.fixtures.records import committed
from tests.fixtures.replies import add_entry, stream_entries
from tests.fixtures.sample_stage import DLQ, IN, KEYS, OUT, add, idle, outputs
from tests.fixtures.workers import ROOT, WorkerPool
from tests.processors import MisbehavingProcessor, ScriptedBatchProcessor

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = int("0af7651916cd43dd8448eb211c80319c", 16)
PARENT_SPAN_ID = int("b7ad6b7169203331", 16)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    yield memory
    memory.clear()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """A provider of the test's own: the process's global one stays unconfigured for the other tests."""
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    yield sdk
    sdk.shutdown()


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent else None


def traceparent(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


async def spans_when(exporter: InMemorySpanExporter, name: str, count: int) -> tuple[ReadableSpan, ...]:
    async def enough() -> tuple[ReadableSpan, ...] | None:
        spans = exporter.get_finished_spans()
        return spans if len(named(spans, name)) >= count else None

    return await wait_until(enough, f"{count} {name!r} spans")


async def test_a_record_gets_one_span_from_its_take_up_to_its_commit(
    redis: aioredis.Redis, redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    entry_id = await add_entry(redis, IN, {"record_id": "r1", "data": "{}", "traceparent": TRACEPARENT})
    async with running_worker(redis_url, output_queue=OUT, tracer_provider=provider):
        spans = await spans_when(exporter, "s process", 1)
    (process,) = named(spans, "s process")
    (settle,) = named(spans, "s settle")
    assert {s.name for s in spans} == {"s process", "s settle"}  # one span a record, one a batch write
    # The previous stage's span is the parent: one trace.
    assert process.context.trace_id == TRACE_ID
    assert parent_id(process) == PARENT_SPAN_ID and process.kind is trace.SpanKind.CONSUMER
    assert process.attributes is not None
    assert dict(process.attributes) == {
        "messaging.message.id": entry_id,
        "phoenix.record_id": "r1",
        "phoenix.attempt": 1,
        "phoenix.queue_wait_ms": process.attributes["phoenix.queue_wait_ms"],
        "phoenix.process_ms": process.attributes["phoenix.process_ms"],
        "phoenix.outcome": "commit",
    }
    # The stage's constant attributes are the tracer's, sent once per export (the same on the settle span).
    assert process.instrumentation_scope is not None and process.instrumentation_scope.name == "phoenix"
    assert dict(process.instrumentation_scope.attributes or {}) == {
        "messaging.system": "redis",
        "messaging.destination.name": IN,
        "messaging.consumer.group.name": KEYS.consumer_group,
        "messaging.operation.type": "process",
        "phoenix.stage": "s",
    }
    # The queue wait: the entry id's milliseconds to the span's start; the processor's time within the span, which
    # ends with the batch write that made the record durable.
    assert process.start_time is not None and process.end_time is not None
    waited = process.start_time // 1_000_000 - int(entry_id.partition("-")[0])
    queue_wait_ms = process.attributes["phoenix.queue_wait_ms"]
    assert isinstance(queue_wait_ms, int) and abs(queue_wait_ms - waited) <= 1
    process_ms = process.attributes["phoenix.process_ms"]
    assert isinstance(process_ms, float) and 0 <= process_ms * 1e6 <= process.end_time - process.start_time
    assert settle.start_time is not None and process.start_time < settle.start_time
    assert process.end_time == settle.end_time
    # The batch write links to the records' spans; it is a trace of its own.
    assert settle.kind is trace.SpanKind.PRODUCER and settle.parent is None
    assert [link.context.span_id for link in settle.links] == [process.context.span_id]
    assert settle.attributes is not None and settle.attributes["messaging.batch.message_count"] == 1
    # The next stage continues from this stage's span.
    (forwarded,) = await outputs(redis)
    assert forwarded["traceparent"] == traceparent(process)


async def test_a_record_without_trace_context_starts_a_trace_the_next_stage_continues(
    redis: aioredis.Redis, redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await add(redis, "r1")
    async with running_worker(redis_url, output_queue=OUT, tracer_provider=provider):
        spans = await spans_when(exporter, "s process", 1)
    (process,) = named(spans, "s process")
    assert process.parent is None
    (forwarded,) = await outputs(redis)
    assert forwarded["traceparent"] == traceparent(process)


async def test_a_retry_is_a_child_of_the_failed_attempt_in_the_same_trace(
    redis: aioredis.Redis, redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await redis.set("dependency-down:s", 1)
    await add(redis, "r1")  # no trace context: the first attempt starts the trace, the retry must stay in it
    async with running_worker(redis_url, output_queue=OUT, tracer_provider=provider):
        await spans_when(exporter, "s process", 1)
        await redis.delete("dependency-down:s")
        await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed on its retry")
        spans = await spans_when(exporter, "s process", 2)
    attempts = sorted(named(spans, "s process"), key=lambda s: s.start_time or 0)
    first, last = attempts[0], attempts[-1]
    assert first.attributes is not None and last.attributes is not None
    assert (first.attributes["phoenix.outcome"], first.attributes["phoenix.attempt"]) == ("retry", 1)
    assert first.status.status_code is trace.StatusCode.ERROR
    assert (last.attributes["phoenix.outcome"], last.attributes["phoenix.attempt"]) == ("commit", len(attempts))
    assert last.status.status_code is trace.StatusCode.UNSET
    assert {s.context.trace_id for s in attempts} == {first.context.trace_id}
    for before, after in itertools.pairwise(attempts):
        assert parent_id(after) == before.context.span_id  # each attempt continues the one that failed


async def test_a_dead_letter_replayed_continues_the_records_trace(
    redis: aioredis.Redis, redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await redis.xadd(IN, {"record_id": "r1", "data": json.dumps({"action": "invalid"}), "traceparent": TRACEPARENT})
    async with running_worker(redis_url, output_queue=OUT, tracer_provider=provider):
        spans = await spans_when(exporter, "s process", 1)
        (failed,) = named(spans, "s process")
        assert failed.attributes is not None and failed.attributes["phoenix.outcome"] == "dlq"
        assert failed.status.status_code is trace.StatusCode.ERROR
        ((dead_id, dead),) = await stream_entries(redis, DLQ)
        assert dead["traceparent"] == traceparent(failed)
        # The record is fixed meanwhile (its action dropped), then replayed as `phoenix dlq replay` does.
        await add_entry(redis, DLQ, {**dead, "data": "{}"})
        await redis.xdel(DLQ, dead_id)
        assert await dlq.replay(redis, DLQ, IN, None) == 1
        await wait_until(lambda: committed(redis, "s", "r1"), "the replayed r1 committed")
        spans = await spans_when(exporter, "s process", 2)
    replayed = max(named(spans, "s process"), key=lambda s: s.start_time or 0)
    assert replayed.context.trace_id == TRACE_ID and parent_id(replayed) == failed.context.span_id


async def test_a_duplicate_is_a_span_with_outcome_duplicate(
    redis: aioredis.Redis, redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    await add(redis, "r1")
    async with running_worker(redis_url, output_queue=OUT, tracer_provider=provider):
        await wait_until(lambda: committed(redis, "s", "r1"), "r1 committed")
        await redis.xadd(IN, {"record_id": "r1", "data": "{}", "traceparent": TRACEPARENT})
        spans = await spans_when(exporter, "s process", 2)
        await wait_until(lambda: idle(redis), "the duplicate acknowledged")
    (duplicate,) = [s for s in named(spans, "s process") if s.context.trace_id == TRACE_ID]
    assert duplicate.attributes is not None and duplicate.attributes["phoenix.outcome"] == "duplicate"
    assert parent_id(duplicate) == PARENT_SPAN_ID and "phoenix.process_ms" not in duplicate.attributes
    # Its acknowledgement's batch write links to it.
    assert [s for s in named(spans, "s settle") if duplicate.context.span_id in {x.context.span_id for x in s.links}]
    assert len(await outputs(redis)) == 1


async def test_a_record_given_up_past_its_timeout_ends_its_span_as_given_up(
    redis: aioredis.Redis, redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    """A call that swallows its cancellation is given up (retried without it); when it returns after all, its outcome
    is ignored, and its span ends there rather than never. The retry continues the given-up attempt."""
    await add(redis, "r1", misbehave="swallow-cancel:1")
    settings: dict[str, Any] = {"processing_timeout": 0.5, "timeout_grace": 0.5, "retry_base_seconds": 2.5}
    settings["retry_max_seconds"] = 2.5  # the late return (1.5 s after its start) comes before the retry
    processor = MisbehavingProcessor
    async with running_worker(redis_url, processor=processor, output_queue=OUT, tracer_provider=provider, **settings):
        spans = await spans_when(exporter, "s process", 2)  # the given-up attempt, then its retry committed
    first, second = sorted(named(spans, "s process"), key=lambda s: s.start_time or 0)
    assert first.attributes is not None and first.attributes["phoenix.outcome"] == "given_up"
    assert first.status.status_code is trace.StatusCode.ERROR
    assert second.attributes is not None and second.attributes["phoenix.outcome"] == "commit"
    assert parent_id(second) == first.context.span_id and second.attributes["phoenix.attempt"] == 2


async def test_a_batch_processor_gives_each_record_its_own_spans(
    redis: aioredis.Redis, redis_url: str, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    for n in range(3):
        await add(redis, f"r{n}")
    async with running_worker(redis_url, processor=ScriptedBatchProcessor, output_queue=OUT, tracer_provider=provider):
        spans = await spans_when(exporter, "s process", 3)
    processes = named(spans, "s process")
    assert len({s.context.trace_id for s in processes}) == 3  # three records, three traces
    assert {(s.attributes or {})["phoenix.outcome"] for s in processes} == {"commit"}
    linked = {link.context.span_id for s in named(spans, "s settle") for link in s.links}
    assert linked == {s.context.span_id for s in processes}
    forwarded = {o["record_id"]: o["traceparent"] for o in await outputs(redis)}
    assert forwarded == {(s.attributes or {})["phoenix.record_id"]: traceparent(s) for s in processes}


def test_nothing_is_configured_without_the_environment() -> None:
    assert configure_tracing("s", {}) is None
    assert configure_tracing("s", {"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}) is None
    assert (
        configure_tracing("s", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"})
        is None
    )
    assert (
        configure_tracing("s", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "none"})
        is None
    )
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_a_worker_samples_a_hundredth_of_new_traces_unless_told_otherwise() -> None:
    sampler = default_sampler({}, WORKER_SAMPLE_RATIO)
    assert sampler is not None and sampler.get_description().startswith("ParentBased{root:TraceIdRatioBased{0.01}")
    assert default_sampler({"OTEL_TRACES_SAMPLER": "always_on"}, WORKER_SAMPLE_RATIO) is None  # the SDK's reading
    assert default_sampler({}, None) is None  # the operator: every reconcile


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: only http/protobuf is supported",
        ),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin: only otlp, console and none"),
    ],
)
def test_an_unsupported_exporter_is_refused(env: dict[str, str], message: str) -> None:
    with pytest.raises(TracingConfigError, match=message):
        configure_tracing("s", env)


@pytest.mark.timeout(150)
@pytest.mark.subprocess
def test_a_worker_with_unsupported_tracing_exits_2_with_one_line() -> None:
    env = {
        "PATH": "",
        "PYTHONPATH": str(ROOT),
        "SERVICE_NAME": "s",
        "PROCESSOR": "tests.processors:ScriptedProcessor",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
    }
    done = subprocess.run(
        [sys.executable, "-m", "phoenix", "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    line = "phoenix worker: invalid configuration: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc: only http/protobuf is"
    assert done.stderr.strip().splitlines() == [f"{line} supported"]


def test_otlp_header_values_are_known_secrets() -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20s3cr3t,x-team=a"}
    assert otlp_header_values(env) == ["Bearer%20s3cr3t", "Bearer s3cr3t", "a", "a"]


async def test_traceparent_is_carried_unchanged_when_nothing_records(
    redis: aioredis.Redis, workers: WorkerPool
) -> None:
    await redis.xadd(IN, {"record_id": "t1", "data": "{}", "traceparent": TRACEPARENT})
    await redis.xadd(IN, {"record_id": "t2", "data": "{}"})
    workers.start("s", OUTPUT_QUEUE=OUT)
    await wait_until(lambda: committed(redis, "s", "t2"), "both processed")
    by_id = {o["record_id"]: o for o in await outputs(redis)}
    # With the OpenTelemetry API and no SDK configured the context passes through unchanged (same trace, parent).
    assert by_id["t1"]["traceparent"] == TRACEPARENT
    assert "traceparent" not in by_id["t2"]
