"""Per-worker circuit breaker: stop hammering a failing dependency, probe it, and resume."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("phoenix.circuit")


class CircuitState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    """CLOSED -> `failure_threshold` consecutive failures -> OPEN -> `reset_timeout` -> HALF_OPEN, which admits
    `half_open_calls` trial calls: that many successes close it, any failure opens it again."""

    def __init__(
        self,
        failure_threshold: int,
        reset_timeout: float,
        half_open_calls: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[CircuitState], None] = lambda state: None,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.reset_timeout = reset_timeout
        self.half_open_calls = half_open_calls
        self._clock = clock
        self._on_change = on_change
        self._state = CircuitState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trials_started = 0
        self._trial_successes = 0

    @property
    def state(self) -> CircuitState:
        if self._state is CircuitState.OPEN and self.seconds_until_half_open() == 0:
            self._transition(CircuitState.HALF_OPEN)
        return self._state

    def seconds_until_half_open(self) -> float:
        if self._state is not CircuitState.OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.reset_timeout - self._clock())

    def trial_slots(self) -> int | None:
        """How many more calls may start now: None for unlimited (closed), 0 while open."""
        state = self.state
        if state is CircuitState.CLOSED:
            return None
        if state is CircuitState.OPEN:
            return 0
        return self.half_open_calls - self._trials_started

    def try_acquire(self) -> bool:
        """Called right before the protected call; False means fail fast."""
        if self._state is CircuitState.CLOSED:
            return True  # the common case, first
        slots = self.trial_slots()
        if slots is None:
            return True
        if slots <= 0:
            return False
        self._trials_started += 1
        return True

    def record_success(self) -> None:
        if self._state is CircuitState.HALF_OPEN:
            self._trial_successes += 1
            if self._trial_successes >= self.half_open_calls:
                self._transition(CircuitState.CLOSED)
        self._failures = 0

    def record_failure(self) -> None:
        if self._state is CircuitState.HALF_OPEN:
            self._transition(CircuitState.OPEN)
            return
        self._failures += 1
        if self._state is CircuitState.CLOSED and self._failures >= self.failure_threshold:
            self._transition(CircuitState.OPEN)

    def _transition(self, state: CircuitState) -> None:
        previous, self._state = self._state, state
        self._failures = 0
        self._trials_started = 0
        self._trial_successes = 0
        if state is CircuitState.OPEN:
            self._opened_at = self._clock()
        log.warning("circuit_state_changed", previous=previous.name, state=state.name)
        self._on_change(state)
