"""The PhoenixStage CustomResourceDefinition, assembled from the models."""

from __future__ import annotations

from typing import Any

from phoenix.crds.resource import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from phoenix.crds.schema import structural_schema
from phoenix.crds.spec import STAGE_NAME_PATTERN, PhoenixStageSpec
from phoenix.crds.status import PhoenixStageStatus

CRD_NAME = f"{PLURAL}.{GROUP}"

_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Replicas", "type": "string", "jsonPath": ".status.replicas.summary", "description": "ready/desired"},
    {"name": "Backlog", "type": "integer", "jsonPath": ".status.queue.lag", "description": "Undelivered entries"},
    {"name": "Pending", "type": "integer", "jsonPath": ".status.queue.pending", "description": "Unacknowledged"},
    {"name": "DLQ", "type": "integer", "jsonPath": ".status.queue.dlqLength"},
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
        "description": "Seconds the oldest unfinished entry (undelivered or pending) has waited",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Rate-Limited",
        "type": "integer",
        "jsonPath": ".status.queue.throttled",
        "description": "Records the stage's rate limits held back to wait in the retry set, ever",
        "priority": 1,
    },
    {"name": "Processor", "type": "string", "jsonPath": ".spec.processor", "priority": 1},
    {"name": "Input", "type": "string", "jsonPath": ".status.streams.input", "priority": 1},
    {"name": "Output", "type": "string", "jsonPath": ".status.streams.output", "priority": 1},
]


def _status_schema() -> dict[str, Any]:
    schema = structural_schema(PhoenixStageStatus)
    # kopf records handler results under status.<handler id>; pruning them would make kopf re-run handlers.
    schema["x-kubernetes-preserve-unknown-fields"] = True
    return schema


def _root_schema() -> dict[str, Any]:
    return {
        "description": "A Phoenix pipeline stage: workers consuming a Redis stream, autoscaled by KEDA.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "Versioned schema of this object."},
            "kind": {"type": "string", "description": "The REST resource this object represents."},
            "metadata": {"type": "object"},
            "spec": structural_schema(PhoenixStageSpec),
            "status": _status_schema(),
        },
        # The name becomes a label value and names the Deployment: a DNS-1123 label, at most 63 characters.
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= 63 && self.metadata.name.matches('{STAGE_NAME_PATTERN}')",
                "message": "a PhoenixStage name must be a DNS-1123 label (lowercase letters, digits, '-'; "
                "at most 63 characters)",
            }
        ],
    }


def custom_resource_definition() -> dict[str, Any]:
    """The CRD object, ready to serialize or to send to the apiserver."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "phoenix"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["phoenix"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": _root_schema()},
                }
            ],
        },
    }
