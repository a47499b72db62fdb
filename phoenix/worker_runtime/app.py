"""`phoenix worker`: configuration, clients, processor, health server and signals around one Worker."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable

import structlog

from phoenix.errors import ConfigError, StartRefused, TaskEnded
from phoenix.redis_spec import connect
from phoenix.worker_runtime import scrub
from phoenix.worker_runtime.billing import API_KEY_ENV, ApiKeyProvider, BillingSettings, load_billing_settings
from phoenix.worker_runtime.blocking import BLOCKING_THREADS
from phoenix.worker_runtime.health import start_health_server
from phoenix.worker_runtime.log import configure_logging
from phoenix.worker_runtime.processor import BaseProcessor, load_processor_class
from phoenix.worker_runtime.settings import WorkerSettings, load_settings
from phoenix.worker_runtime.tracing import WORKER_SAMPLE_RATIO, configure_tracing, otlp_header_values
from phoenix.worker_runtime.worker import Worker

# A shutdown still running this long after the grace period is stuck; unfinished entries stay pending, so
# ending the process loses nothing and beats waiting for Kubernetes' SIGKILL.
_STUCK_AFTER_GRACE = 30.0


def _stop_with_deadline(worker: Worker, deadline: float) -> None:
    if worker.stop_requested:
        return
    worker.request_stop()
    timer = threading.Timer(deadline, _exit_stuck, args=(deadline,))
    timer.daemon = True
    timer.start()


def _exit_stuck(deadline: float) -> None:
    structlog.get_logger("phoenix.worker").error("shutdown_stuck", seconds=deadline)
    os._exit(1)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it exists (not on Windows): a faster event loop and transports, a tenth off the worker's CPU."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main() -> int:
    """Exit 0 after a stop that was asked for (SIGTERM, SIGINT); 1 when one of the worker's own tasks ended by
    itself (its `worker_task_ended` line says which and why); 2 with one readable line on stderr when the
    configuration is bad; 3 when the processor's initialize() failed."""
    try:
        settings = load_settings()
        # Here, not in the settings (which tools also build from a pod's variables): TLS files that cannot be
        # read stop the worker at start, not at its first connection.
        settings.redis.ssl_context()
        billing = load_billing_settings()
        billing.check(settings.concurrency)
        processor_class = load_processor_class(settings.processor)
        # Before the processor's initialize(), which may then configure an SDK of its own instead (tracing.py).
        shutdown_tracing = configure_tracing(settings.service_name, default_ratio=WORKER_SAMPLE_RATIO)
    except ConfigError as exc:
        print(f"phoenix worker: invalid configuration: {exc}", file=sys.stderr)
        return 2
    # Before anything is logged; the billing keys register themselves (ApiKeyProvider), users' keys per task.
    scrub.register(*settings.redis_secrets)
    scrub.register(os.environ.get(API_KEY_ENV))
    scrub.register(*(os.environ.get(name) for name in settings.masked_variables))  # the processor's own Secrets
    scrub.register(*otlp_header_values())  # an exporter's error may quote its Authorization header
    configure_logging(settings.service_name, settings.log_level, settings.log_format)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        code = runner.run(_serve(settings, billing, processor_class))
    if shutdown_tracing is not None:
        shutdown_tracing()  # the spans of the last batches, sent before the process ends
    if BLOCKING_THREADS.leaked:
        # A thread stuck in a processor's library code cannot be stopped, and the interpreter would wait for it at
        # exit; its record was settled already, so nothing is lost by leaving now.
        structlog.get_logger("phoenix.worker").warning("exit_abandons_threads", threads=BLOCKING_THREADS.leaked)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


async def _serve(settings: WorkerSettings, billing: BillingSettings, processor_class: type[BaseProcessor]) -> int:
    log = structlog.get_logger("phoenix.worker")
    # Two pools: the runtime decodes entries itself (bytes), processors get the friendlier str client.
    stream_client = connect(settings.redis, decode_responses=False, hiredis_packing=True)
    app_client = connect(settings.redis, decode_responses=True, hiredis_packing=True)
    processor = processor_class()
    processor.redis = app_client
    processor.logger = structlog.get_logger(processor_class.name or processor_class.__name__)
    processor.settings = settings
    keys = ApiKeyProvider(
        app_client,
        stage=settings.service_name,
        namespace=settings.key_namespace,
        billing_url=billing.billing_url,
        master_key=billing.billing_master_key,
        cache_key=billing.billing_cache_key,
        cache_max_age=billing.billing_cache_max_age,
    )
    runner = None
    try:
        try:
            await processor.initialize()
        except Exception as exc:
            # A stage that cannot start (its own settings, a model file) says why in one line, not a traceback.
            log.error("processor_initialize_failed", error=str(exc), error_type=type(exc).__name__)
            print(
                f"phoenix worker: {processor_class.__name__}.initialize() failed: {scrub.scrub(str(exc))}",
                file=sys.stderr,
            )
            return 3
        worker = Worker(settings, processor, stream_client, keys, swap_env_key=billing.swap_env)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _stop_with_deadline, worker, settings.shutdown_grace + _STUCK_AFTER_GRACE)
        if settings.health_port:
            runner = await start_health_server(settings.health_port, alive=worker.alive, ready=worker.ready)
        # What exists now (modules, the processor's models and clients) lives as long as the process: frozen out of
        # the collector's generations, it is never scanned again by the collections that per-record objects set
        # off (docs/performance.md, "Worker CPU").
        gc.freeze()
        await worker.run()
    except StartRefused as exc:
        print(f"phoenix worker: {exc.worker_line()}", file=sys.stderr)
        return 2
    except TaskEnded:
        return 1  # logged where it was found (worker_task_ended), before the drain
    finally:
        await processor.cleanup()
        await keys.aclose()
        if runner:
            await runner.cleanup()
        await stream_client.aclose()
        await app_client.aclose()
    log.info("worker_exit")
    return 0
