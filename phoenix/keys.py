"""The Redis key names of Phoenix, spelled once for the worker runtime, the operator, the stages and the tools.

Layout (v2): `phoenix:{<namespace>}:<stage>:<kind>`, for example `phoenix:{team-a}:parser:input`.

- **Tenants.** Every key of a stage is scoped by its namespace: the stage's Kubernetes namespace when the operator
  runs it (it sets KEY_NAMESPACE), KEY_NAMESPACE (default `default`) for a worker run by hand. Two stages of the
  same name in two namespaces share no key, on one Redis database.
- **Slots.** `{<namespace>}` is a Redis Cluster hash tag: every key of a namespace hashes to one slot, so one atomic
  script may touch a stage's streams, retry set and record keys and the next stage's input (`output.stage` stays
  in the namespace). The Redis Cluster work adds partitions inside the tag (`{<namespace>~<p>}`, see `scope`)
  without renaming anything else.
- **Data the stages share** (the example pipeline's pages, the billing cache) sits in the same scope under a
  segment no stage name can take (stage names start with a letter or digit): `phoenix:{ns}:_pages:<record id>`.

The operator creates and deletes these keys and the workers use them, so both sides derive the same names from a
stage's namespace and name: change a format here and both move together. The Lua scripts receive every key they
touch in KEYS (tests/test_script_keys.py checks it) and spell none of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "phoenix"
DEFAULT_NAMESPACE = "default"
# A Kubernetes namespace name (a DNS label): no `{`, `}` or `:`, so the hash tag and the segments stay unambiguous.
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_SCOPED = re.compile(r"^phoenix:\{(?P<namespace>[^{}:]+)\}:(?P<stage>[^:]+):input$")
_SCOPED_STREAM = re.compile(r"^phoenix:\{(?P<namespace>[^{}:]+)\}:(?P<stage>[A-Za-z0-9][^:]*):(?:input|dlq)$")


def scope(namespace: str) -> str:
    """The common start of every key of `namespace`, hash tag included. The one place the tag is spelled."""
    return f"{PREFIX}:{{{namespace}}}"


def input_stream(stage: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """A stage's default input stream; also what `output.stage: <next>` resolves to (in the same namespace)."""
    return f"{scope(namespace)}:{stage}:input"


def input_streams_pattern(namespace: str | None = None) -> str:
    """SCAN MATCH pattern of the default input streams of every stage of `namespace` (None: of every namespace).
    Braces are literal in Redis glob patterns."""
    return input_stream("*", namespace or "*")


def stage_of_input(key: str) -> tuple[str, str] | None:
    """(namespace, stage) of a default input stream's key (the inverse of input_stream); None for another key."""
    found = _SCOPED.match(key)
    return (found["namespace"], found["stage"]) if found else None


def stage_of_stream(key: str) -> tuple[str, str] | None:
    """(namespace, stage) whose default input or DLQ stream `key` is; None for another key."""
    found = _SCOPED_STREAM.match(key)
    return (found["namespace"], found["stage"]) if found else None


def shared_data_key(namespace: str, kind: str, ident: str) -> str:
    """A key of data that stages hand to each other or share (kind: pages, parsed, grouped, billing-key, ...)."""
    return f"{scope(namespace)}:_{kind}:{ident}"


def billing_cache_key(namespace: str, user_id: str) -> str:
    """The user's API key, encrypted, cached for every stage of `namespace` (worker_runtime/billing.py)."""
    return shared_data_key(namespace, "billing-key", user_id)


def billing_guard_key(namespace: str, user_id: str) -> str:
    """While set: one worker of `namespace` is fetching the user's API key from the billing service."""
    return shared_data_key(namespace, "billing-fetching", user_id)


