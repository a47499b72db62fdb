"""Redis names of a stage, with the defaults the worker runtime uses filled in (phoenix.keys)."""

from __future__ import annotations

from collections.abc import Mapping

from phoenix.crds import Output, PhoenixStageSpec
from phoenix.keys import StageKeys, input_stream
from phoenix.worker_runtime.settings import NamedOutput


def resolve_streams(name: str, namespace: str, spec: PhoenixStageSpec) -> StageKeys:
    """Input, output, consumer group and DLQ of stage `name` of `namespace`.

    `output.stage: next` resolves to the default input stream of the stage `next` of the same namespace; a next
    stage with a custom `input` must be addressed with `output.stream` instead, so resolution never needs to read
    another object.
    """
    output = _output_stream(spec.output, namespace)
    return StageKeys.for_stage(
        name,
        namespace,
        input=spec.input,
        group=spec.consumer_group,
        dlq=spec.dlq,
        output=output,
        partitions=spec.partitions,
    )


def named_outputs(spec: PhoenixStageSpec, namespace: str, partitions: Mapping[str, int]) -> dict[str, NamedOutput]:
    """The worker's OUTPUTS from spec.outputs: each name's next stage's input, with that stage's partition count
    (`partitions`, by output name: as output_partitions is read for output.stage; 1 when not given)."""
    return {
        o.name: NamedOutput(queue=input_stream(o.stage, namespace), partitions=partitions.get(o.name, 1))
        for o in spec.outputs or []
    }


def _output_stream(output: Output | None, namespace: str) -> str | None:
    if output is None:
        return None
    if output.stage is not None:
        return input_stream(output.stage, namespace)
    return output.stream
