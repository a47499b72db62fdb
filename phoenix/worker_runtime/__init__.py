"""The generic stage worker: everything hard about consuming a Redis stream, so processors stay small."""

from phoenix.worker_runtime.processor import (
    BaseProcessor,
    BatchResult,
    PermanentError,
    ProcessResult,
    RateLimited,
    Record,
    RecordNotFoundError,
    Routed,
)
from phoenix.worker_runtime.rate_limit import report_cost

__all__ = [
    "BaseProcessor",
    "BatchResult",
    "PermanentError",
    "ProcessResult",
    "RateLimited",
    "Record",
    "RecordNotFoundError",
    "Routed",
    "report_cost",
]
