"""Redis names of a stage, with the defaults the worker runtime uses filled in (phoenix.keys)."""

from __future__ import annotations

from phoenix.crds import Output, PhoenixStageSpec
from phoenix.keys import StageKeys, input_stream


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


def _output_stream(output: Output | None, namespace: str) -> str | None:
    if output is None:
        return None
    if output.stage is not None:
        return input_stream(output.stage, namespace)
    return output.stream
