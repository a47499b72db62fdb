"""The worker settings a PhoenixStage tunes, written once: each one's variable, default and the bounds a spec may
give it. The CRD's models (phoenix.crds.spec) take their defaults and bounds from here, the worker's settings
(phoenix.worker_runtime.settings) their defaults, and the operator writes each as its variable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

# A setting's number: whole (counts, seconds of the spec's integers) or not (seconds of a float field).
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Tunable(Generic[N]):
    """One tuned setting. The bounds are the spec's: the worker accepts them and more (sub-second timeouts, a
    larger CONCURRENCY), which tests and the benchmark use; tests/test_tuning.py holds the two together."""

    env: str
    default: N
    minimum: N
    maximum: N
    # A minimum the value must exceed (seconds above 0) rather than reach.
    exclusive_minimum: bool = False

    @property
    def setting(self) -> str:
        """The WorkerSettings field read from the variable."""
        return self.env.lower()


LOCK_TIMEOUT = Tunable("LOCK_TIMEOUT", 600, 1, 86400)
IDEMPOTENCY_TTL = Tunable("IDEMPOTENCY_TTL", 86400, 1, 2_592_000)
PROCESSING_TIMEOUT = Tunable("PROCESSING_TIMEOUT", 600, 1, 86400)
CLAIM_IDLE_MS = Tunable("CLAIM_IDLE_MS", 300_000, 1000, 86_400_000)
CONCURRENCY = Tunable("CONCURRENCY", 1, 1, 256)
MAX_DELIVERIES = Tunable("MAX_DELIVERIES", 10, 1, 1000)
RETRY_BASE_SECONDS = Tunable("RETRY_BASE_SECONDS", 2.0, 0, 3600, exclusive_minimum=True)
RETRY_MAX_SECONDS = Tunable("RETRY_MAX_SECONDS", 300.0, 0, 86400, exclusive_minimum=True)
CIRCUIT_FAILURE_THRESHOLD = Tunable("CIRCUIT_FAILURE_THRESHOLD", 5, 1, 1000)
CIRCUIT_RESET_TIMEOUT = Tunable("CIRCUIT_RESET_TIMEOUT", 60.0, 0, 3600, exclusive_minimum=True)
CIRCUIT_HALF_OPEN_CALLS = Tunable("CIRCUIT_HALF_OPEN_CALLS", 3, 1, 100)

# In the order the operator writes them.
TUNABLES: tuple[Tunable[int] | Tunable[float], ...] = (
    LOCK_TIMEOUT,
    IDEMPOTENCY_TTL,
    PROCESSING_TIMEOUT,
    CLAIM_IDLE_MS,
    CONCURRENCY,
    MAX_DELIVERIES,
    RETRY_BASE_SECONDS,
    RETRY_MAX_SECONDS,
    CIRCUIT_FAILURE_THRESHOLD,
    CIRCUIT_RESET_TIMEOUT,
    CIRCUIT_HALF_OPEN_CALLS,
)
