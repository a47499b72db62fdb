"""`phoenix ui --port N`: the options, the checks made before anything listens, and the server's life."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path

from aiohttp import web
from kubernetes import config

from phoenix.arguments import port, seconds
from phoenix.cli.kubectl import Stages, add_kube_options, api_client
from phoenix.cli.serving import serve, token_from_file
from phoenix.cli.ui.server import ServerOptions, make_app
from phoenix.cli.ui.source import StageReader
from phoenix.errors import ConfigError

DEFAULT_INTERVAL_SECONDS = 2.0
API_TIMEOUT_SECONDS = 10.0


class UiConfigError(ConfigError):
    """Options `phoenix ui` refuses to start with: one line, exit 2, nothing listening."""


def add_command(sub: argparse._SubParsersAction) -> None:
    u = sub.add_parser(
        "ui", help="serve a read-only live view of every pipeline (its DAG, figures, dead letters) in the browser"
    )
    add_kube_options(u, None)
    u.add_argument("--port", type=port, required=True, help="TCP port to listen on")
    u.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    u.add_argument(
        "--token-file",
        type=Path,
        help="a file holding the bearer token the page must send (a mounted Secret's key); required unless --no-auth",
    )
    u.add_argument("--no-auth", action="store_true", help="serve without a token: only on a loopback --host")
    u.add_argument(
        "--interval",
        type=seconds,
        default=DEFAULT_INTERVAL_SECONDS,
        help=f"seconds between two reads of the stages, and of the page's polls (default {DEFAULT_INTERVAL_SECONDS:g})",
    )
    u.add_argument(
        "--show-data",
        action="store_true",
        help="show dead letters' record data (data, user_id, the producer's fields); by default ids and reasons only",
    )
    u.add_argument("--redis-host", metavar="HOST:PORT", help="reach every stage's Redis here (a port-forward)")
    u.set_defaults(handler=run)


def read_token(args: argparse.Namespace) -> str | None:
    """The bearer token, or None with --no-auth on a loopback address; UiConfigError otherwise."""
    if args.no_auth:
        if args.token_file is not None:
            raise UiConfigError("give --token-file or --no-auth, not both")
        if not _loopback(args.host):
            raise UiConfigError(f"--no-auth is allowed on a loopback --host only, not {args.host!r}")
        return None
    if args.token_file is None:
        raise UiConfigError("give --token-file FILE (the bearer token the page sends), or --no-auth on loopback")
    return token_from_file(args.token_file, UiConfigError)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def run(args: argparse.Namespace) -> int:
    token = read_token(args)
    try:
        api, _ = api_client(args)
    except config.ConfigException as exc:
        raise UiConfigError(f"no Kubernetes configuration: {exc}") from None
    # A hung API server shows on the page as a failed read instead of freezing it.
    stages = Stages(api, request_timeout=max(API_TIMEOUT_SECONDS, args.interval))
    reader = StageReader(stages, args.namespace, args.redis_host, args.show_data)
    runner = web.AppRunner(make_app(reader, ServerOptions(token, args.interval)))
    auth = "no auth (loopback)" if token is None else f"a bearer token from {args.token_file}"
    started = f"phoenix ui: serving http://{args.host}:{args.port}/ ({auth}); the stages read every {args.interval:g} s"
    try:
        await serve(runner, args.host, args.port, UiConfigError, started)
    finally:
        api.close()
    return 0
