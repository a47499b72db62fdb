"""`kubectl phoenix`: the on-call commands for stages run by the operator, through the API server only.

Installed as the `kubectl-phoenix` executable, which kubectl finds on the PATH. Every call uses the caller's own
kubeconfig and permissions: status reads PhoenixStage status; restart and replay-dlq set the annotations the
operator acts on (replay-dlq without a count asks first); pause and resume set spec.paused; inspect reads the
stage's Redis URL Secret with the caller's rights (a caller who may not read that Secret is told so, never helped
by the operator's) and inspects the record with the stage's own names and timings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from phoenix.arguments import positive_whole, seconds, whole
from phoenix.cli import report
from phoenix.cli.records import inspect_with_repairs, render_inspection, render_trace
from phoenix.cli.stage import StageSettings, confirm, fail, redis_client, settings_from
from phoenix.cli.ui.pipelines import group_stages, next_stages
from phoenix.console import format_columns
from phoenix.crds import GROUP, PLURAL, VERSION, PhoenixStage, SecretKeyRef
from phoenix.errors import PhoenixError
from phoenix.keys import StageKeys
from phoenix.kube_names import PIPELINE_LABEL, REPLAY_ANNOTATION, RESTART_ANNOTATION
from phoenix.operator.builders import resolve_streams, worker_env
from phoenix.operator.errors import StageError
from phoenix.operator.kube.api import MERGE_PATCH, KubeApi
from phoenix.operator.stage.requests import ReplayRequestError, parse_replay_count
from phoenix.redis_spec import RedisSpec, RedisSpecError
from phoenix.tools import audit
from phoenix.tools.inspection import DEFAULT_SCAN_LIMIT, RecordReport
from phoenix.tools.trace import Trace, trace_record

Json = dict[str, Any]
_WAIT_POLL_SECONDS = 0.5


def _json(reply: object) -> Json:
    # The custom objects API is typed `object`; it returns the JSON object of the resource (or of the list).
    return cast(Json, reply)


class PluginError(PhoenixError):
    """One readable line for the caller; never holds a secret."""


class Stages:
    """The PhoenixStage calls, with the caller's kubeconfig (or in-cluster identity)."""

    def __init__(self, api: client.ApiClient, request_timeout: float | None = None) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        # list and get: seconds a reply may take (None: as long as it takes), for a server that polls them.
        self.request_timeout = request_timeout

    def list(self, namespace: str | None) -> list[Json]:
        if namespace is None:
            found = self.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=self.request_timeout
            )
        else:
            found = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _request_timeout=self.request_timeout
            )
        return sorted(_json(found)["items"], key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"]))

    def get(self, namespace: str, name: str) -> Json:
        try:
            found = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self.request_timeout
            )
            return _json(found)
        except ApiException as exc:
            if exc.status == 404:
                raise PluginError(f"PhoenixStage {namespace}/{name} not found") from None
            raise

    def patch(self, namespace: str, name: str, patch: Json) -> Json:
        self.get(namespace, name)  # a clear "not found" instead of the API's
        return _json(
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, patch, _content_type=MERGE_PATCH
            )
        )

    def wait_for(self, namespace: str, name: str, done: Callable[[Json], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if result := done(self.get(namespace, name).get("status") or {}):
                return result
            time.sleep(_WAIT_POLL_SECONDS)
        raise PluginError(
            f"the operator did not act within {timeout:g} s: is it running? "
            f"(kubectl describe phoenixstage -n {namespace} {name})"
        )


# -- commands -------------------------------------------------------------------------------------------------------


def status_rows(stages: Sequence[Json]) -> list[Json]:
    rows = []
    for stage in stages:
        st, spec = stage.get("status") or {}, stage.get("spec") or {}
        ready = next((c for c in st.get("conditions", []) if c.get("type") == "Ready"), None)
        queue = st.get("queue") or {}
        rows.append(
            {
                "namespace": stage["metadata"]["namespace"],
                "stage": stage["metadata"]["name"],
                "ready": "Unknown"
                if ready is None
                else (ready["status"] if ready["status"] == "True" else f"{ready['status']}: {ready['reason']}"),
                "replicas": (st.get("replicas") or {}).get("summary"),
                "paused": bool(spec.get("paused")),
                **{key: queue.get(key) for key in ("lag", "pending", "oldestPendingSeconds", "dlqLength")},
                "lastReplay": st.get("lastReplay"),
            }
        )
    return rows


def format_status(rows: Sequence[Json]) -> list[str]:
    header = ("NAMESPACE", "STAGE", "READY", "REPLICAS", "PAUSED", "LAG", "PENDING", "OLDEST(s)", "DLQ")
    lines: list[tuple[str, ...]] = [header]
    for r in rows:
        cells = (
            r["namespace"],
            r["stage"],
            r["ready"],
            r["replicas"],
            "yes" if r["paused"] else "no",
            r["lag"],
            r["pending"],
            r["oldestPendingSeconds"],
            r["dlqLength"],
        )
        lines.append(tuple("-" if c is None else str(c) for c in cells))
    return format_columns(lines)


def cmd_status(stages: Stages, args: argparse.Namespace) -> int:
    rows = status_rows(stages.list(args.namespace))
    print(json.dumps(rows) if args.json else "\n".join(format_status(rows)))
    return 0


def cmd_restart(stages: Stages, args: argparse.Namespace) -> int:
    value = datetime.now(UTC).isoformat(timespec="milliseconds")
    ns = _namespace(args)
    stages.patch(ns, args.stage, {"metadata": {"annotations": {RESTART_ANNOTATION: value}}})
    print(f"asked the operator to restart the workers of {ns}/{args.stage} ({RESTART_ANNOTATION}={value})")
    if args.wait:
        at = stages.wait_for(
            ns, args.stage, lambda st: st.get("handledRestart") == value and st.get("lastRestart"), args.timeout
        )
        print(f"restarted at {at}")
    return 0


def cmd_replay(stages: Stages, args: argparse.Namespace) -> int:
    ns = _namespace(args)
    status = stages.get(ns, args.stage).get("status") or {}
    count = args.count
    if count is None:
        # Every entry is a lot to send back by leaving out a word: asked first, as `phoenix dlq replay` does.
        length = (status.get("queue") or {}).get("dlqLength")
        known = "" if length is None else f" ({length} at the last status refresh)"
        if not confirm(f"Replay every DLQ entry of {ns}/{args.stage}{known}?", args.yes):
            return 1
        count = "all"
    try:
        parse_replay_count(count)
    except ReplayRequestError as exc:
        raise PluginError(str(exc)) from None
    before = status.get("lastReplay")
    stages.patch(ns, args.stage, {"metadata": {"annotations": {REPLAY_ANNOTATION: count}}})
    print(f"asked the operator to replay {count} DLQ entries of {ns}/{args.stage} ({REPLAY_ANNOTATION}={count})")
    if args.wait:
        last = stages.wait_for(
            ns, args.stage, lambda st: st.get("lastReplay") != before and st.get("lastReplay"), args.timeout
        )
        print(f"replayed: {last['moved']} entries moved back to the input at {last['at']}")
    return 0


def _set_paused(paused: bool) -> Callable[[Stages, argparse.Namespace], int]:
    def command(stages: Stages, args: argparse.Namespace) -> int:
        ns = _namespace(args)
        stages.patch(ns, args.stage, {"spec": {"paused": paused}})
        effect = "scales its workers to 0; entries wait in the stream" if paused else "scales its workers back up"
        print(f"{'paused' if paused else 'resumed'} {ns}/{args.stage}: the operator {effect}")
        return 0

    return command


def cmd_inspect(stages: Stages, args: argparse.Namespace) -> int:
    redis, settings = stage_target(stages.api, stages.get(_namespace(args), args.stage), args.redis_host)
    print(render_inspection(*asyncio.run(_inspect(redis, settings, args.record_id, args.scan)), args.json))
    return 0


def stage_target(api: client.ApiClient, body: Json, redis_host: str | None) -> tuple[RedisSpec, StageSettings]:
    """The stage's Redis (its URL Secret read with the caller's own rights, kept in memory only) and the names and
    timings its workers get. `redis_host`: another host:port (a `kubectl port-forward`), keeping credentials and
    database."""
    stage = PhoenixStage.from_body(body)
    ns, spec = body["metadata"]["namespace"], stage.spec
    url = asyncio.run(_redis_url(api, ns, spec.redis.url_secret_ref))
    try:
        redis = RedisSpec.from_url(url)
        if redis_host:
            redis = redis.model_copy(update={"hosts": RedisSpec.from_url(f"redis://{redis_host}").hosts})
    except RedisSpecError as exc:
        raise PluginError(f"the stage's Redis URL (Secret {spec.redis.url_secret_ref.name!r}): {exc}") from None
    return redis, spec_settings(stage, ns)


def spec_settings(stage: PhoenixStage, ns: str) -> StageSettings:
    """The names and timings the operator gives the stage's pods, minus anything that comes from a Secret."""
    name, spec = stage.metadata.name, stage.spec
    streams = resolve_streams(name, ns, spec)
    if stage.status and (known := stage.status.streams):  # the names the operator resolved, if it has
        streams = StageKeys.for_stage(
            name, ns, input=known.input, group=known.consumer_group, dlq=known.dlq, output=known.output
        )
    plain = {var["name"]: var["value"] for var in worker_env(name, spec, streams) if "value" in var}
    return settings_from(plain)


def cmd_trace(stages: Stages, args: argparse.Namespace) -> int:
    ns = _namespace(args)
    bodies = pipeline_stages(stages, ns, args.pipeline, args.stage or [])
    # One Redis for the pipeline: its stages hand records to each other through its streams.
    redis, _ = stage_target(stages.api, bodies[0], args.redis_host)
    settings = [spec_settings(PhoenixStage.from_body(body), ns) for body in bodies]
    print(render_trace(asyncio.run(_trace(redis, args.pipeline, settings, args.record_id, args.scan)), args.json))
    return 0


def pipeline_stages(stages: Stages, ns: str, pipeline: str, named: Sequence[str]) -> list[Json]:
    """The pipeline's PhoenixStages in order: those named, when more than one; else the one named, or the first
    stages (those no other one feeds) of the pipeline `pipeline` as `phoenix ui` groups them (by its label, else
    the connected stages named after their first), then the stages their output edges lead to, breadth first."""
    if len(named) > 1:
        return [stages.get(ns, name) for name in named]
    bodies = {body["metadata"]["name"]: body for body in stages.list(ns)}
    if named:
        start = list(named)
    else:
        groups = group_stages(list(bodies.values()))
        members = next((found for _, name, _, found in groups if name == pipeline), None)
        if members is None:
            raise PluginError(
                f"no pipeline {pipeline!r} in {ns} (stages labelled {PIPELINE_LABEL}={pipeline}, or connected stages "
                f"whose first is {pipeline}): name its first stage with --stage"
            )
        fed = {target for body in members for _, target in next_stages(body)}
        start = [body["metadata"]["name"] for body in members if body["metadata"]["name"] not in fed]
    order: list[Json] = []
    queue, seen = list(start), set(start)
    while queue:  # breadth first: a stage after every stage fewer hops from the start
        body = bodies.get(name := queue.pop(0)) or stages.get(ns, name)  # get: a clear "not found"
        order.append(body)
        for _, following in next_stages(body):
            if following not in seen:
                seen.add(following)
                queue.append(following)
    return order


def cmd_report(stages: Stages, args: argparse.Namespace) -> int:
    options = report.ReportOptions(
        args.namespace,
        args.operator_namespace,
        args.tail,
        args.dlq_scan,
        redis=not args.no_redis,
        redact_logs=not args.unredacted_logs,
    )
    found = stages.list(args.namespace)

    def target(body: Json) -> tuple[RedisSpec, StageSettings]:
        try:
            return stage_target(stages.api, body, args.redis_host)
        except PluginError as exc:
            raise report.UnreadableStage(str(exc)) from None

    bundle = report.collect_report(stages.api, found, options, target)
    path = args.output or report.default_path()
    bundle.write(path, {"stages": len(found), "namespace": args.namespace or "(all)", "tailLines": args.tail})
    print(f"wrote {path}: {len(found)} stages, {len(bundle.files)} files")
    for error in bundle.errors:
        print(f"  not collected: {error}")
    return 0


async def _redis_url(api: client.ApiClient, namespace: str, ref: SecretKeyRef) -> str:
    kube = KubeApi(api)
    try:
        return await kube.secret_value(namespace, ref)
    except StageError as exc:
        raise PluginError(exc.message) from None
    except ApiException as exc:
        if exc.status == 403:
            raise PluginError(
                f"your Kubernetes identity may not read Secret {ref.name!r} in namespace {namespace!r} (get "
                "secrets), which holds the stage's Redis URL; inspect uses only your own permissions"
            ) from None
        raise
    finally:
        await kube.aclose()


async def _inspect(
    spec: RedisSpec, settings: StageSettings, record_id: str, scan: int
) -> tuple[RecordReport, list[audit.Repair]]:
    async with redis_client(spec) as redis:
        return await inspect_with_repairs(redis, settings, record_id, scan)


async def _trace(spec: RedisSpec, pipeline: str, stages: list[StageSettings], record_id: str, scan: int) -> Trace:
    async with redis_client(spec) as redis:
        return await trace_record(redis, pipeline, stages, record_id, scan)


def _namespace(args: argparse.Namespace) -> str:
    return args.namespace or args.default_namespace


# -- entry point ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl phoenix", description=__doc__.splitlines()[0])
    add_kube_options(p, None)
    # Also accepted after the command, as kubectl users type them (`kubectl phoenix pause router -n team`).
    common = add_kube_options(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, parents=[common])

    st = add("status", "every stage with its readiness, replicas and queue, from its status")
    st.add_argument("--json", action="store_true")
    st.set_defaults(handler=cmd_status)
    for name, handler, text in (
        ("restart", cmd_restart, "roll the stage's workers"),
        ("replay-dlq", cmd_replay, "move DLQ entries back to the input stream"),
        ("pause", _set_paused(True), "scale the stage to zero; entries wait"),
        ("resume", _set_paused(False), "undo pause"),
    ):
        c = add(name, text)
        c.add_argument("stage")
        if name == "replay-dlq":
            c.add_argument("count", nargs="?", help="N oldest entries, or all; left out: all, after a question")
            c.add_argument("--yes", action="store_true", help="replay all without asking when no count is given")
        if name in ("restart", "replay-dlq"):
            c.add_argument("--wait", action="store_true", help="wait until the operator reports it done")
            c.add_argument("--timeout", type=seconds, default=120, help="seconds to wait")
        c.set_defaults(handler=handler)
    i = add("inspect", "phoenix inspect for a record of a stage, with your own permissions")
    i.add_argument("stage")
    i.add_argument("record_id")
    i.add_argument("--redis-host", metavar="HOST:PORT", help="reach Redis here instead (a kubectl port-forward)")
    i.add_argument("--json", action="store_true")
    i.add_argument("--scan", type=positive_whole, default=DEFAULT_SCAN_LIMIT)
    i.set_defaults(handler=cmd_inspect)
    t = add("trace", "phoenix trace: where a record is in each stage of a pipeline, with your own permissions")
    t.add_argument("record_id")
    t.add_argument("--pipeline", default="", help="the pipeline (its stages' phoenix.io/pipeline label)")
    t.add_argument(
        "--stage", action="append", help="the stages in order; one: the first, the others found by its output edges"
    )
    t.add_argument("--redis-host", metavar="HOST:PORT", help="reach Redis here instead (a kubectl port-forward)")
    t.add_argument("--json", action="store_true")
    t.add_argument("--scan", type=positive_whole, default=DEFAULT_SCAN_LIMIT)
    t.set_defaults(handler=cmd_trace)
    r = add("report", "one tar.gz for support: stages, Events, logs, queue state, DLQ counts, Redis settings")
    r.add_argument("-o", "--output", type=Path, help="the archive (default ./phoenix-report-<UTC time>.tar.gz)")
    r.add_argument("--tail", type=whole, default=report.DEFAULT_TAIL_LINES, help="last N log lines per container")
    r.add_argument("--operator-namespace", default="phoenix-system", help="where the operator's pods run")
    r.add_argument(
        "--no-redis", action="store_true", help="leave out queue, DLQ and Redis settings: reads no Secret at all"
    )
    r.add_argument("--redis-host", metavar="HOST:PORT", help="reach every stage's Redis here (a port-forward)")
    r.add_argument(
        "--unredacted-logs",
        action="store_true",
        help="the workers' and the operator's log lines as written (by default a record's ids, error texts, a"
        " processor's fields, tracebacks and the operator's debug messages are redacted)",
    )
    r.add_argument("--dlq-scan", type=whole, default=report.DEFAULT_DLQ_SCAN, help="DLQ entries counted at most")
    r.set_defaults(handler=cmd_report)
    return p


def add_kube_options(parser: argparse.ArgumentParser, default: Any) -> argparse.ArgumentParser:
    parser.add_argument("--kubeconfig", default=default, help="default: $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--context", default=default, help="kubeconfig context")
    parser.add_argument("-n", "--namespace", default=default, help="namespace (status: default all namespaces)")
    return parser


def api_client(args: argparse.Namespace) -> tuple[client.ApiClient, str]:
    """The caller's client and their context's namespace (in a pod: its ServiceAccount and namespace)."""
    try:
        api = config.new_client_from_config(config_file=args.kubeconfig, context=args.context)
        contexts, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
        if args.context:  # new_client_from_config has checked that it exists
            active = next(c for c in contexts if c["name"] == args.context)
        return api, active.get("context", {}).get("namespace") or "default"
    except config.ConfigException:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration), "default"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        api, args.default_namespace = api_client(args)
    except config.ConfigException as exc:
        return fail(f"kubectl phoenix: no Kubernetes configuration: {exc}")
    try:
        with api:
            return args.handler(Stages(api), args)
    except PluginError as exc:
        return fail(f"kubectl phoenix: {exc}")
    except ApiException as exc:
        return fail(f"kubectl phoenix: the API server refused: {exc.status} {exc.reason}")


if __name__ == "__main__":
    sys.exit(main())
