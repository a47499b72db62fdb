"""The Redis key names of Phoenix, spelled once for the worker runtime, the operator, the stages and the tools.

Layout (v2): `phoenix:{<namespace>}:<stage>:<kind>`, for example `phoenix:{team-a}:parser:input`.

- **Tenants.** Every key of a stage is scoped by its namespace: the stage's Kubernetes namespace when the operator
  runs it (it sets KEY_NAMESPACE), KEY_NAMESPACE (default `default`) for a worker run by hand. Two stages of the
  same name in two namespaces share no key, on one Redis database.
- **Slots.** `{<namespace>}` is a Redis Cluster hash tag: every key of a namespace hashes to one slot, so one atomic
  script may touch a stage's streams, retry set and record keys and the next stage's input (`output.stage` stays
  in the namespace).
- **Partitions.** A stage of `partitions: K > 1` has K lanes, each a full set of the per-record keys (input, DLQ,
  retry set, record keys, backpressure) under the tag `{<namespace>~<p>}`. A record's lane is `partition_of(record
  id, K)`, stable, so partition p of every stage of a pipeline shares one slot: the commit that forwards a record
  from p to the next stage's p stays one script, and the K slots spread over a cluster's shards. A stage of one
  partition keeps the plain `{<namespace>}` tag: today's names. The keys of a stage as a whole (owner, layout,
  audit, replay ledgers) are always under `{<namespace>}`.
- **Data the stages share** (the example pipeline's pages, the billing cache) sits in the same scope under a
  segment no stage name can take (stage names start with a letter or digit): `phoenix:{ns}:_pages:<record id>`.
- **Claimed names.** A stream a stage names itself (spec.input, spec.dlq, output.stream) outside every namespace's
  scope (`orders`) belongs to the namespace whose stage first claimed it: its name marker `phoenix:_name:{<the
  stream's hashed part>}:<stream>` (StageKeys.name_marker, in the stream's slot) says which, and a stage of another
  namespace is refused it. A name inside another namespace's scope is refused outright (foreign_scope); `phoenix:`
  names outside any scope are Phoenix's own (name markers, the operator's indexes) and refused too.
- **Relay markers** are the one kind of key in a slot not of their own namespace but of the stream they guard (a
  relayed hop's plain target, which may be any name): `phoenix:{<what the target's slot is hashed from>}:_relayed:
  <namespace>/<stage>[/<partition>]:<outbox entry id>` (StageKeys.relay_marker).

The operator creates and deletes these keys and the workers use them, so both sides derive the same names from a
stage's namespace and name: change a format here and both move together. The Lua scripts receive every key they
touch in KEYS (tests/test_script_keys.py checks it) and spell none of them.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, replace

PREFIX = "phoenix"
DEFAULT_NAMESPACE = "default"
# The most partitions a stage may have (spec.partitions, PARTITIONS): a worker reads each in every round, and a
# cluster has 16384 slots to spread them over.
MAX_PARTITIONS = 1024
# A Kubernetes namespace name (a DNS label): no `{`, `}` or `:`, so the hash tag and the segments stay unambiguous.
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
# A final stage's end-to-end latencies are counted in windows of this long (StageKeys.latency_windows): the window
# being counted and the ones before it, LATENCY_WINDOWS in all, are what the operator reads back.
LATENCY_WINDOW_SECONDS = 60
LATENCY_WINDOWS = 6
# The upper bounds of its buckets, the fields of a window's hash (with +Inf), and of phoenix_pipeline_latency_seconds:
# a record's whole path takes a fraction of a second through idle stages to hours for document pipelines (a model
# call per stage, a backlog after an outage), up to a day.
LATENCY_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800, 86400)
# The tag: a namespace (no `~`, `{`, `}` or `:`), then `~<partition>` for a lane of a partitioned stage.
_TAG = r"\{(?P<namespace>[^{}:~]+)(?:~(?P<partition>\d+))?\}"
_SCOPED = re.compile(rf"^phoenix:{_TAG}:(?P<stage>[^:]+):input$")
_SCOPED_STREAM = re.compile(rf"^phoenix:{_TAG}:(?P<stage>[A-Za-z0-9][^:]*):(?:input|dlq)$")


def in_scope(key: str, namespace: str) -> bool:
    """Whether `key` is one of `namespace`'s keys: under `phoenix:{<namespace>}` or a partition's tag
    `phoenix:{<namespace>~...}` (a namespace holds no `~`, so no other namespace's tag starts so)."""
    return key.startswith((f"{PREFIX}:{{{namespace}}}", f"{PREFIX}:{{{namespace}~"))


def foreign_scope(stream: str, namespace: str) -> str | None:
    """Why a stream a stage of `namespace` names itself is not its to use, or None when it is: a name under
    another namespace's tag (`phoenix:{team-b}:...`, its keys), or another name under `phoenix:` (Phoenix's own:
    name markers, indexes, the v1 layout)."""
    if not stream.startswith(f"{PREFIX}:") or in_scope(stream, namespace):
        return None
    if stream.startswith(f"{PREFIX}:{{"):
        tag = hashed_part(stream).split("~", 1)[0]
        return f"it is a key of namespace {tag} (phoenix:{{{tag}}}...)"
    return "names under phoenix: outside a namespace's tag are Phoenix's own"


def claimed_by_name(stream: str, namespace: str) -> bool:
    """Whether the stage's stream `stream` is held by a name marker: a name outside every namespace's scope."""
    return not stream.startswith(f"{PREFIX}:") and not in_scope(stream, namespace)


def markable(stream: str) -> bool:
    """Whether a key under the stream's hashed part lands in the stream's slot: false for a name with a `}` and no
    hash tag (its hashed part, the whole name, would end the marker's tag early)."""
    return "}" not in hashed_part(stream)


def name_marker(stream: str) -> str:
    """The hash naming the namespace (and Kubernetes cluster) holding the claimed stream `stream`, and each of its
    stages using it (ownership.claim_names): in the stream's slot."""
    return f"{PREFIX}:_name:{{{hashed_part(stream)}}}:{stream}"


def claimed_names(namespace: str) -> str:
    """Set of the claimed streams of `namespace`, kept by the operator for its Redis ACL users (never granted to a
    namespace's user, so no tenant can add a name to it)."""
    return f"{PREFIX}:_names:{{{namespace}}}"


def namespace_patterns(namespace: str) -> tuple[str, ...]:
    """Glob patterns of every key of `namespace` (Redis ACL key patterns): its tag and each partition's."""
    return (f"{PREFIX}:{{{namespace}}}*", f"{PREFIX}:{{{namespace}~*")


def glob_escaped(name: str) -> str:
    """`name` as a Redis glob pattern matching it alone."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", name)


def scope(namespace: str, partition: int | None = None) -> str:
    """The common start of every key of `namespace` (of its partition `partition`, None: of an unpartitioned stage
    or of a stage as a whole), hash tag included. The one place the tag is spelled."""
    tag = namespace if partition is None else f"{namespace}~{partition}"
    return f"{PREFIX}:{{{tag}}}"


def partition_of(record_id: str, partitions: int) -> int | None:
    """The partition of a record in a stage of `partitions` partitions: None (no partition in the names) for one,
    else a stable hash of the record id (CRC-32, the same in every process and release) modulo `partitions`."""
    return zlib.crc32(record_id.encode()) % partitions if partitions > 1 else None


def input_stream(stage: str, namespace: str = DEFAULT_NAMESPACE, partition: int | None = None) -> str:
    """A stage's default input stream (of one partition); also what `output.stage: <next>` resolves to (in the same
    namespace, the record's partition of the next stage)."""
    return f"{scope(namespace, partition)}:{stage}:input"


def input_streams_pattern(namespace: str | None = None) -> str:
    """SCAN MATCH pattern of the default input streams of every stage of `namespace` (None: of every namespace),
    of every partition; stage_of_input tells them apart. Braces are literal in Redis glob patterns."""
    # `[}~]`: the namespace ends at the tag's end or at its partition, so `team` does not match `team-b`.
    return f"{PREFIX}:{{*}}:*:input" if namespace is None else f"{PREFIX}:{{{namespace}[}}~]*:input"


def stage_of_input(key: str) -> tuple[str, str] | None:
    """(namespace, stage) of a default input stream's key, of any partition (the inverse of input_stream); None for
    another key."""
    found = _SCOPED.match(key)
    return (found["namespace"], found["stage"]) if found else None


def stage_of_stream(key: str) -> tuple[str, str] | None:
    """(namespace, stage) whose default input or DLQ stream (of any partition) `key` is; None for another key."""
    found = _SCOPED_STREAM.match(key)
    return (found["namespace"], found["stage"]) if found else None


def forward_stream(next_stage: str, namespace: str, record_id: str, partitions: int) -> str:
    """The input stream of `next_stage` (of `partitions` partitions) that the record `record_id` is forwarded to."""
    return input_stream(next_stage, namespace, partition_of(record_id, partitions))


def hashed_part(key: str) -> str:
    """What Redis Cluster hashes of `key` for its slot: the text between its first `{` and the first `}` after it
    when that is not empty (its hash tag), else the whole key."""
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if end > start + 1 else key


def shared_data_key(namespace: str, kind: str, ident: str) -> str:
    """A key of data that stages hand to each other or share (kind: pages, parsed, grouped, billing-key, ...)."""
    return f"{scope(namespace)}:_{kind}:{ident}"


def billing_cache_key(namespace: str, user_id: str) -> str:
    """The user's API key, encrypted, cached for every stage of `namespace` (worker_runtime/billing.py)."""
    return shared_data_key(namespace, "billing-key", user_id)


def billing_guard_key(namespace: str, user_id: str) -> str:
    """While set: one worker of `namespace` is fetching the user's API key from the billing service."""
    return shared_data_key(namespace, "billing-fetching", user_id)


def rate_limit_key(namespace: str, bucket: str) -> str:
    """A rate limit's bucket (worker_runtime/rate_limit.py): every one of a namespace under the namespace's plain
    hash tag, whatever a stage's partitions, so that one call takes a record's units from its stage's, its user's
    and a downstream's buckets at once, and a downstream is shared by every stage of the namespace naming it."""
    return shared_data_key(namespace, "ratelimit", bucket)


@dataclass(frozen=True)
class StageKeys:
    """The streams, consumer group and keys of stage `name` in `namespace`: of the stage as a whole (`partition`
    None), which for a stage of one partition is also its one lane, or of its lane `partition` (see `lanes`)."""

    name: str
    namespace: str
    input: str
    consumer_group: str
    dlq: str
    output: str | None = None
    partitions: int = 1
    partition: int | None = None

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
        partitions: int = 1,
    ) -> StageKeys:
        """The stage's names, each given one (empty or None: the default derived from `name`) kept as is. A stage
        of several partitions has only derived streams: one input and one DLQ per partition."""
        if partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {partitions}")
        if partitions > 1 and (input or dlq):
            raise ValueError("a stage of several partitions derives its input and DLQ streams; it cannot name them")
        return cls(
            name=name,
            namespace=namespace,
            input=input or input_stream(name, namespace),
            consumer_group=group or f"{name}-group",
            dlq=dlq or f"{scope(namespace)}:{name}:dlq",
            output=output or None,
            partitions=partitions,
        )

    @property
    def lanes(self) -> tuple[StageKeys, ...]:
        """The keys of each partition, in partition order: the stage itself when it has one partition."""
        if self.partitions == 1:
            return (self,)
        return tuple(
            replace(
                self,
                partition=p,
                input=input_stream(self.name, self.namespace, p),
                dlq=f"{scope(self.namespace, p)}:{self.name}:dlq",
            )
            for p in range(self.partitions)
        )

    def lane_of(self, record_id: str) -> StageKeys:
        """The keys of the partition `record_id` belongs to."""
        partition = partition_of(record_id, self.partitions)
        return self if partition is None else self.lanes[partition]

    @property
    def _stage(self) -> str:
        return f"{scope(self.namespace, self.partition)}:{self.name}"

    @property
    def _whole_stage(self) -> str:
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
        """Stream of the repairs done to the stage by hand or by the operator (tools/audit.py); capped."""
        return f"{self._whole_stage}:audit"

    @property
    def held(self) -> str:
        """Sorted set of the records the stage's rate limits (or a provider's 429) hold back in the retry set now:
        record id -> when it is due, ms (rate_limit.lua: under the namespace's tag, with the buckets)."""
        return f"{self._whole_stage}:held"

    @property
    def backpressure(self) -> str:
        """While set: the stage is paused by backpressure; the value is its output's unfinished entries, as
        measured."""
        return f"{self._stage}:backpressure"

    def latency_window(self, at: float) -> str:
        """Hash of the end-to-end latencies a final stage observed in the window of LATENCY_WINDOW_SECONDS holding
        `at` (epoch seconds): field the bucket's upper bound as Prometheus writes it (`0.5`, `+Inf`), value its
        count (worker_runtime/latency.py); expires. Of the stage as a whole, under the namespace's tag."""
        start = int(at // LATENCY_WINDOW_SECONDS) * LATENCY_WINDOW_SECONDS
        return f"{self._whole_stage}:latency:{start}"

    @property
    def latency_windows_pattern(self) -> str:
        """SCAN MATCH pattern of every latency window of the stage (deletionPolicy Delete finds them by it)."""
        return f"{self._whole_stage}:latency:*"

    def latency_windows(self, now: float) -> tuple[str, ...]:
        """The LATENCY_WINDOWS windows up to `now`, newest first: the last 5 to 6 minutes."""
        return tuple(self.latency_window(now - i * LATENCY_WINDOW_SECONDS) for i in range(LATENCY_WINDOWS))

    @property
    def dlq_trimmed(self) -> str:
        """Counter of the entries DLQ_MAXLEN has removed from the stage's dead-letter stream, ever."""
        return f"{self._stage}:dlq-trimmed"

    @property
    def owner(self) -> str:
        """Hash naming the PhoenixStage that created the stage's keys (operator/ownership.py): the operator refuses
        keys another stage holds and deletes only what its own stage created."""
        return f"{self._stage}:owner"

    @property
    def layout(self) -> str:
        """Hash of the stage's layout (`partitions`), written when its keys are first claimed: producers read it to
        write where the workers read, and a worker or operator started with another count refuses to start."""
        return f"{self._whole_stage}:layout"

    @property
    def outbox(self) -> str:
        """Stream of the lane's committed results bound for a stream in another slot (a Redis Cluster forward that
        cannot be in the commit's script): written by the commit, relayed to their streams idempotently."""
        return f"{self._stage}:outbox"

    @property
    def ingest_prefix(self) -> str:
        """+ record id: the ingest marker of a record added to the lane's own input (deletionPolicy Delete finds
        them by it; a marker of another input stream, in that stream's slot, is left to expire with its window)."""
        return f"{self._stage}:ingested:"

    def ingest_marker(self, stream: str, record_id: str) -> str:
        """Set, for the producer's dedup window, once `record_id` was added to `stream`, this lane's input
        (producer_once.lua): a retried send adds nothing. Under the lane's own tag when the stream is (its default
        input), else under the stream's hashed part, in its slot; it expires with the window."""
        if hashed_part(stream) == hashed_part(self._stage):
            return self.ingest_prefix + record_id
        return f"{PREFIX}:{{{hashed_part(stream)}}}:_ingested:{self.namespace}/{self.name}:{record_id}"

    def relay_marker(self, target: str, entry_id: str) -> str:
        """Set when the relay wrote the lane's outbox entry `entry_id` to `target`, a stream no stage reads
        (relay_write.lua): in the target's slot, so one script sets it and writes. Its tag is the target's hashed
        part, which lands in that slot unless it holds a `}` (a target with no hash tag and a `}` in its name):
        the relay refuses such a target (relay.py)."""
        source = f"{self.namespace}/{self.name}" + ("" if self.partition is None else f"/{self.partition}")
        return f"{PREFIX}:{{{hashed_part(target)}}}:_relayed:{source}:{entry_id}"

    def replay_ledger(self, request_id: str) -> str:
        """The operator's ledger of one DLQ replay request, so a repeated attempt continues instead of redoing. A
        lane has its own, in its slot: the ledger is written in one transaction with the lane's move."""
        return f"{self._stage}:replay:{request_id}"

    @property
    def replay_ledgers_pattern(self) -> str:
        """SCAN MATCH pattern of the stage's replay ledgers (no glob character can occur in the prefix)."""
        return self.replay_ledger("*")

    @property
    def claimed_streams(self) -> tuple[str, ...]:
        """The stage's streams held by name markers (claimed_by_name): input, DLQ and output, each once."""
        found = (self.input, self.dlq, *((self.output,) if self.output else ()))
        return tuple(dict.fromkeys(stream for stream in found if claimed_by_name(stream, self.namespace)))

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
