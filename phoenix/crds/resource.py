"""The PhoenixStage resource: API coordinates and the whole object as kopf hands it to handlers."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from phoenix.crds.spec import PhoenixStageSpec, StageName
from phoenix.crds.status import PhoenixStageStatus
from phoenix.keys import DEFAULT_NAMESPACE

GROUP = "phoenix.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "PhoenixStage"
PLURAL = "phoenixstages"
SINGULAR = "phoenixstage"
SHORT_NAMES = ("phx",)


class StageMetadata(BaseModel):
    """The metadata fields Phoenix relies on; the rest of ObjectMeta passes through untouched."""

    model_config = ConfigDict(extra="allow")

    name: StageName
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None


class PhoenixStage(BaseModel):
    """A whole PhoenixStage object, e.g. a sample manifest or the body of a kopf event."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: str = Field(alias="apiVersion")
    kind: str
    metadata: StageMetadata
    spec: PhoenixStageSpec
    status: PhoenixStageStatus | None = None

    @model_validator(mode="after")
    def _is_phoenix_stage(self) -> PhoenixStage:
        if (self.api_version, self.kind) != (API_VERSION, KIND):
            raise ValueError(f"expected apiVersion {API_VERSION} kind {KIND}, got {self.api_version} {self.kind}")
        return self

    @property
    def namespace(self) -> str:
        """The stage's namespace (a manifest may leave it out: `kubectl apply` puts it in `default`); it scopes the
        stage's Redis keys (phoenix.keys)."""
        return self.metadata.namespace or DEFAULT_NAMESPACE

    @classmethod
    def from_body(cls, body: Any) -> PhoenixStage:
        """Validate a kopf body (a Mapping) or a plain dict."""
        return cls.model_validate(dict(body))
