"""The generic stage worker: everything hard about consuming a Redis stream, so processors stay small."""

from phoenix.worker_runtime.processor import (
    BaseProcessor,
    BatchResult,
    PermanentError,
    ProcessResult,
    Record,
    RecordNotFoundError,
    Routed,
)

__all__ = [
    "BaseProcessor",
    "BatchResult",
    "PermanentError",
    "ProcessResult",
    "Record",
    "RecordNotFoundError",
    "Routed",
]
