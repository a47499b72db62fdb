"""Small reusable pieces of the PhoenixStage schema: the camelCase base model and Kubernetes-style types."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

# The apiserver checks these patterns with Go's RE2, pydantic with Rust's regex: keep them to the common subset.
# No minus sign: Kubernetes refuses a negative resource quantity.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
# Bounds CEL's cost estimate of the rules comparing quantities (spec.resources); no real quantity is near it.
QUANTITY_MAX_LENGTH = 64


class CamelModel(BaseModel):
    """Fields are snake_case in Python and camelCase on the wire, like every Kubernetes API."""

    # extra="forbid" turns a typo in a manifest into an error instead of a silently ignored field; strict, a value
    # of another JSON type (`"true"` for a boolean, `1` for `true`), which the CRD's schema refuses too. (A StrEnum
    # field takes its value's string: `Field(strict=False)`.)
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True)

    def to_k8s(self) -> dict[str, Any]:
        """The wire form: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def cel(*rules: tuple[str, str]) -> ConfigDict:
    """Model config carrying CEL rules that the apiserver enforces; each model re-checks them in Python."""
    return ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [{"rule": rule, "message": msg} for rule, msg in rules]}
    )


def cel_list(words: tuple[str, ...]) -> str:
    """A CEL list literal of strings."""
    return "[" + ", ".join(f"'{word}'" for word in words) + "]"


def _check_quantity(value: int | str) -> int | str:
    if (isinstance(value, int) and value < 0) or (
        isinstance(value, str) and (len(value) > QUANTITY_MAX_LENGTH or not _QUANTITY_RE.fullmatch(value))
    ):
        raise ValueError(f"{value!r} is not a Kubernetes quantity of a resource (e.g. 100m, 0.5, 128Mi, 1G)")
    return value


# Mirrors how Kubernetes' own CRDs describe resource.Quantity: an int-or-string with the quantity pattern.
Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "maxLength": QUANTITY_MAX_LENGTH,
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]

# Names of Kubernetes objects referenced by the spec (Secrets): DNS-1123 subdomains.
ObjectName = Annotated[
    str,
    Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"),
]

# Without spaces and control characters, spelled out: `\S` means Unicode's whitespace to pydantic's engine and
# ASCII's only to the API server's (RE2), which so admitted a name with a vertical tab or a no-break space.
NO_SPACE_PATTERN = r"^[^\x00-\x20\x7f-\x9f]+$"
# A Redis key (stream) or consumer group name: any non-blank string without spaces or control characters.
RedisName = Annotated[str, Field(min_length=1, max_length=512, pattern=NO_SPACE_PATTERN)]


class SecretKeyRef(CamelModel):
    """One key of a Secret in the PhoenixStage's namespace."""

    name: ObjectName = Field(description="Name of the Secret, in the same namespace as the PhoenixStage.")
    key: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="Key inside the Secret's data.",
    )


class SecretRef(CamelModel):
    """A whole Secret in the PhoenixStage's namespace, by name (its keys are fixed by its type)."""

    name: ObjectName = Field(description="Name of the Secret, in the same namespace as the PhoenixStage.")
