"""Command-line options of `phoenix operator` (kept free of kopf imports so `phoenix --help` stays fast)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from phoenix.arguments import matching, port, seconds, seconds_or_zero

DEFAULT_REFRESH_SECONDS = 10.0
DEFAULT_LEASE_NAME = "phoenix-operator"
# A namespace user's password is replaced this often, and the one replaced stays valid this long (the workers roll
# onto the new one meanwhile).
DEFAULT_ACL_ROTATION_SECONDS = 30 * 86400.0
DEFAULT_ACL_GRACE_SECONDS = 900.0
CLUSTER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


@dataclass(frozen=True)
class AclOptions:
    """--redis-acl-admin-secret and its companions: the operator runs one Redis ACL user per namespace."""

    admin_secret: str  # in the operator's own namespace: key `url`, the Redis URL with the admin's credentials
    admin_namespace: str | None  # None: the pod's own namespace
    rotation_seconds: float  # 0: never rotated
    grace_seconds: float


@dataclass(frozen=True)
class OperatorOptions:
    namespaces: tuple[str, ...]  # empty: every namespace
    liveness: str | None
    refresh_interval: float
    verbose: bool
    log_format: str
    metrics_port: int  # 0: no metrics/health server
    leader_election: bool
    lease_name: str
    lease_namespace: str | None  # None: the pod's own namespace
    cluster_id: str | None  # None: the uid of the cluster's kube-system namespace
    acl: AclOptions | None  # None: no Redis ACL users (the default)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OperatorOptions:
        return cls(
            namespaces=tuple(args.namespace or ()),
            liveness=args.liveness,
            refresh_interval=args.refresh_interval,
            verbose=args.verbose,
            log_format=args.log_format,
            metrics_port=args.metrics_port,
            leader_election=args.leader_election,
            lease_name=args.lease_name,
            lease_namespace=args.lease_namespace,
            cluster_id=args.cluster_id or None,
            acl=None
            if not args.redis_acl_admin_secret
            else AclOptions(
                admin_secret=args.redis_acl_admin_secret,
                admin_namespace=args.lease_namespace,
                rotation_seconds=args.redis_acl_rotation_seconds,
                grace_seconds=args.redis_acl_grace_seconds,
            ),
        )


def _default_log_format() -> str:
    return "json" if os.environ.get("LOG_FORMAT", "").lower() == "json" else "full"


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        metavar="NS",
        help="serve this namespace (repeatable; kopf globs like `team-*` work); default: all namespaces",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="serve every namespace (the default)")
    parser.add_argument(
        "--liveness", metavar="URL", help="serve kopf's health endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--refresh-interval",
        type=seconds,
        metavar="SECONDS",
        default=float(os.environ.get("PHOENIX_REFRESH_INTERVAL", DEFAULT_REFRESH_SECONDS)),
        help=f"seconds between status refreshes of all stages (default ${{PHOENIX_REFRESH_INTERVAL}} or "
        f"{DEFAULT_REFRESH_SECONDS:g})",
    )
    parser.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        default=os.environ.get("PHOENIX_METRICS_PORT", "0"),
        help="serve /metrics, /healthz and /readyz on this port, leader or standby (default $PHOENIX_METRICS_PORT "
        "or 0: off)",
    )
    parser.add_argument(
        "--leader-election",
        action="store_true",
        help="run the handlers only while holding a coordination.k8s.io Lease, so that several replicas can run",
    )
    parser.add_argument("--lease-name", default=DEFAULT_LEASE_NAME, help=f"default: {DEFAULT_LEASE_NAME}")
    parser.add_argument(
        "--lease-namespace",
        metavar="NS",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the Lease (default $POD_NAMESPACE, else the pod's own namespace)",
    )
    parser.add_argument(
        "--cluster-id",
        type=matching(
            CLUSTER_ID_PATTERN, "not 1 to 128 letters, digits, '.', '_' or '-' starting with a letter or digit"
        ),
        metavar="ID",
        default=os.environ.get("PHOENIX_CLUSTER_ID") or None,
        help="this Kubernetes cluster's name in the ownership markers of the stages' Redis keys, so that clusters "
        "sharing a Redis never take each other's keys (default $PHOENIX_CLUSTER_ID, else the uid of the "
        "kube-system namespace; set it where the operator may not read that namespace)",
    )
    parser.add_argument(
        "--redis-acl-admin-secret",
        metavar="NAME",
        default=os.environ.get("PHOENIX_REDIS_ACL_ADMIN_SECRET", ""),
        help="run one Redis ACL user per namespace on the Redis this Secret of the operator's namespace names (key "
        "`url`: the Redis URL with credentials allowed ACL SETUSER and DELUSER); off by default "
        "(docs/operator.md, Redis ACL users)",
    )
    parser.add_argument(
        "--redis-acl-rotation-seconds",
        type=seconds_or_zero,
        metavar="SECONDS",
        default=DEFAULT_ACL_ROTATION_SECONDS,
        help=f"replace a namespace user's password this often, 0: never (default {DEFAULT_ACL_ROTATION_SECONDS:g})",
    )
    parser.add_argument(
        "--redis-acl-grace-seconds",
        type=seconds_or_zero,
        metavar="SECONDS",
        default=DEFAULT_ACL_GRACE_SECONDS,
        help=f"how long a replaced password stays valid while the workers roll (default {DEFAULT_ACL_GRACE_SECONDS:g})",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format",
        choices=("json", "full", "plain"),
        default=_default_log_format(),
        help="default: json when $LOG_FORMAT is json (as for workers), else full",
    )
    return parser


def parse_options(argv: list[str] | None = None) -> OperatorOptions:
    parser = add_arguments(argparse.ArgumentParser(prog="phoenix operator", description="The Phoenix operator."))
    return OperatorOptions.from_args(parser.parse_args(argv))
