"""A stage's rate limits (spec.rateLimits, the worker's RATE_LIMITS): one model for the PhoenixStage field and the
worker's variable, so both refuse the same limits. The worker enforces them (worker_runtime/rate_limit.py).

Each limit allows `rate` units per `per` (second, minute, hour) with `burst` units at once, counted for the stage as
a whole (`scope: stage`), for each record's user (`user`), or for a named downstream that several stages of the
namespace share (`downstream`, with `downstream: <name>`: one provider quota used by the parser and the grouper). A
unit is a record (`cost: records`) or what the processor reports a call cost (`cost: tokens`, report_cost).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

_SECONDS = {"second": 1, "minute": 60, "hour": 3600}
_NEEDS_DOWNSTREAM = "a limit of scope downstream names its downstream, and only such a limit does"


class RateLimit(BaseModel):
    """One limit: `rate` units per `per`, `burst` at once, for its `scope`."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.downstream) == (has(self.scope) && self.scope == 'downstream')",
                    "message": _NEEDS_DOWNSTREAM,
                }
            ]
        },
    )

    rate: float = Field(gt=0, le=1_000_000, description="Units allowed per `per`.")
    per: Literal["second", "minute", "hour"] = Field(default="second", description="The period `rate` counts.")
    burst: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Units allowed at once. Default: the rate per second, at least 1."
    )
    scope: Literal["stage", "user", "downstream"] = Field(
        default="stage",
        description="What the limit counts: the stage's records from every pod (`stage`), each record's user's "
        "(`user`), or a downstream's, shared by every stage of the namespace naming it (`downstream`).",
    )
    downstream: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="The downstream's name (scope downstream only), e.g. `openai`.",
    )
    cost: Literal["records", "tokens"] = Field(
        default="records",
        description="What a unit is: a record, or what the processor reports its call cost (`report_cost`), e.g. "
        "tokens for a tokens-per-minute quota.",
    )

    @model_validator(mode="after")
    def _downstream_named(self) -> RateLimit:
        if (self.downstream is not None) != (self.scope == "downstream"):
            raise ValueError(_NEEDS_DOWNSTREAM)
        return self

    @property
    def interval_ms(self) -> float:
        """Milliseconds per unit."""
        return _SECONDS[self.per] * 1000 / self.rate

    @property
    def capacity(self) -> int:
        """`burst`, or the rate per second (at least 1)."""
        return self.burst if self.burst is not None else max(1, int(self.rate / _SECONDS[self.per]))
