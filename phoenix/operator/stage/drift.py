"""Whether a child object as it is in the cluster still matches what the operator wants (pure).

The wanted form holds only the fields the operator sets; everything else (server defaults, status, fields other
controllers own, such as KEDA's replica count) is left out of it and so never counts as drift. A None in the
wanted form means "must be absent" (the merge-patch convention), e.g. KEDA's pause annotations after an unpause.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import InvalidOperation
from typing import Any

from kubernetes.utils import parse_quantity

# The API server rewrites resource quantities in canonical form (0.5 -> 500m): compare those by value.
_QUANTITY_PARENTS = frozenset({"limits", "requests"})
_SHOWN = 3


def differences(wanted: Any, actual: Any, path: str = "") -> list[str]:
    """The paths (e.g. `spec.template.spec.containers[0].image`) where `actual` departs from `wanted`."""
    if isinstance(wanted, Mapping):
        if not isinstance(actual, Mapping):
            return [path or "."]
        found: list[str] = []
        for key, value in wanted.items():
            child = f"{path}.{key}" if path else str(key)
            if value is None:
                if actual.get(key) is not None:
                    found.append(child)
            elif key not in actual:
                # An absent map satisfies a wanted one that only asks for absences.
                found += differences(value, {}, child) if isinstance(value, Mapping) else [child]
            else:
                found += _leaf_or_deeper(value, actual[key], child, quantity=key in _QUANTITY_PARENTS)
        return found
    return _leaf_or_deeper(wanted, actual, path, quantity=False)


def _leaf_or_deeper(wanted: Any, actual: Any, path: str, quantity: bool) -> list[str]:
    if isinstance(wanted, Mapping):
        if quantity and isinstance(actual, Mapping):
            return [f"{path}.{k}" for k, v in wanted.items() if not _same_quantity(v, actual.get(k))]
        return differences(wanted, actual, path)
    if isinstance(wanted, list):
        # Lists are the operator's whole (env, containers, triggers): an extra or missing item is drift too.
        if not isinstance(actual, list) or len(actual) != len(wanted):
            return [path]
        pairs = enumerate(zip(wanted, actual, strict=True))
        return [found for i, (w, a) in pairs for found in differences(w, a, f"{path}[{i}]")]
    return [] if wanted == actual else [path]


def _same_quantity(wanted: Any, actual: Any) -> bool:
    if wanted == actual:
        return True
    try:
        return actual is not None and parse_quantity(wanted) == parse_quantity(actual)
    except (ValueError, InvalidOperation):
        return False


def describe(kind: str, name: str, paths: list[str]) -> str:
    """One line for an Event: what differed, the first few paths."""
    shown = ", ".join(paths[:_SHOWN]) + (f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else "")
    return f"{kind} {name} differed from the spec at {shown}"
