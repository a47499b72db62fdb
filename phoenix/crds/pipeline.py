"""PhoenixPipeline: the stages of one pipeline as one object, each stage's spec inline (the PhoenixStage schema),
its edges the stages' own `output.stage` and named `outputs`. The operator makes one PhoenixStage per entry
(operator/pipeline/)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from graphlib import CycleError, TopologicalSorter

from pydantic import BaseModel, ConfigDict, Field, model_validator

from phoenix.crds.common import CamelModel, cel
from phoenix.crds.resource import API_VERSION, GROUP, StageMetadata
from phoenix.crds.spec import DeletionPolicy, PhoenixStageSpec, StageName
from phoenix.crds.status import Condition, LatencyStatus, StatusModel
from phoenix.keys import DEFAULT_NAMESPACE

PIPELINE_KIND = "PhoenixPipeline"
PIPELINE_PLURAL = "phoenixpipelines"
PIPELINE_SINGULAR = "phoenixpipeline"
PIPELINE_SHORT_NAMES = ("phxp",)
PIPELINE_CRD_NAME = f"{PIPELINE_PLURAL}.{GROUP}"
# Bounds the CEL rules' cost (each stage's own rules count once per entry) and a pipeline's status.
MAX_STAGES = 16

_UNIQUE_NAMES = "spec.stages: each stage's name must be unique in the pipeline"
_EDGE_INSIDE = (
    "spec.stages: an output.stage or outputs[].stage must name a stage of this pipeline (a pipeline's edges stay "
    "inside it: to feed a stream or stage elsewhere, use output.stream)"
)
_EDGE_TO_DEFAULT_INPUT = (
    "spec.stages: an output.stage or outputs[].stage must name a stage that reads its default input (they write "
    "to phoenix:{<namespace>}:<stage>:input): a stage that sets spec.input is fed with output.stream"
)
_NO_SELF_EDGE = (
    "spec.stages: a stage's output.stage or outputs[].stage must not name the stage itself (a pipeline has no cycle)"
)
_CYCLE = "spec.stages: the stages' edges (output.stage, outputs[].stage) must not form a cycle (a pipeline is a DAG)"


class PipelineStage(CamelModel):
    """One stage of the pipeline: the PhoenixStage of this name, made and kept by the operator."""

    name: StageName = Field(description="The PhoenixStage's name, in the pipeline's namespace.")
    spec: PhoenixStageSpec = Field(description="The stage's spec, the schema of a PhoenixStage's.")


def next_stages(spec: PhoenixStageSpec) -> tuple[str, ...]:
    """The stages a stage's results go to by name (its output.stage, or each of its named outputs' stage): the
    edges of the pipeline's graph."""
    if spec.outputs is not None:
        return tuple(dict.fromkeys(output.stage for output in spec.outputs))
    output = spec.output
    return () if output is None or output.stage is None else (output.stage,)


def find_cycle(upstream: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle of the graph (stage -> the stages feeding it) as its path in the direction records flow, the first
    stage repeated at the end; None for a DAG."""
    try:
        TopologicalSorter(upstream).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return None


def _edges_cel(rule: str) -> str:
    """`rule` over every edge of every stage `s`, `{target}` in it the name of the edge's next stage (output.stage,
    outputs[].stage)."""
    one = f"(!has(s.spec.output) || !has(s.spec.output.stage) || {rule.format(target='s.spec.output.stage')})"
    named = f"(!has(s.spec.outputs) || s.spec.outputs.all(o, {rule.format(target='o.stage')}))"
    return f"self.stages.all(s, {one} && {named})"


class PhoenixPipelineSpec(CamelModel):
    """A pipeline: its stages and, through their output.stage, its edges; what applies to all of them."""

    model_config = cel(
        ("self.stages.all(s, self.stages.exists_one(t, t.name == s.name))", _UNIQUE_NAMES),
        (_edges_cel("self.stages.exists(t, t.name == {target})"), _EDGE_INSIDE),
        (_edges_cel("!self.stages.exists(t, t.name == {target} && has(t.spec.input))"), _EDGE_TO_DEFAULT_INPUT),
        (_edges_cel("{target} != s.name"), _NO_SELF_EDGE),
    )

    stages: list[PipelineStage] = Field(
        min_length=1,
        max_length=MAX_STAGES,
        description="The stages, each made a PhoenixStage of its name with the pipeline as its owner. Edges: a "
        "stage's output.stage (or each of its named outputs' stage) names another stage of the pipeline; names are "
        "unique, the graph has no cycle.",
    )
    paused: bool = Field(
        default=False,
        description="Pause the whole pipeline: the first stages at once, then each next stage once the stages "
        "feeding it are paused and it has drained (no backlog, nothing in flight); a resume resumes all at once. "
        "While false, each stage's own spec.paused holds.",
    )
    deletion_policy: DeletionPolicy | None = Field(
        default=None,
        strict=False,
        description="When set, every stage's deletionPolicy (Retain or Delete of its Redis data when the stage "
        "goes: when the pipeline is deleted, or the stage removed from it); unset: each stage's own.",
    )

    @model_validator(mode="after")
    def _a_dag_of_unique_names(self) -> PhoenixPipelineSpec:
        names = [stage.name for stage in self.stages]
        if repeated := sorted({name for name in names if names.count(name) > 1}):
            raise ValueError(f"{_UNIQUE_NAMES} (repeated: {', '.join(repeated)})")
        by_name = {stage.name: stage.spec for stage in self.stages}
        for stage in self.stages:
            for target in next_stages(stage.spec):
                if target not in by_name:
                    raise ValueError(f"{_EDGE_INSIDE} (stage {stage.name}: {target}; stages: {', '.join(names)})")
                if by_name[target].input is not None:
                    raise ValueError(f"{_EDGE_TO_DEFAULT_INPUT} (stage {stage.name}: {target})")
                if target == stage.name:
                    raise ValueError(f"{_NO_SELF_EDGE} (stage {stage.name})")
        if cycle := find_cycle(self.upstream()):
            raise ValueError(f"{_CYCLE} (found {' -> '.join(cycle)})")
        return self

    def edges(self) -> dict[str, tuple[str, ...]]:
        """Each stage's next stages."""
        return {stage.name: next_stages(stage.spec) for stage in self.stages}

    def upstream(self) -> dict[str, tuple[str, ...]]:
        """Each stage's feeding stages (none for a first stage)."""
        edges = self.edges()
        return {name: tuple(src for src, targets in edges.items() if name in targets) for name in edges}


