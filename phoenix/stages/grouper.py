"""Grouper stage: gather the record's biomarkers under canonical names, with values in one unit per test."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from phoenix.stages.biomarker_groups import group_biomarkers
from phoenix.stages.keys import grouped_key, parsed_key
from phoenix.stages.models import Findings, GroupList
from phoenix.worker_runtime import BaseProcessor, RecordNotFoundError


class GrouperSettings(BaseSettings):
    """GROUPED_TTL: how long the grouped biomarkers stay in Redis."""

    grouped_ttl: int = Field(86400, gt=0)


class GrouperProcessor(BaseProcessor):
    config: GrouperSettings

    async def initialize(self) -> None:
        self.config = GrouperSettings()

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        raw = await self.redis.get(parsed_key(record_id))
        if raw is None:
            raise RecordNotFoundError(f"no findings for record {record_id} at {parsed_key(record_id)}: expired?")
        groups = group_biomarkers(Findings.model_validate_json(raw).biomarkers)
        key = grouped_key(record_id)
        await self.redis.set(key, GroupList.dump_json(groups), ex=self.config.grouped_ttl)
        mixed = sum(group.mixed_units for group in groups)
        self.logger.info("biomarkers_grouped", record_id=record_id, groups=len(groups), mixed_unit_groups=mixed)
        return {"grouped_key": key, "group_count": len(groups), "mixed_unit_groups": mixed}
