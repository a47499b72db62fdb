"""`phoenix worker`: configuration, clients, processor, health server and signals around one Worker."""

from __future__ import annotations

import asyncio
import signal
import sys

import redis.asyncio as aioredis
import structlog

from phoenix.worker_runtime.health import start_health_server
from phoenix.worker_runtime.log import configure_logging
from phoenix.worker_runtime.processor import ProcessorLoadError, load_processor_class
from phoenix.worker_runtime.settings import ConfigurationError, WorkerSettings, load_settings
from phoenix.worker_runtime.worker import Worker


def main() -> int:
    """Exit 0 after a clean stop; 2 with one readable line on stderr when the configuration is bad."""
    try:
        settings = load_settings()
        processor_class = load_processor_class(settings.processor)
    except (ConfigurationError, ProcessorLoadError) as exc:
        print(f"phoenix worker: invalid configuration: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.service_name, settings.log_level, settings.log_format)
    return asyncio.run(_serve(settings, processor_class))


async def _serve(settings: WorkerSettings, processor_class: type) -> int:
    log = structlog.get_logger("phoenix.worker")
    url = settings.redis_url.get_secret_value()
    # Two pools: the runtime decodes entries itself (bytes), processors get the friendlier str client.
    stream_client = aioredis.Redis.from_url(url, decode_responses=False, health_check_interval=30)
    app_client = aioredis.Redis.from_url(url, decode_responses=True, health_check_interval=30)
    processor = processor_class()
    processor.redis = app_client
    processor.logger = structlog.get_logger(processor_class.name or processor_class.__name__)
    processor.settings = settings
    worker = Worker(settings, processor, stream_client)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.request_stop)
    runner = None
    try:
        await processor.initialize()
        if settings.health_port:
            runner = await start_health_server(settings.health_port, alive=worker.alive, ready=worker.ready)
        await worker.run()
    finally:
        await processor.cleanup()
        if runner:
            await runner.cleanup()
        await stream_client.aclose()
        await app_client.aclose()
    log.info("worker_exit")
    return 0
