"""Why a stage cannot be reconciled, as a condition reason and a message that never holds a secret; and how long
the operator waits before it tries again."""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes.client.exceptions import ApiException

from phoenix.backoff import delay
from phoenix.errors import PhoenixError

# A failed reconcile, deletion or converger work waits 5 s, 10 s, 20 s, ... up to two minutes before its next try.
RETRY_BASE_SECONDS = 5.0
MAX_BACKOFF_SECONDS = 120.0


# Not frozen: Python writes an exception's __traceback__ as it passes through a `contextlib.contextmanager` (the
# reconcile's span), which a frozen dataclass refuses. eq=False keeps exceptions hashable by identity.
@dataclass(eq=False)
class StageError(PhoenixError):
    """`reason` is a CamelCase condition reason; `permanent` errors wait for a spec change instead of a retry."""

    reason: str
    message: str
    permanent: bool = False

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


def api_error(exc: ApiException) -> StageError:
    """A refusal of the Kubernetes API as a (retried) StageError."""
    return StageError("KubernetesApiError", f"{exc.status} {exc.reason}: {exc.body!s:.500}")


def retry_delay(attempt: int) -> float:
    """Seconds before try `attempt + 1` of a stage's failed operation (kopf's `retry`, the converger's attempts)."""
    return delay(attempt, RETRY_BASE_SECONDS, MAX_BACKOFF_SECONDS)
