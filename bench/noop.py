"""A processor that does nothing, so the benchmark measures the runtime alone."""

from collections.abc import Sequence
from typing import Any

from phoenix.worker_runtime import BaseProcessor, BatchResult, Record


class NoopProcessor(BaseProcessor):
    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        return data


class BatchNoopProcessor(BaseProcessor):
    """The same no-op, as a batch processor: the runtime's cost per record when records come in batches."""

    async def process_batch(self, records: Sequence[Record]) -> list[BatchResult]:
        return [record.data for record in records]
