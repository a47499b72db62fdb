"""What every operations command shares: the Redis client, a stage's names and timings, and confirmations."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from phoenix.arguments import positive_whole, seconds
from phoenix.errors import PhoenixError
from phoenix.keys import DEFAULT_NAMESPACE, StageKeys, stage_of_input
from phoenix.redis_spec import CONNECT_TIMEOUT_SECONDS, SOCKET_TIMEOUT_SECONDS, RedisSpec, RedisSpecError, connect
from phoenix.tuning import CLAIM_IDLE_MS, LOCK_TIMEOUT, MAX_DELIVERIES
from phoenix.worker_runtime.ownership import laid_out
from phoenix.worker_runtime.settings import WorkerSettings

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
# The connection options besides --redis-url, by RedisSpec field: each a flag, defaulting to the worker's variable.
# The commands send no blocking reads, so the socket timeout only has to outlast a slow scan.
_REDIS_OPTIONS = {
    "mode": ("REDIS_MODE", "standalone (default); sentinel: the URL's hosts are the Sentinels; cluster: seed nodes"),
    "username": ("REDIS_USERNAME", "the ACL user instead of the URL's (a namespace's: its Secret phoenix-redis-user)"),
    "password": ("REDIS_PASSWORD", "its password instead of the URL's (prefer the variable)"),
    "sentinel_master": ("REDIS_SENTINEL_MASTER", "the master's name the Sentinels monitor"),
    "sentinel_username": ("REDIS_SENTINEL_USERNAME", "the Sentinels' own user, when they have one"),
    "sentinel_password": ("REDIS_SENTINEL_PASSWORD", "the Sentinels' own password (prefer the variable)"),
    "tls_ca": ("REDIS_TLS_CA_FILE", "PEM bundle of the CA(s) that signed the server's certificate"),
    "tls_cert": ("REDIS_TLS_CERT_FILE", "client certificate (PEM), for servers that require one"),
    "tls_key": ("REDIS_TLS_KEY_FILE", "the client certificate's private key (PEM)"),
    "connect_timeout": ("REDIS_CONNECT_TIMEOUT", f"seconds (default {CONNECT_TIMEOUT_SECONDS:g})"),
    "socket_timeout": ("REDIS_SOCKET_TIMEOUT", f"seconds a reply may take (default {SOCKET_TIMEOUT_SECONDS:g})"),
}
_PATHS = {"tls_ca", "tls_cert", "tls_key"}
_SECONDS = {"connect_timeout", "socket_timeout"}


class StageUsageError(PhoenixError):
    """Options that do not fit the stage as Redis has it (one line, exit 1; nothing done)."""


class StageSettings(WorkerSettings):
    """A stage's key names and timings derived exactly as its workers derive them, from explicit values only:
    a worker variable left in this shell (INPUT_QUEUE, ...) must not redirect a command about another stage."""

    processor: str = "(not loaded by tooling)"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


# Command-line options that override what a stage's workers were given, by WorkerSettings field.
_OVERRIDES = {
    "input": "input_queue",
    "group": "consumer_group",
    "dlq": "dlq_name",
    "output": "output_queue",
    "claim_idle_ms": "claim_idle_ms",
    "lock_timeout": "lock_timeout",
    "max_deliveries": "max_deliveries",
}


def add_connection_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--redis-url and the other connection options, as the worker's variables name them (docs/configuration.md)."""
    parser.add_argument(
        "--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL), help="default: $REDIS_URL"
    )
    for field, (variable, help_text) in _REDIS_OPTIONS.items():
        flag = "--" + variable.lower().replace("_", "-")
        default = os.environ.get(variable, "")
        parser.add_argument(flag, dest=f"redis_{field}", default=default, help=f"{help_text}; default: ${variable}")
    return parser


def add_redis_argument(parser: argparse.ArgumentParser, *, every_namespace: bool = False) -> argparse.ArgumentParser:
    """The connection options and --namespace, which every command about a stage takes; `every_namespace`: no
    --namespace means every namespace (phoenix status)."""
    add_connection_arguments(parser)
    where = "its Kubernetes namespace, or the KEY_NAMESPACE of a worker run by hand"
    if every_namespace:
        parser.add_argument(
            "--namespace", help=f"only the stages of this namespace ({where}); default: every namespace"
        )
    else:
        parser.add_argument(
            "--namespace",
            default=os.environ.get("KEY_NAMESPACE", DEFAULT_NAMESPACE),
            help=f"the stage's namespace ({where}); default: $KEY_NAMESPACE, else default",
        )
    return parser


def redis_env(args: argparse.Namespace) -> dict[str, str]:
    """The options as the worker's variables, for workers a tool starts (the demo)."""
    given = {variable: getattr(args, f"redis_{field}") for field, (variable, _) in _REDIS_OPTIONS.items()}
    return {"REDIS_URL": args.redis_url} | {name: value for name, value in given.items() if value}


