"""Status conditions per the Kubernetes API conventions: lastTransitionTime moves only when status changes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from phoenix.crds import Condition, ConditionType


def new_condition(
    type_: ConditionType,
    status: bool | None,
    reason: str,
    message: str = "",
    *,
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> Condition:
    """A condition stamped `now` (UTC, whole seconds like metav1.Time); status None means Unknown."""
    when = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
    return Condition(
        type=type_,
        status="Unknown" if status is None else str(status),
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=observed_generation,
    )


def set_condition(conditions: Iterable[Mapping[str, Any]], update: Condition) -> list[dict[str, Any]]:
    """`conditions` (wire form, e.g. from status) with `update` merged in, order kept, new types appended.

    An unchanged status keeps the old lastTransitionTime, so the time says how long the state has held.
    """
    wire = update.to_k8s()
    merged: list[dict[str, Any]] = []
    found = False
    for existing in conditions:
        if existing.get("type") != update.type:
            merged.append(dict(existing))
            continue
        found = True
        if existing.get("status") == update.status and existing.get("lastTransitionTime"):
            wire["lastTransitionTime"] = existing["lastTransitionTime"]
        merged.append(wire)
    if not found:
        merged.append(wire)
    return merged


def find_condition(conditions: Iterable[Mapping[str, Any]], type_: ConditionType) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)
