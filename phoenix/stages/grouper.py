"""Grouper stage: gather the record's biomarkers under canonical names, with values in one unit per test."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings

from phoenix.stages.biomarker_groups import group_biomarkers
from phoenix.stages.data_keys import grouped_key, parsed_key
from phoenix.stages.models import Findings, GroupList
from phoenix.worker_runtime import BaseProcessor, RecordNotFoundError


class GrouperSettings(BaseSettings):
    """GROUPED_TTL: how long the grouped biomarkers, and the findings they came from, stay in Redis."""

    grouped_ttl: int = Field(86400, gt=0)


class GrouperProcessor(BaseProcessor):
    config: GrouperSettings

    async def initialize(self) -> None:
        self.config = GrouperSettings()

    async def process(self, record_id: str, user_id: str, data: dict[str, Any]) -> dict[str, Any]:
        namespace = self.settings.key_namespace
        source = parsed_key(namespace, record_id)
        raw = await self.redis.get(source)
        if raw is None:
            raise RecordNotFoundError(
                f"no findings for record {record_id} at {source}: never parsed, or expired "
                "GROUPED_TTL after an earlier grouping"
            )
        groups = group_biomarkers(Findings.model_validate_json(raw).biomarkers)
        key = grouped_key(namespace, record_id)
        # One transaction: the findings get their lifetime only together with the groups made from them.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(key, GroupList.dump_json(groups), ex=self.config.grouped_ttl)
            pipe.expire(source, self.config.grouped_ttl)
            await pipe.execute()
        mixed = sum(group.mixed_units for group in groups)
        self.logger.info("biomarkers_grouped", record_id=record_id, groups=len(groups), mixed_unit_groups=mixed)
        return {"grouped_key": key, "group_count": len(groups), "mixed_unit_groups": mixed}
