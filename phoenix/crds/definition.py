"""The PhoenixStage and PhoenixPipeline CustomResourceDefinitions, assembled from the models."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from phoenix.crds.pipeline import (
    PIPELINE_CRD_NAME,
    PIPELINE_KIND,
    PIPELINE_PLURAL,
    PIPELINE_SHORT_NAMES,
    PIPELINE_SINGULAR,
    PhoenixPipelineSpec,
    PhoenixPipelineStatus,
)
from phoenix.crds.resource import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from phoenix.crds.schema import structural_schema
from phoenix.crds.spec import STAGE_NAME_PATTERN, PhoenixStageSpec
from phoenix.crds.status import PhoenixStageStatus

CRD_NAME = f"{PLURAL}.{GROUP}"

# The queue figures' age: the operator writes a stage's moved figures within 3 status refreshes
# (operator/stage/refresh.py FIGURES_MAX_CYCLES; --refresh-interval is 10 s by default).
FIGURES_AGE = ", written within 3 status refreshes (10 s apart by default)"

_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Replicas", "type": "string", "jsonPath": ".status.replicas.summary", "description": "ready/desired"},
    {
        "name": "Backlog",
        "type": "integer",
        "jsonPath": ".status.queue.lag",
        "description": "Undelivered entries" + FIGURES_AGE,
    },
    {
        "name": "Pending",
        "type": "integer",
        "jsonPath": ".status.queue.pending",
        "description": "Unacknowledged" + FIGURES_AGE,
    },
    {
        "name": "DLQ",
        "type": "integer",
        "jsonPath": ".status.queue.dlqLength",
        "description": "Dead letters" + FIGURES_AGE,
    },
    {
        "name": "Throttled",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Backpressure")].status',
        "description": "True while the stage waits for the next stage to drain its output (backpressure)",
    },
    {
        "name": "Oldest",
        "type": "integer",
        "jsonPath": ".status.queue.oldestUnfinishedSeconds",
        "description": "Seconds the oldest unfinished entry (undelivered or pending) has waited" + FIGURES_AGE,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Rate-Limited",
        "type": "integer",
        "jsonPath": ".status.queue.throttled",
        "description": "Records the stage's rate limits (or a 429) hold back in the retry set now" + FIGURES_AGE,
        "priority": 1,
    },
    {"name": "Processor", "type": "string", "jsonPath": ".spec.processor", "priority": 1},
    {"name": "Input", "type": "string", "jsonPath": ".status.streams.input", "priority": 1},
    {"name": "Output", "type": "string", "jsonPath": ".status.streams.output", "priority": 1},
]


# The pipeline's figures are sums over its stages' status (operator/pipeline/summary.py); P50 and P99 the end-to-end
# latency over its final stages' buckets.
_PIPELINE_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready", "description": "Stages ready/total"},
    {"name": "Backlog", "type": "integer", "jsonPath": ".status.backlog", "description": "Undelivered entries"},
    {"name": "In-Flight", "type": "integer", "jsonPath": ".status.inFlight", "description": "Unacknowledged"},
    {"name": "DLQ", "type": "integer", "jsonPath": ".status.dlq"},
    {
        "name": "Oldest",
        "type": "integer",
        "jsonPath": ".status.oldestUnfinishedSeconds",
        "description": "Seconds the oldest unfinished entry of any stage has waited",
    },
    {"name": "P99", "type": "number", "jsonPath": ".status.latency.p99Seconds", "description": "End to end"},
    {
        "name": "P50",
        "type": "number",
        "jsonPath": ".status.latency.p50Seconds",
        "description": "End to end",
        "priority": 1,
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Status", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].reason', "priority": 1},
]
_NAME_RULE = {
    # The name becomes a label value (and a stage's names a Deployment's): a DNS-1123 label, at most 63 characters.
    "rule": f"size(self.metadata.name) <= 63 && self.metadata.name.matches('{STAGE_NAME_PATTERN}')",
    "message": "a PhoenixStage name must be a DNS-1123 label (lowercase letters, digits, '-'; at most 63 characters)",
}


def _status_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = structural_schema(model)
    # kopf records handler results under status.<handler id>; pruning them would make kopf re-run handlers.
    schema["x-kubernetes-preserve-unknown-fields"] = True
    return schema


def _root_schema(
    description: str, spec: dict[str, Any], status: type[BaseModel], name_rule: dict[str, str]
) -> dict[str, Any]:
    return {
        "description": description,
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "Versioned schema of this object."},
            "kind": {"type": "string", "description": "The REST resource this object represents."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": _status_schema(status),
        },
        "x-kubernetes-validations": [name_rule],
    }


def custom_resource_definition() -> dict[str, Any]:
    """The PhoenixStage CRD object, ready to serialize or to send to the apiserver."""
    root = _root_schema(
        "A Phoenix pipeline stage: workers consuming a Redis stream, autoscaled by KEDA.",
        structural_schema(PhoenixStageSpec),
        PhoenixStageStatus,
        _NAME_RULE,
    )
    return _definition(CRD_NAME, (KIND, PLURAL, SINGULAR, SHORT_NAMES), _PRINTER_COLUMNS, root)


def _without_rules(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without its CEL rules, at every depth (types, bounds and patterns stay)."""
    return {
        key: _without_rules(value) if isinstance(value, dict) else value
        for key, value in schema.items()
        if key != "x-kubernetes-validations"
    }


def _pipeline_spec_schema() -> dict[str, Any]:
    """The pipeline's spec, each stage's spec inline without the PhoenixStage's CEL rules: the API server estimates
    a rule's cost times the entries that may hold it, and a list of stages puts those rules far over its budget. The
    operator checks every stage with the models (which hold the same rules, tests/test_fuzz_stage_specs.py) and the
    API server checks each PhoenixStage it makes; the pipeline's own rules (its graph) stay."""
    schema = structural_schema(PhoenixPipelineSpec)
    stage = schema["properties"]["stages"]["items"]["properties"]["spec"]
    schema["properties"]["stages"]["items"]["properties"]["spec"] = _without_rules(stage)
    return schema


def pipeline_custom_resource_definition() -> dict[str, Any]:
    """The PhoenixPipeline CRD object."""
    name_rule = {**_NAME_RULE, "message": _NAME_RULE["message"].replace("PhoenixStage", "PhoenixPipeline")}
    root = _root_schema(
        "A Phoenix pipeline: its stages (each a PhoenixStage the operator makes and keeps) and their edges.",
        _pipeline_spec_schema(),
        PhoenixPipelineStatus,
        name_rule,
    )
    names = (PIPELINE_KIND, PIPELINE_PLURAL, PIPELINE_SINGULAR, PIPELINE_SHORT_NAMES)
    return _definition(PIPELINE_CRD_NAME, names, _PIPELINE_PRINTER_COLUMNS, root)


def _definition(
    name: str, names: tuple[str, str, str, tuple[str, ...]], columns: list[dict[str, Any]], root: dict[str, Any]
) -> dict[str, Any]:
    kind, plural, singular, short_names = names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "phoenix"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": ["phoenix"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
