"""PhoenixStages -> the pipelines the page draws: pure functions over the stages' JSON bodies (tested without a
cluster).

A pipeline is the stages of one namespace connected by their edges (`output.stage`, `spec.outputs[].stage`); a
stage made by a PhoenixPipeline carries its name in PIPELINE_LABEL and is grouped by it. `group_stages` is the one
place that decides which stages form a pipeline: reading PhoenixPipeline objects instead changes it alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from phoenix.crds.status import ConditionType
from phoenix.kube_names import PIPELINE_LABEL
from phoenix.operator.status.latency import pipeline_latency

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Edge:
    source: str
    target: str
    output: str | None  # the named output (spec.outputs), None for output.stage
    lag: int | None  # the next stage's backlog: what this edge has handed over and the next stage not yet read


@dataclass(frozen=True, slots=True)
class StageBox:
    name: str
    backlog: int | None  # status.queue.lag: entries not yet delivered to any worker
    in_flight: int | None  # status.queue.pending: delivered, not yet acknowledged
    dlq: int | None
    oldest_seconds: int | None  # status.queue.oldestUnfinishedSeconds
    replicas: str | None  # status.replicas.summary, ready/desired
    ready: bool
    paused: bool
    backpressure: bool  # the Backpressure condition: intake stopped while the output is over its high water
    rate: float | None  # acknowledgements per second measured by `phoenix ui` on the stage's Redis; None: unread
    column: int = 0  # where the page draws it: the longest path to it from a first stage


@dataclass(frozen=True, slots=True)
class Pipeline:
    namespace: str
    name: str
    labelled: bool  # grouped by PIPELINE_LABEL (made by a PhoenixPipeline), else by its edges
    stages: list[StageBox]
    edges: list[Edge]
    oldest_seconds: int | None  # the largest of the stages' own (as a PhoenixPipeline's status has it)
    # End-to-end latency over the last windows, the final stages' status.latency buckets merged as a PhoenixPipeline's
    # status merges them; None while no final stage finished a record lately.
    p99_seconds: float | None

    def as_json(self) -> Json:
        return asdict(self)


def next_stages(body: Json) -> list[tuple[str | None, str]]:
    """The stages a stage feeds: (output name or None, stage name), in spec order."""
    spec = body.get("spec") or {}
    found: list[tuple[str | None, str]] = []
    if stage := (spec.get("output") or {}).get("stage"):
        found.append((None, stage))
    found.extend((out["name"], out["stage"]) for out in spec.get("outputs") or [] if out.get("stage"))
    return found


def group_stages(stages: Sequence[Json]) -> list[tuple[str, str, bool, list[Json]]]:
    """(namespace, pipeline name, labelled, its stages): labelled stages by their label, the others by the
    connected parts of the graph of their edges, each named after its first stage (one nothing feeds)."""
    by_namespace: dict[str, list[Json]] = {}
    for body in stages:
        by_namespace.setdefault(body["metadata"]["namespace"], []).append(body)
    groups: list[tuple[str, str, bool, list[Json]]] = []
    for ns, bodies in sorted(by_namespace.items()):
        labelled: dict[str, list[Json]] = {}
        free: dict[str, Json] = {}
        for body in bodies:
            if label := (body["metadata"].get("labels") or {}).get(PIPELINE_LABEL):
                labelled.setdefault(label, []).append(body)
            else:
                free[body["metadata"]["name"]] = body
        groups.extend((ns, name, True, members) for name, members in sorted(labelled.items()))
        groups.extend((ns, _first(part), False, part) for part in _connected(free))
    return sorted(groups, key=lambda g: (g[0], g[1]))


def _connected(stages: Mapping[str, Json]) -> list[list[Json]]:
    """The connected parts of the stages' graph, edges taken both ways (union-find over names)."""
    parent = {name: name for name in stages}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for name, body in stages.items():
        for _, target in next_stages(body):
            if target in parent:
                parent[root(target)] = root(name)
    parts: dict[str, list[Json]] = {}
    for name in sorted(stages):
        parts.setdefault(root(name), []).append(stages[name])
    return list(parts.values())


def _first(part: Sequence[Json]) -> str:
    fed = {target for body in part for _, target in next_stages(body)}
    names = sorted(body["metadata"]["name"] for body in part)
    return next((name for name in names if name not in fed), names[0])


def pipelines_of(stages: Sequence[Json], rates: Mapping[tuple[str, str], float] | None = None) -> list[Pipeline]:
    """The pipelines of these PhoenixStages (bodies with status), each stage's figures from its status; `rates`:
    the measured acknowledgements per second by (namespace, stage)."""
    out = []
    for ns, name, labelled, members in group_stages(stages):
        named = {body["metadata"]["name"]: body for body in members}
        boxes = {stage: _box(body, (rates or {}).get((ns, stage))) for stage, body in named.items()}
        edges = [
            Edge(body["metadata"]["name"], target, output, boxes[target].backlog)
            for body in members
            for output, target in next_stages(body)
            if target in boxes
        ]
        columns = _columns(list(boxes), edges)
        ordered = sorted((replace(box, column=columns[box.name]) for box in boxes.values()), key=_position)
        edges.sort(key=lambda e: (columns[e.source], e.source, columns[e.target], e.target))
        ages = [box.oldest_seconds for box in ordered if box.oldest_seconds is not None]
        latency = pipeline_latency(body.get("status") or {} for body in members) or {}
        out.append(Pipeline(ns, name, labelled, ordered, edges, max(ages, default=None), latency.get("p99Seconds")))
    return out


def _columns(names: Sequence[str], edges: Sequence[Edge]) -> dict[str, int]:
    """Each stage's column: the longest path to it from a first stage, capped so that a cycle stops growing."""
    column = dict.fromkeys(names, 0)
    for _ in names:
        for edge in edges:
            column[edge.target] = max(column[edge.target], min(column[edge.source] + 1, len(names) - 1))
    return column


def _position(box: StageBox) -> tuple[int, str]:
    return box.column, box.name


def _box(body: Json, rate: float | None) -> StageBox:
    status = body.get("status") or {}
    queue = status.get("queue") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return StageBox(
        name=body["metadata"]["name"],
        backlog=queue.get("lag"),
        in_flight=queue.get("pending"),
        dlq=queue.get("dlqLength"),
        oldest_seconds=queue.get("oldestUnfinishedSeconds"),
        replicas=(status.get("replicas") or {}).get("summary"),
        ready=conditions.get(ConditionType.READY) == "True",
        paused=bool((body.get("spec") or {}).get("paused")),
        backpressure=conditions.get(ConditionType.BACKPRESSURE) == "True",
        rate=rate,
    )
