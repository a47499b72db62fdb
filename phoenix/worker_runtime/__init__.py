"""The generic stage worker: everything hard about consuming a Redis stream, so processors stay small."""

from phoenix.worker_runtime.processor import BaseProcessor, PermanentError, RecordNotFoundError

__all__ = ["BaseProcessor", "PermanentError", "RecordNotFoundError"]
