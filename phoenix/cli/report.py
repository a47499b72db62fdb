"""`kubectl phoenix report` (also `phoenix report`): one tar.gz with what a person on call is asked to send.

Through the API server, with the caller's own rights: every stage's spec and status, the Events of the stages'
namespaces and the operator's, the stages' Deployments and pods, and the last lines of the operator's and the
workers' logs. Through each stage's Redis: its queue state (as `phoenix status --json`), its DLQ counted by error
type, the settings RedisRisk reads and the server's version. What is never in it:

- Secret values: the only Secret read is the one a stage's urlSecretRef names (its Redis URL, to connect; skipped
  with --no-redis), and only in memory; its passwords are masked out of every file before the archive is written.
  Environment variables from secretKeyRef are references (the API holds no value). Of the literal values, in the
  Deployments' containers and the stages' spec.env, only those of Phoenix's own settings that hold no secret
  (ENV_KEPT) are kept, a URL's user info masked; every other one is `<redacted>`: the report cannot tell what a
  processor's own variable holds.
- Record data: entries are not copied; the DLQ is read only to count error_type. The workers' log lines are
  written about records: each keeps its fields' names, but only the runtime's own fields that hold no record data
  keep their values (LOG_FIELDS_KEPT: event, level, timestamp, message_id, trace_id, span_id, error_type, counts and
  timings...); record_id, user_id, a record's error text and whatever a processor logs become `<redacted>`, and a
  line that is not JSON (a traceback) is redacted whole. The operator's lines the same way (OPERATOR_LOG): its own
  sentences about stages are kept, a debug line's message (kopf quotes whole objects there) and a traceback are not.
  --unredacted-logs keeps them as written.

The archive is readable by its owner alone (0600), its files too once extracted.

A part that cannot be read (a pod without a node has no logs, a Secret the caller may not read) is recorded in
summary.json's errors and the rest is still written.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import platform
import tarfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from redis.exceptions import RedisError

import phoenix
from phoenix.cli.stage import StageSettings, redis_client
from phoenix.errors import PhoenixError
from phoenix.kube_names import (
    LAST_HANDLED_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    OPERATOR_APP_NAME,
    WORKER_APP_NAME,
)
from phoenix.redis_replies import text
from phoenix.redis_spec import RedisSpec
from phoenix.tools import dlq
from phoenix.tools.queue_stats import collect
from phoenix.worker_runtime.billing import BillingSettings
from phoenix.worker_runtime.redis_risk import assess_redis
from phoenix.worker_runtime.scrub import register as scrub_register
from phoenix.worker_runtime.scrub import scrub, without_user_info
from phoenix.worker_runtime.settings import WorkerSettings, public_variables

Json = dict[str, Any]
REDACTED = "<redacted>"
DEFAULT_TAIL_LINES = 500
DEFAULT_DLQ_SCAN = 100_000
# Owner only: the archive holds a cluster's layout, its logs and its Redis settings.
ARCHIVE_MODE = 0o600
# The variables whose literal values the report keeps: Phoenix's own settings that hold no secret (not SecretStr).
ENV_KEPT = public_variables(WorkerSettings, BillingSettings)
# Annotations that copy the whole spec (kubectl's, kopf's): the spec is in the file already, its env redacted.
_SPEC_COPIES = ("kubectl.kubernetes.io/last-applied-configuration", LAST_HANDLED_ANNOTATION)


class UnreadableStage(PhoenixError):
    """The stage's Redis cannot be reached from here (its Secret unreadable, its URL invalid): one line, no secret."""


# Failures the report records and goes on after; anything else is a bug and stops it.
_RECORDED = (ApiException, RedisError, OSError, ValueError, UnreadableStage)

# The stage's Redis and settings, from its body (kubectl.stage_target).
StageTarget = Callable[[Json], tuple[RedisSpec, StageSettings]]


@dataclass
class ReportOptions:
    namespace: str | None  # None: every namespace the caller may list stages in
    operator_namespace: str
    tail_lines: int = DEFAULT_TAIL_LINES
    dlq_scan: int = DEFAULT_DLQ_SCAN
    redis: bool = True
    redact_logs: bool = True  # the workers' and the operator's log lines: redact_log


