"""Turns pydantic's JSON Schema into a Kubernetes structural OpenAPI v3 schema.

Kubernetes accepts a subset of OpenAPI v3.0 (no $ref, no nullable unions, boolean exclusiveMinimum, anyOf only
for int-or-string); pydantic emits JSON Schema 2020-12. Unknown keywords raise, so a pydantic upgrade cannot
slip an invalid schema into the CRD unnoticed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from phoenix.errors import PhoenixError

# Emitted in this order so the generated YAML reads top-down: what it is, then constraints, then children.
_KEY_ORDER = (
    "description",
    "type",
    "format",
    "default",
    "enum",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "anyOf",
    "items",
    "required",
    "properties",
    "additionalProperties",
)
_DROPPED = frozenset({"title", "examples", "$defs"})


class SchemaConversionError(PhoenixError, ValueError):
    """pydantic produced something a structural schema cannot express."""


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's validation schema (camelCase field names) as a Kubernetes structural schema."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}), path=model.__name__)


def _inline(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Replace $ref by its target; keywords beside the $ref (a field's description) win over the target's."""
    while "$ref" in node:
        target = defs[node["$ref"].removeprefix("#/$defs/")]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _drop_null(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`X | None` fields: Kubernetes expresses absence by omission, so keep X and forget null."""
    if not _nullable(node):
        return node
    branches = node["anyOf"]
    rest = [b for b in branches if b.get("type") != "null"]
    if len(rest) != 1:
        raise SchemaConversionError(f"union of several non-null types is not structural: {branches}")
    merged = {**_inline(rest[0], defs), **{k: v for k, v in node.items() if k != "anyOf"}}
    if merged.get("default", ...) is None:
        del merged["default"]
    return merged


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = _drop_null(_inline(node, defs), defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            required = set(node.get("required", ()))
            out[key] = {
                name: _with_object_default(
                    _convert(child, defs, f"{path}.{name}"),
                    always_present=name not in required and not _nullable(child),
                )
                for name, child in value.items()
            }
        elif key == "items":
            out[key] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _convert(value, defs, f"{path}{{}}")
            # `false` (pydantic's extra="forbid") is implied: the apiserver prunes unknown fields.
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out[key.replace("exclusiveM", "m")] = value
            out[key] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "anyOf":
            if not node.get("x-kubernetes-int-or-string"):
                raise SchemaConversionError(f"{path}: anyOf is only structural for int-or-string, got {value}")
            out[key] = value
        elif key in _KEY_ORDER or key.startswith("x-kubernetes-"):
            out[key] = value
        else:
            raise SchemaConversionError(f"{path}: keyword {key!r} has no structural equivalent")
    return _ordered(out)


def _nullable(node: dict[str, Any]) -> bool:
    return any(branch.get("type") == "null" for branch in node.get("anyOf", ()))


def _with_object_default(schema: dict[str, Any], always_present: bool) -> dict[str, Any]:
    """An optional, non-nullable nested object (a default_factory field) gets its fields' defaults as its own,
    so `kubectl get -o yaml` shows the effective settings. Spelled out rather than `{}`: the apiserver checks
    a default against the object's CEL rules before defaulting its fields."""
    if always_present and schema.get("type") == "object" and "properties" in schema and "default" not in schema:
        defaults = {name: child["default"] for name, child in schema["properties"].items() if "default" in child}
        return _ordered({**schema, "default": defaults})
    return schema


def _ordered(schema: dict[str, Any]) -> dict[str, Any]:
    rank = {key: i for i, key in enumerate(_KEY_ORDER)}
    return dict(sorted(schema.items(), key=lambda item: rank.get(item[0], len(rank))))
