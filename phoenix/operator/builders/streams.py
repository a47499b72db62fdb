"""Redis names of a stage, with the defaults the worker runtime uses filled in."""

from __future__ import annotations

from phoenix.crds import Output, PhoenixStageSpec, StreamsStatus


def default_input_stream(stage: str) -> str:
    return f"phoenix:{stage}:input"


def resolve_streams(name: str, spec: PhoenixStageSpec) -> StreamsStatus:
    """Input, output, consumer group and DLQ of stage `name`.

    `output.stage: next` resolves to the next stage's default input stream; a next stage with a custom `input`
    must be addressed with `output.stream` instead, so resolution never needs to read another object.
    """
    return StreamsStatus(
        input=spec.input or default_input_stream(name),
        output=_output_stream(spec.output),
        consumer_group=spec.consumer_group or f"{name}-group",
        dlq=spec.dlq or f"phoenix:{name}:dlq",
    )


def _output_stream(output: Output | None) -> str | None:
    if output is None:
        return None
    if output.stage is not None:
        return default_input_stream(output.stage)
    return output.stream