# The fields of a worker's JSON line that keep their value in the report: the runtime's own (worker_runtime's log
# calls), none of which holds a record's data. message_id (the entry id) and trace_id still find the record.
LOG_FIELDS_KEPT = frozenset(
    {
        "timestamp", "level", "event", "service", "logger", "message_id", "trace_id", "span_id", "duration_seconds",
        "error_type", "retry_count", "retry_in", "retry_in_seconds", "retrying_for_seconds", "count", "batch",
        "acknowledged_by", "wanted", "timeout_ms", "action", "outcome", "concurrency", "consumer", "consumers",
        "dlq_maxlen", "function", "grace_seconds", "group", "high_water", "hint", "hop", "idle_ms", "low_water",
        "in_flight", "input", "output", "output_partitions", "outputs", "partitions", "job", "leaked_threads",
        "previous", "reason", "state", "redis", "retention", "seconds", "settings", "stage", "stream", "target_nodes",
        "task", "threads", "unfinished",
    }
)  # fmt: skip
# The fields of the operator's JSON lines (LOG_FORMAT=json: kopf's formatter, with trace ids) that keep their value:
# about stages and the operator itself, never a record's data.
OPERATOR_LOG_FIELDS_KEPT = frozenset({"timestamp", "severity", "object", "trace_id", "span_id"})


@dataclass(frozen=True)
class LogFields:
    """Which fields of a role's JSON log lines keep their value in the report: `kept`, and `free_text` on a line
    where `quotes_data` says it cannot quote data (a worker's `error` on a line about no record; the operator's
    `message` but on a debug line, where kopf writes a stage's whole body and diff)."""

    kept: frozenset[str]
    free_text: str
    quotes_data: Callable[[Json], bool]


WORKER_LOG = LogFields(LOG_FIELDS_KEPT, "error", lambda fields: "record_id" in fields or "user_id" in fields)
OPERATOR_LOG = LogFields(OPERATOR_LOG_FIELDS_KEPT, "message", lambda fields: fields.get("severity") == "debug")


def redact_log(text: str, role: LogFields) -> str:
    """A pod's log as the API gives it (`<RFC 3339 time> <line>`), with every value that may be a record's or a
    secret redacted: of each JSON line, the fields `role` does not keep; a line that is not a JSON object, whole;
    the user info of a URL in what is kept."""
    redacted = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            fields = json.loads(rest)
        except ValueError:
            fields = None
        if not isinstance(fields, dict):
            redacted.append(f"{stamp} {REDACTED} (not a JSON line)")
            continue
        free_text_kept = not role.quotes_data(fields)
        kept = {
            key: value if key in role.kept or (key == role.free_text and free_text_kept) else REDACTED
            for key, value in fields.items()
        }
        redacted.append(f"{stamp} {without_user_info(json.dumps(kept))}")
    return "".join(f"{line}\n" for line in redacted)


def redact_worker_log(text: str) -> str:
    return redact_log(text, WORKER_LOG)


def redact_operator_log(text: str) -> str:
    return redact_log(text, OPERATOR_LOG)


