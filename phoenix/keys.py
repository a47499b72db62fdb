"""The Redis key names of a stage, spelled once for the worker runtime, the operator and the tools.

The operator creates and deletes these keys and the workers use them, so both sides must derive the same names
from a stage's name: change a format here and both move together. The Lua scripts receive the names (or the
prefixes) as KEYS/ARGV and spell none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "phoenix"


def input_stream(stage: str) -> str:
    """A stage's default input stream; also what `output.stage: <next>` resolves to."""
    return f"{PREFIX}:{stage}:input"


# Matches the default input stream of every stage (`phoenix status` discovers stages with it).
ALL_INPUT_STREAMS = input_stream("*")


def stage_of_input(key: str) -> str:
    """The stage name in a default input stream's key (the inverse of input_stream)."""
    return key.removeprefix(f"{PREFIX}:").removesuffix(":input")


@dataclass(frozen=True)
class StageKeys:
    """The streams, consumer group and key prefixes of stage `name`."""

    name: str
    input: str
    consumer_group: str
    dlq: str
    output: str | None = None

    @classmethod
    def for_stage(
        cls,
        name: str,
        input: str | None = None,
        group: str | None = None,
        dlq: str | None = None,
        output: str | None = None,
    ) -> StageKeys:
        """The stage's names, each given one (empty or None: the default derived from `name`) kept as is."""
        return cls(
            name=name,
            input=input or input_stream(name),
            consumer_group=group or f"{name}-group",
            dlq=dlq or f"{PREFIX}:{name}:dlq",
            output=output or None,
        )

    @property
    def retry(self) -> str:
        """Sorted set of records waiting for their next attempt (score = due time in ms)."""
        return f"{PREFIX}:{self.name}:retry"

    @property
    def record_prefix(self) -> str:
        """+ record id: the record's state, one key: locked by a worker while it processes the record, then
        its idempotency marker once committed (values: worker_runtime/locks.py)."""
        return f"{PREFIX}:{self.name}:record:"

    @property
    def audit(self) -> str:
        """Stream of the repairs done to the stage by hand or by the operator (worker_runtime/audit.py); capped."""
        return f"{PREFIX}:{self.name}:audit"

    def replay_ledger(self, request_id: str) -> str:
        """The operator's ledger of one DLQ replay request, so a repeated attempt continues instead of redoing."""
        return f"{PREFIX}:{self.name}:replay:{request_id}"


def backpressure_key(stage: str) -> str:
    """While set: the stage is paused by backpressure; the value is its output's unfinished entries, as measured."""
    return f"{PREFIX}:{stage}:backpressure"


def dlq_trimmed_key(dlq: str) -> str:
    """Counter of the entries DLQ_MAXLEN has removed from the dead-letter stream `dlq`, ever."""
    return f"{dlq}:trimmed"
