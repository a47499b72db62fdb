"""A processor that does nothing, so the benchmark measures the runtime alone."""

from typing import Any

from phoenix.worker_runtime import BaseProcessor


class NoopProcessor(BaseProcessor):
    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        return data
