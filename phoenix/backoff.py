"""Exponential backoff: the one formula behind every wait-and-try-again in Phoenix.

Redis reconnects and failed reads or commits in the worker, the outbox relay, a failed message's retry delay
(held in Redis, see worker_runtime/retry.py) and the operator's reconcile retries all wait `base x 2^attempt`,
capped. `delay` is the formula for a caller that counts attempts itself (a message carries its retry count);
`Backoff` is the loop's companion that counts them: `failed()` before each wait, `succeeded()` once a try worked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# 2^62 x any base is beyond every cap, and keeps the power an exact float.
_MAX_EXPONENT = 62


def delay(attempt: int, base: float, cap: float) -> float:
    """Seconds to wait before try `attempt + 1`: base x 2^attempt, at most `cap`; attempt 0 waits `base`."""
    return min(base * 2 ** min(attempt, _MAX_EXPONENT), cap)


@dataclass
class Backoff:
    """The waits of one retry loop: `base`, 2 x `base`, ... up to `cap`, from `base` again after a success."""

    base: float
    cap: float
    attempts: int = field(default=0, init=False)

    def failed(self) -> float:
        """Count a failed try; the seconds to wait before the next."""
        wait = delay(self.attempts, self.base, self.cap)
        self.attempts += 1
        return wait

    def succeeded(self) -> None:
        self.attempts = 0
