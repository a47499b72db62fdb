"""`phoenix ingest --port N --token-file F`: the options, the checks made before anything listens, and the
server's life. Its pipelines come from the API server (the PhoenixStages of --namespace, as `phoenix trace` finds
them), or, with --stage, the one pipeline --pipeline of those stages on --redis-url (no Kubernetes)."""

from __future__ import annotations

import argparse
from pathlib import Path

from aiohttp import web
from kubernetes import config

from phoenix.arguments import port, positive_whole, seconds, whole
from phoenix.cli.ingest.server import ServerOptions, make_app
from phoenix.cli.ingest.targets import GivenPipeline, IngestOptions, KubePipelines, PipelineSource, Targets
from phoenix.cli.kubectl import Stages, api_client
from phoenix.cli.serving import serve, token_from_file
from phoenix.cli.stage import add_redis_argument, redis_spec
from phoenix.errors import ConfigError

API_TIMEOUT_SECONDS = 10.0
DEFAULT_REFRESH_SECONDS = 10.0
DEFAULT_RETRY_AFTER_SECONDS = 5
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class IngestConfigError(ConfigError):
    """Options `phoenix ingest` refuses to start with: one line, exit 2, nothing listening."""


def add_command(sub: argparse._SubParsersAction) -> None:
    i = add_redis_argument(
        sub.add_parser(
            "ingest",
            help="serve HTTP ingest: POST records into a pipeline's first stage (once per record id), GET a record's "
            "trace",
        )
    )
    i.add_argument("--port", type=port, required=True, help="TCP port to listen on")
    i.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    i.add_argument(
        "--token-file", type=Path, required=True, help="a file holding the bearer token clients send (a Secret's key)"
    )
    i.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config, in a pod its ServiceAccount")
    i.add_argument("--context", help="kubeconfig context")
    i.add_argument("--redis-host", metavar="HOST:PORT", help="reach every pipeline's Redis here (a port-forward)")
    i.add_argument(
        "--stage",
        action="append",
        help="without Kubernetes: a stage of the one pipeline --pipeline, repeated in its order (the first takes the "
        "records), on --redis-url",
    )
    i.add_argument("--pipeline", help="with --stage: the pipeline's name in the URL")
    i.add_argument(
        "--high-water",
        type=whole,
        help="answer 429 while the first stage's input holds this many unfinished entries (default: the first "
        "stage's OUTPUT_HIGH_WATER; 0: never)",
    )
    i.add_argument(
        "--dedup-seconds",
        type=positive_whole,
        help="how long a record id stays a duplicate (default: the first stage's IDEMPOTENCY_TTL)",
    )
    i.add_argument(
        "--retry-after",
        type=positive_whole,
        default=DEFAULT_RETRY_AFTER_SECONDS,
        help=f"seconds a 429 or 503 tells the client to wait (default {DEFAULT_RETRY_AFTER_SECONDS})",
    )
    i.add_argument(
        "--refresh",
        type=seconds,
        default=DEFAULT_REFRESH_SECONDS,
        help=f"seconds a pipeline's stages are kept before they are read again (default {DEFAULT_REFRESH_SECONDS:g})",
    )
    i.add_argument(
        "--max-body-bytes",
        type=positive_whole,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"the largest request body (default {DEFAULT_MAX_BODY_BYTES}; larger: 413)",
    )
    i.set_defaults(handler=run)


def source(args: argparse.Namespace) -> tuple[PipelineSource, str]:
    """The pipelines' source and how the start line names it."""
    if args.stage:
        if not args.pipeline:
            raise IngestConfigError("--stage needs --pipeline NAME (the pipeline's name in the URL)")
        return GivenPipeline(args.pipeline, args.stage, args.namespace, redis_spec(args)), (
            f"pipeline {args.pipeline} ({', '.join(args.stage)}) on {redis_spec(args).redacted}"
        )
    if args.pipeline:
        raise IngestConfigError("--pipeline goes with --stage; without them every pipeline of --namespace is served")
    try:
        api, _ = api_client(args)
    except config.ConfigException as exc:
        raise IngestConfigError(f"no Kubernetes configuration (or give --stage): {exc}") from None
    stages = Stages(api, request_timeout=API_TIMEOUT_SECONDS)
    return KubePipelines(stages, args.namespace, args.redis_host), f"the pipelines of namespace {args.namespace}"


async def run(args: argparse.Namespace) -> int:
    token = token_from_file(args.token_file, IngestConfigError)
    found, serving = source(args)
    targets = Targets(found, IngestOptions(args.high_water, args.dedup_seconds, args.refresh))
    app = make_app(targets, ServerOptions(token, args.retry_after, args.max_body_bytes))
    started = f"phoenix ingest: serving http://{args.host}:{args.port}/ for {serving}"
    try:
        await serve(web.AppRunner(app, access_log=None), args.host, args.port, IngestConfigError, started)
    finally:
        if isinstance(found, KubePipelines):
            found.stages.api.close()
    return 0