@dataclass(frozen=True)
class StageKeys:
    """The streams, consumer group and keys of stage `name` in `namespace`."""

    name: str
    namespace: str
    input: str
    consumer_group: str
    dlq: str
    output: str | None = None

    @classmethod
    def for_stage(
        cls,
        name: str,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        input: str | None = None,
        group: str | None = None,
        dlq: str | None = None,
        output: str | None = None,
    ) -> StageKeys:
        """The stage's names, each given one (empty or None: the default derived from `name`) kept as is."""
        return cls(
            name=name,
            namespace=namespace,
            input=input or input_stream(name, namespace),
            consumer_group=group or f"{name}-group",
            dlq=dlq or f"{scope(namespace)}:{name}:dlq",
            output=output or None,
        )

    @property
    def _stage(self) -> str:
        return f"{scope(self.namespace)}:{self.name}"

    @property
    def pattern(self) -> str:
        """SCAN MATCH pattern of every key of the stage named after it (all but a custom input or DLQ)."""
        return f"{self._stage}:*"

    @property
    def retry(self) -> str:
        """Sorted set of records waiting for their next attempt (score = due time in ms)."""
        return f"{self._stage}:retry"

    @property
    def record_prefix(self) -> str:
        """+ record id: the record's state, one key: locked by a worker while it processes the record, then
        its idempotency marker once committed (values: worker_runtime/locks.py)."""
        return f"{self._stage}:record:"

    def record(self, record_id: str) -> str:
        return self.record_prefix + record_id

    @property
    def audit(self) -> str:
        """Stream of the repairs done to the stage by hand or by the operator (worker_runtime/audit.py); capped."""
        return f"{self._stage}:audit"

    @property
    def backpressure(self) -> str:
        """While set: the stage is paused by backpressure; the value is its output's unfinished entries, as
        measured."""
        return f"{self._stage}:backpressure"

    @property
    def dlq_trimmed(self) -> str:
        """Counter of the entries DLQ_MAXLEN has removed from the stage's dead-letter stream, ever."""
        return f"{self._stage}:dlq-trimmed"

    @property
    def owner(self) -> str:
        """Hash naming the PhoenixStage that created the stage's keys (operator/ownership.py): the operator refuses
        keys another stage holds and deletes only what its own stage created."""
        return f"{self._stage}:owner"

    def replay_ledger(self, request_id: str) -> str:
        """The operator's ledger of one DLQ replay request, so a repeated attempt continues instead of redoing."""
        return f"{self._stage}:replay:{request_id}"

    @property
    def replay_ledgers_pattern(self) -> str:
        """SCAN MATCH pattern of the stage's replay ledgers (no glob character can occur in the prefix)."""
        return self.replay_ledger("*")

    @property
    def holder_markers(self) -> tuple[str, ...]:
        """The owner hashes that may hold this stage's streams: its own, then, for an input or DLQ given the default
        name of another stage (explicit spec.input/dlq), that stage's."""
        others = {found for stream in (self.input, self.dlq) if (found := stage_of_stream(stream)) is not None}
        others.discard((self.namespace, self.name))
        return (self.owner, *sorted(StageKeys.for_stage(name, namespace).owner for namespace, name in others))


@dataclass(frozen=True)
class LegacyStageKeys:
    """The names of the v1 layout (`phoenix:<stage>:...`, no namespace, no hash tag), read only by
    `phoenix migrate` to move a stage's data to StageKeys."""

    name: str
    custom_dlq: str = ""  # the stage's DLQ_NAME when it set one: its trimmed counter was named after it

    @property
    def input(self) -> str:
        return f"{PREFIX}:{self.name}:input"

    @property
    def dlq(self) -> str:
        return f"{PREFIX}:{self.name}:dlq"

    @property
    def retry(self) -> str:
        return f"{PREFIX}:{self.name}:retry"

    @property
    def record_prefix(self) -> str:
        return f"{PREFIX}:{self.name}:record:"

    @property
    def audit(self) -> str:
        return f"{PREFIX}:{self.name}:audit"

    @property
    def dlq_trimmed(self) -> str:
        return f"{self.custom_dlq or self.dlq}:trimmed"

    @property
    def migrating(self) -> str:
        """While `phoenix migrate` moves the stage (value: the namespace it moves to), so that a run interrupted
        half-way is continued by the next, and only to the same namespace."""
        return f"{PREFIX}:{self.name}:migrating"