class PipelineStageStatus(StatusModel):
    """One stage as the pipeline sees it: from its PhoenixStage's status."""

    name: str = Field(max_length=63, description="The PhoenixStage.")
    state: str = Field(
        max_length=32,
        description="Ready, NotReady, Missing (not made yet), NotOwned (a PhoenixStage of this name the pipeline "
        "does not own: refused) or Paused.",
    )
    input: str | None = Field(default=None, max_length=600, description="The stream producers write to.")
    backlog: int | None = Field(default=None, ge=0, description="Entries not yet delivered (its queue.lag).")
    in_flight: int | None = Field(default=None, ge=0, description="Entries delivered, not acknowledged (pending).")
    dlq: int | None = Field(default=None, ge=0, description="Entries in its dead-letter stream.")
    oldest_unfinished_seconds: int | None = Field(default=None, ge=0, description="Age of its oldest unfinished entry.")


class PhoenixPipelineStatus(StatusModel):
    """Observed state of the pipeline: sums over its stages' own status (no Redis read of its own)."""

    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last handled.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description="Ready (every stage made, owned and Ready), StagesReady (how many are) and Paused.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    ready: str | None = Field(default=None, max_length=16, description="`ready/total` stages, for `kubectl get`.")
    backlog: int | None = Field(default=None, ge=0, description="Undelivered entries, summed over the stages.")
    in_flight: int | None = Field(default=None, ge=0, description="Pending entries, summed over the stages.")
    dlq: int | None = Field(default=None, ge=0, description="Dead letters, summed over the stages.")
    oldest_unfinished_seconds: int | None = Field(
        default=None,
        ge=0,
        description="The oldest unfinished entry anywhere in the pipeline: the largest of the stages' own.",
    )
    latency: LatencyStatus | None = Field(
        default=None,
        description="End-to-end latency over the last minutes: the buckets of every final stage's status.latency "
        "merged, then P50 and P99 (the P99 column); absent while no record was finished in them.",
    )
    stages: list[PipelineStageStatus] = Field(
        default_factory=list, max_length=MAX_STAGES, description="Each stage, in the spec's order."
    )
    last_fan_out: datetime | None = Field(
        default=None, description="When a restart or DLQ replay asked of the pipeline was last passed to its stages."
    )
    handled_restart: str | None = Field(
        default=None, max_length=256, description="The `phoenix.io/restart` value last passed to the stages."
    )


class PhoenixPipeline(BaseModel):
    """A whole PhoenixPipeline object, e.g. a sample manifest or a watch event's body."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: str = Field(alias="apiVersion")
    kind: str
    metadata: StageMetadata
    spec: PhoenixPipelineSpec
    status: PhoenixPipelineStatus | None = None

    @model_validator(mode="after")
    def _is_phoenix_pipeline(self) -> PhoenixPipeline:
        if (self.api_version, self.kind) != (API_VERSION, PIPELINE_KIND):
            raise ValueError(
                f"expected apiVersion {API_VERSION} kind {PIPELINE_KIND}, got {self.api_version} {self.kind}"
            )
        return self

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or DEFAULT_NAMESPACE