def redis_spec(args: argparse.Namespace) -> RedisSpec:
    """The connection the options describe. Raises RedisSpecError (one line, no secret)."""
    given: dict[str, object] = {}
    for field in _REDIS_OPTIONS:
        value = getattr(args, f"redis_{field}").strip()
        if value and field in _SECONDS:
            try:
                given[field] = float(value)
            except ValueError:
                raise RedisSpecError(f"{_REDIS_OPTIONS[field][0]} must be a number of seconds") from None
        elif value:
            given[field] = Path(value) if field in _PATHS else value
    return RedisSpec.from_url(args.redis_url, **given)


def add_stage_arguments(parser: argparse.ArgumentParser, *, timings: bool = False) -> argparse.ArgumentParser:
    """--service plus the worker variables to pass when the stage does not use the defaults."""
    add_redis_argument(parser)
    parser.add_argument("--service", required=True, help="stage name (SERVICE_NAME)")
    parser.add_argument("--input", help="INPUT_QUEUE, default phoenix:{namespace}:service:input")
    parser.add_argument("--group", help="CONSUMER_GROUP, default service-group")
    parser.add_argument("--dlq", help="DLQ_NAME, default phoenix:{namespace}:service:dlq")
    if timings:
        parser.add_argument("--output", help="OUTPUT_QUEUE, to show what the next stage got")
        parser.add_argument(
            "--claim-idle-ms", type=positive_whole, help=f"CLAIM_IDLE_MS of the stage (default {CLAIM_IDLE_MS.default})"
        )
        parser.add_argument(
            "--lock-timeout",
            type=seconds,
            help=f"LOCK_TIMEOUT of the stage in seconds (default {LOCK_TIMEOUT.default})",
        )
        parser.add_argument(
            "--max-deliveries",
            type=positive_whole,
            help=f"MAX_DELIVERIES of the stage (default {MAX_DELIVERIES.default})",
        )
    return parser


def stage_settings(args: argparse.Namespace) -> StageSettings:
    given = {field: getattr(args, option) for option, field in _OVERRIDES.items() if getattr(args, option, None)}
    return StageSettings(service_name=args.service, key_namespace=args.namespace, **given)


async def laid_out_settings(client: aioredis.Redis, args: argparse.Namespace) -> StageSettings:
    """stage_settings with the partitions of the stage's layout in Redis, and of the next stage's when --output
    is the input of one: a record is looked for in its partition of each. One round trip."""
    settings = stage_settings(args)
    next_stage = stage_of_input(settings.output_queue)
    following = [StageKeys.for_stage(next_stage[1], next_stage[0])] if next_stage else []
    stage, *following = await laid_out(client, [settings.keys, *following])
    output_partitions = following[0].partitions if following else 1
    if stage.partitions == output_partitions == 1:
        return settings
    if stage.partitions > 1 and (args.input or args.dlq):
        raise StageUsageError(
            f"stage {stage.namespace}/{stage.name} has {stage.partitions} partitions, each with its own input and "
            "DLQ: leave out --input and --dlq"
        )
    given = {field: getattr(args, option) for option, field in _OVERRIDES.items() if getattr(args, option, None)}
    return StageSettings(
        service_name=args.service,
        key_namespace=args.namespace,
        partitions=stage.partitions,
        output_partitions=output_partitions,
        **given,
    )


def stage_keys(args: argparse.Namespace) -> StageKeys:
    """The default names of the stage --service in --namespace."""
    return StageKeys.for_stage(args.service, args.namespace)


def redis_client(spec: RedisSpec) -> aioredis.Redis:
    # Entries may hold bytes that are not UTF-8 (they are dead-lettered as malformed): shown escaped, not fatal.
    return connect(spec, decode_responses=True, encoding_errors="backslashreplace")


def client(args: argparse.Namespace) -> aioredis.Redis:
    return redis_client(redis_spec(args))


def confirm(question: str, assume_yes: bool) -> bool:
    """Ask on the terminal; without one, only --yes confirms (a script must say so explicitly). A refusal is told
    on one line, and means nothing was changed."""
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        print(f"{question} [y/N] refused: not a terminal; pass --yes to confirm (nothing changed)", file=sys.stderr)
        return False
    if input(f"{question} [y/N] ").strip().lower() in ("y", "yes"):
        return True
    print("nothing changed", file=sys.stderr)
    return False


def fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def settings_from(values: dict[str, Any]) -> StageSettings:
    """Settings from worker variables by name (as the operator puts them in a pod's env)."""
    return StageSettings(**{name.lower(): value for name, value in values.items()})
