"""Redis names of a stage, with the defaults the worker runtime uses filled in (phoenix.keys)."""

from __future__ import annotations

from phoenix.crds import Output, PhoenixStageSpec
from phoenix.keys import StageKeys, input_stream


def resolve_streams(name: str, spec: PhoenixStageSpec) -> StageKeys:
    """Input, output, consumer group and DLQ of stage `name`.

    `output.stage: next` resolves to the next stage's default input stream; a next stage with a custom `input`
    must be addressed with `output.stream` instead, so resolution never needs to read another object.
    """
    return StageKeys.for_stage(name, spec.input, spec.consumer_group, spec.dlq, _output_stream(spec.output))


def _output_stream(output: Output | None) -> str | None:
    if output is None:
        return None
    if output.stage is not None:
        return input_stream(output.stage)
    return output.stream
