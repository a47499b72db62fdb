"""The threads behind `BaseProcessor.run_blocking`, and the ones that cannot be stopped.

Cancelling a call (PROCESSING_TIMEOUT, shutdown) cancels the wait, not the thread: Python cannot stop a thread,
so one stuck in library code keeps running and keeps a thread of the pool. Such a thread is counted as leaked until
it ends; the worker's /healthz fails when too many leak (MAX_LEAKED_THREADS), so the kubelet restarts the pod.
The pool is the runtime's own, not the event loop's default executor, so leaked threads never starve what the
runtime itself runs in threads (DNS lookups, /metrics).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

log = structlog.get_logger("phoenix.worker")

T = TypeVar("T")


class _Call:
    __slots__ = ("done", "leaked", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = self.leaked = False


class BlockingThreads:
    """One per process (threads are a process's resource); `leaked` is read by the worker's liveness check."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self.leaked = 0

    async def run(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`func(*args, **kwargs)` in a pool thread, with the caller's context variables (as asyncio.to_thread)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(thread_name_prefix="phoenix-blocking")
        loop = asyncio.get_running_loop()
        call = _Call(getattr(func, "__qualname__", repr(func)))
        context = contextvars.copy_context()

        def in_thread() -> T:
            try:
                return context.run(func, *args, **kwargs)
            finally:
                call.done = True
                if call.leaked:
                    loop.call_soon_threadsafe(self._ended, call)

        future = self._executor.submit(in_thread)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # cancel() drops a call still queued; one already running cannot be stopped and outlives its caller.
            if not future.cancel() and not call.done:
                call.leaked = True
                self.leaked += 1
                log.error("blocking_thread_leaked", function=call.name, leaked_threads=self.leaked)
                if call.done:  # it ended between the check and the flag, too early to see the flag
                    self._ended(call)
            raise

    def _ended(self, call: _Call) -> None:
        if call.leaked:
            call.leaked = False
            self.leaked -= 1
            log.info("leaked_thread_ended", function=call.name, leaked_threads=self.leaked)


#: The process's pool for run_blocking.
BLOCKING_THREADS = BlockingThreads()