@dataclass
class Bundle:
    """The archive's files, by path, and what could not be collected."""

    files: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add_json(self, path: str, value: Any) -> None:
        self.files[path] = json.dumps(value, indent=2, sort_keys=True, default=str) + "\n"

    @contextmanager
    def attempt(self, what: str) -> Iterator[None]:
        try:
            yield
        except _RECORDED as exc:
            self.errors.append(f"{what}: {_reason(exc)}")

    def write(self, path: Path, summary: Json) -> None:
        self.add_json("summary.json", {**summary, "errors": self.errors})
        root = path.name.removesuffix(".tar.gz")
        # Created 0600, and made so if it existed (O_CREAT keeps an existing file's mode).
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, ARCHIVE_MODE)
        os.fchmod(descriptor, ARCHIVE_MODE)
        with os.fdopen(descriptor, "wb") as file, tarfile.open(fileobj=file, mode="w:gz") as archive:
            for name, content in sorted(self.files.items()):
                # The Redis passwords read (scrub.register): masked wherever a log line or an error quoted them.
                data = scrub(content).encode()
                info = tarfile.TarInfo(f"{root}/{name}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), ARCHIVE_MODE
                archive.addfile(info, io.BytesIO(data))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except ValueError:
            message = ""
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return text(str(exc))[:500] or type(exc).__name__


def collect_report(api: client.ApiClient, stages: list[Json], options: ReportOptions, target: StageTarget) -> Bundle:
    bundle = Bundle()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    versions: Json = {"phoenix": phoenix.__version__, "python": platform.python_version()}
    with bundle.attempt("Kubernetes version"):
        versions["kubernetes"] = client.VersionApi(api).get_code().git_version
    for stage in stages:
        meta = stage["metadata"]
        bundle.add_json(f"stages/{meta['namespace']}/{meta['name']}.json", _stage_document(stage))
    namespaces: list[str] = sorted(
        {s["metadata"]["namespace"] for s in stages} | set(filter(None, [options.namespace]))
    )
    for ns in namespaces:
        with bundle.attempt(f"Deployments of namespace {ns}"):
            found = apps.list_namespaced_deployment(ns, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}").items
            deployments = [_redacted(api.sanitize_for_serialization(d)) for d in found]
            bundle.add_json(f"workloads/{ns}/deployments.json", deployments)
        redact = WORKER_LOG if options.redact_logs else None
        _pods(bundle, api, ns, f"{NAME_LABEL}={WORKER_APP_NAME}", "workers", options.tail_lines, redact)
    operator_pods = f"{NAME_LABEL}={OPERATOR_APP_NAME}"
    redact = OPERATOR_LOG if options.redact_logs else None
    _pods(bundle, api, options.operator_namespace, operator_pods, "operator", options.tail_lines, redact)
    for ns in sorted({*namespaces, options.operator_namespace}):
        with bundle.attempt(f"Events of namespace {ns}"):
            events = [_event(api.sanitize_for_serialization(e)) for e in core.list_namespaced_event(ns).items]
            bundle.add_json(f"events/{ns}.json", sorted(events, key=lambda e: str(e["last"])))
    if options.redis:
        queue, dead, servers = [], [], []
        for stage in stages:
            meta = stage["metadata"]
            with bundle.attempt(f"Redis of stage {meta['namespace']}/{meta['name']}"):
                spec, settings = target(stage)
                scrub_register(*spec.secrets())
                row, dlq_summary, server = asyncio.run(_redis_parts(spec, settings, meta, options.dlq_scan))
                queue.append(row)
                dead.append(dlq_summary)
                servers.append(server)
        bundle.add_json("redis/queue.json", queue)
        bundle.add_json("redis/dlq.json", dead)
        bundle.add_json("redis/servers.json", servers)
        versions["redis"] = {f"{s['namespace']}/{s['stage']}": s["version"] for s in servers}
    bundle.add_json("versions.json", versions)
    return bundle


def _stage_document(stage: Json) -> Json:
    meta = {k: v for k, v in stage["metadata"].items() if k != "managedFields"}
    if annotations := meta.get("annotations"):
        meta["annotations"] = {k: v for k, v in annotations.items() if k not in _SPEC_COPIES}
    spec = stage.get("spec") or {}
    return {**stage, "metadata": meta, "spec": {**spec, "env": _redacted_env(spec.get("env") or [])}}


def _pods(
    bundle: Bundle,
    api: client.ApiClient,
    ns: str,
    selector: str,
    role: str,
    tail_lines: int,
    redact: LogFields | None = None,
) -> None:
    """The pods `selector` finds in `ns` (their state) and the last `tail_lines` of each container's log (and of
    its previous run, after a restart), through redact_log as `redact` says when given."""
    core = client.CoreV1Api(api)
    with bundle.attempt(f"pods ({role}) of namespace {ns}"):
        pods = [api.sanitize_for_serialization(p) for p in core.list_namespaced_pod(ns, label_selector=selector).items]
        bundle.add_json(f"pods/{ns}/{role}.json", [_pod_summary(p) for p in pods])
        for pod in pods:
            name = pod["metadata"]["name"]
            restarted = {s["name"] for s in pod.get("status", {}).get("containerStatuses", ()) if s["restartCount"]}
            if not pod["spec"].get("nodeName"):
                # Nothing ran, so there is no log to ask for (the API server answers an empty one).
                phase = pod.get("status", {}).get("phase")
                bundle.errors.append(f"logs of {ns}/{name}: no logs, the pod is on no node (phase {phase})")
                continue
            for container in (c["name"] for c in pod["spec"]["containers"]):
                for previous in (False, True) if container in restarted else (False,):
                    with bundle.attempt(f"logs of {ns}/{name}/{container}{' (previous)' if previous else ''}"):
                        lines = core.read_namespaced_pod_log(
                            name, ns, container=container, tail_lines=tail_lines, timestamps=True, previous=previous
                        )
                        log = f"logs/{ns}/{name}/{container}{'.previous' if previous else ''}.log"
                        lines = lines or ""  # an empty log comes back as None
                        bundle.files[log] = redact_log(lines, redact) if redact is not None else lines


def _redacted(deployment: Json) -> Json:
    """A Deployment as the API gives it, minus managedFields, its containers' literal env values redacted but
    Phoenix's own settings' (_redacted_env)."""
    deployment["metadata"].pop("managedFields", None)
    pod_spec = deployment.get("spec", {}).get("template", {}).get("spec", {})
    for container in (*pod_spec.get("containers", ()), *pod_spec.get("initContainers", ())):
        container["env"] = _redacted_env(container.get("env") or [])
    return deployment


def _redacted_env(env: list[Json]) -> list[Json]:
    """`env` (a container's, or spec.env) with every literal value `<redacted>` but those of ENV_KEPT, a URL's user
    info masked in those; a reference (secretKeyRef, fieldRef...) is kept, it holds no value."""
    return [
        {**var, "value": without_user_info(var["value"]) if var["name"].upper() in ENV_KEPT else REDACTED}
        if "value" in var
        else var
        for var in env
    ]


def _pod_summary(pod: Json) -> Json:
    """Where the pod runs and how its containers are, without its spec (the Deployment has it)."""
    status = pod.get("status", {})
    return {
        "name": pod["metadata"]["name"],
        "node": pod["spec"].get("nodeName"),
        **{key: status.get(key) for key in ("phase", "reason", "message", "startTime", "conditions")},
        "containers": [
            {key: s.get(key) for key in ("name", "image", "ready", "restartCount", "state", "lastState")}
            for s in status.get("containerStatuses", ())
        ],
    }


def _event(event: Json) -> Json:
    involved = event.get("involvedObject", {})
    return {
        "type": event.get("type"),
        "reason": event.get("reason"),
        "message": event.get("message"),
        "object": f"{involved.get('kind')}/{involved.get('name')}",
        "count": event.get("count"),
        "first": event.get("firstTimestamp") or event.get("eventTime"),
        "last": event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp"),
        "source": event.get("reportingComponent") or event.get("source", {}).get("component"),
    }


async def _redis_parts(spec: RedisSpec, settings: StageSettings, meta: Json, dlq_scan: int) -> tuple[Json, Json, Json]:
    keys = settings.keys
    where = {"namespace": meta["namespace"], "stage": meta["name"]}
    async with redis_client(spec) as redis:
        (stats,) = await collect(redis, [keys])
        by_type: Counter[str] = Counter()
        scanned = 0
        async for _, fields in dlq.entries(redis, keys.dlq):
            if scanned >= dlq_scan:
                break
            by_type[fields.get("error_type", "(none)")] += 1
            scanned += 1
        risk = await assess_redis(redis)
        info = await redis.info("server")
    dlq_summary = {**where, "dlq": keys.dlq, "length": stats.dlq_length, "counted": scanned, "byErrorType": by_type}
    server = {
        **where,
        "address": spec.redacted,
        "version": f"{'valkey' if 'valkey_version' in info else 'redis'} "
        f"{info.get('valkey_version', info.get('redis_version'))}",
        "mode": info.get("server_mode", info.get("redis_mode")),
        # What RedisRisk reads (maxmemory-policy, persistence, role) and what it concludes.
        "risk": {"checked": risk.checked, "settings": risk.settings, "problems": list(risk.problems)},
    }
    return {**where, **stats.as_status()}, dlq_summary, server


def default_path() -> Path:
    return Path(f"phoenix-report-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.tar.gz")
