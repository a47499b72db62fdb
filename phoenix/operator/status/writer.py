"""Writes PhoenixStage status: merges changes into what is known, recomputes Ready, patches only differences."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from phoenix.crds import Condition
from phoenix.operator.kube.api import KubeApi
from phoenix.operator.record import StageRecord
from phoenix.operator.status.conditions import set_condition
from phoenix.operator.status.readiness import ready_condition


def merged_status(
    current: Mapping[str, Any],
    changes: Mapping[str, Any],
    conditions: Iterable[Condition],
    error: Condition | None,
    generation: int | None,
) -> dict[str, Any]:
    """The status after `changes` (None removes a field) and `conditions`, with Ready derived from the rest."""
    status = {key: value for key, value in {**current, **changes}.items() if value is not None}
    merged: list[dict[str, Any]] = list(status.get("conditions", []))
    for condition in conditions:
        merged = set_condition(merged, condition)
    status["conditions"] = set_condition(merged, ready_condition(merged, error, generation))
    return status


def status_patch(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch (RFC 7386) turning `current` into `new`: objects hold only their fields that changed, lists are
    replaced whole (a refresh where only the backlog moved sends that one figure)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = current.get(key)
        if before == value:
            continue
        if isinstance(before, Mapping) and isinstance(value, Mapping):
            patch[key] = status_patch(before, value)
        else:
            patch[key] = value
    patch.update({key: None for key in current if key not in new})
    return patch


class StatusWriter:
    """Writes a stage's status subresource, only the fields that changed."""

    def __init__(self, kube: KubeApi) -> None:
        self._kube = kube

    @staticmethod
    def _next(
        record: StageRecord, changes: Mapping[str, Any] | None, conditions: Iterable[Condition]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The status after `changes` and `conditions`, and the patch from the one we know to it."""
        new = merged_status(record.status, changes or {}, conditions, record.error, record.generation)
        # Fields other writers own (kopf's, say) are not ours to remove: compare only what we know.
        return new, status_patch(record.status, new)

    @classmethod
    def pending(
        cls, record: StageRecord, changes: Mapping[str, Any] | None = None, conditions: Iterable[Condition] = ()
    ) -> dict[str, Any]:
        """The patch update() would write now with these `changes` and `conditions` (empty: nothing changed)."""
        return cls._next(record, changes, conditions)[1]

    async def update(
        self, record: StageRecord, changes: Mapping[str, Any] | None = None, conditions: Iterable[Condition] = ()
    ) -> bool:
        """Apply `changes` and `conditions`; True when something was patched."""
        async with record.status_lock:
            new, patch = self._next(record, changes, conditions)
            if not patch:
                return False
            if await self._kube.patch_stage_status(record.namespace, record.name, patch):
                record.status = new
                return True
            return False

    async def claim(self, record: StageRecord, field: str, value: Any, annotation: str, expected: str) -> bool:
        """Set status.<field> to `value` only while the stage's annotation still holds `expected` on the server:
        a stale view of an annotation already handled and removed can never start its work again."""
        async with record.status_lock:
            claimed = await self._kube.add_status_field_if_annotated(
                record.namespace, record.name, annotation, expected, field, value, has_status=bool(record.status)
            )
            if claimed:
                record.status = {**record.status, field: value}
            return claimed
