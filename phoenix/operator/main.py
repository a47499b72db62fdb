"""`phoenix operator`: runs the kopf operator for PhoenixStages until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import kopf
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError, MaxRetryError

from phoenix.kube_names import MANAGED_BY
from phoenix.operator import handlers  # noqa: F401  (registers the kopf handlers)
from phoenix.operator.context import OperatorContext
from phoenix.operator.kube import leader
from phoenix.operator.kube.api import KubeApi, load_client
from phoenix.operator.metrics import LEADER, REGISTRY
from phoenix.operator.options import OperatorOptions, parse_options
from phoenix.operator.redis.acl import RedisUsers
from phoenix.worker_runtime.health import start_health_server
from phoenix.worker_runtime.tracing import TraceIdsFilter, TracingConfigError, configure_tracing

# Kubernetes calls run in threads (the official client blocks); 200 stages reconciling at once need more
# than asyncio's default of cpu+4 threads to stay quick.
logger = logging.getLogger(__name__)
API_THREADS = 32
# What makes a --namespace value one of kopf's patterns (globs, negations, lists) rather than a name.
NAMESPACE_PATTERN_CHARACTERS = set("*?[]!,")
# /readyz asks the API server at most this often (probes of several replicas, Prometheus, a person's curl) and
# waits at most this long: inside the probe's own timeout (manifests/operator/deployment.yaml: 2 s).
READY_CHECK_SECONDS = 5.0
READY_CHECK_TIMEOUT_SECONDS = 1.5


class ApiReachability:
    """Whether the Kubernetes API server answers this replica (GET /version), asked at most every
    READY_CHECK_SECONDS: an operator that cannot reach it can neither act nor take over, so it is not ready."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self._version = client.VersionApi(api_client)
        self._lock = asyncio.Lock()
        self._checked_at = float("-inf")
        self._problem: str | None = None

    async def problem(self) -> str | None:
        """None when the API server answered, else why not (no secret: the error names the server only)."""
        async with self._lock:
            if time.monotonic() - self._checked_at >= READY_CHECK_SECONDS:
                try:
                    await asyncio.to_thread(
                        self._version.get_code, _preload_content=False, _request_timeout=READY_CHECK_TIMEOUT_SECONDS
                    )
                    self._problem = None
                except ApiException as exc:
                    self._problem = f"{exc.status} {exc.reason}"
                except MaxRetryError as exc:
                    self._problem = type(exc.reason or exc).__name__  # ReadTimeoutError, NewConnectionError, ...
                except (HTTPError, OSError) as exc:
                    self._problem = type(exc).__name__
                self._checked_at = time.monotonic()
            return self._problem


@contextlib.asynccontextmanager
async def serving_metrics(port: int, api: ApiReachability) -> AsyncIterator[None]:
    """/metrics, /healthz and /readyz on `port` (0: none), on the leader and on a standby alike."""
    if not port:
        yield
        return

    async def role() -> tuple[bool, str]:
        if problem := await api.problem():
            return False, f"kubernetes API unreachable: {problem}"
        return True, "leader" if REGISTRY.get_sample_value("phoenix_operator_leader") else "standby"

    # Answering at all is the liveness signal: the server runs on the operator's event loop.
    runner = await start_health_server(port, alive=lambda: (True, "ok"), ready=role, registry=REGISTRY)
    try:
        yield
    finally:
        await runner.cleanup()


async def cluster_identity(kube: KubeApi, configured: str | None, namespaces: tuple[str, ...]) -> str:
    """--cluster-id, else the uid of the kube-system namespace: unique to the cluster and kept for its life. ""
    (markers then carry none, as before) when the operator may not read it and was given none: an operator serving
    named namespaces (whose install grants nothing cluster-wide) does not try."""
    if configured:
        return configured
    if namespaces:
        logger.warning(
            "no cluster identity: an operator serving named namespaces reads nothing outside them; give it "
            "--cluster-id so that the ownership markers of the stages' Redis keys name this cluster"
        )
        return ""
    try:
        return await kube.namespace_uid("kube-system")
    except (ApiException, HTTPError, OSError) as exc:
        reason = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else type(exc).__name__
        logger.warning(
            "no cluster identity: the kube-system namespace could not be read (%s) and no --cluster-id was given; "
            "the ownership markers of the stages' Redis keys name no cluster",
            reason,
        )
        return ""


async def operate(
    options: OperatorOptions, api_client: client.ApiClient, context: OperatorContext, lease: leader.LeaseConfig | None
) -> None:
    """Run kopf until stopped; with a Lease, only while holding it."""
    context.cluster = await cluster_identity(context.kube, options.cluster_id, options.namespaces)
    if options.acl is not None:
        namespace = leader.lease_namespace(options.acl.admin_namespace)
        context.users = RedisUsers(context.kube, options.acl, namespace, context.cluster)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # kopf installs its own handlers while it runs; these cover a standby, which does not run kopf.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    settings = kopf.OperatorSettings()
    # Exact namespace names need no right to watch CRDs or namespaces, which the namespaced install does not grant:
    # the PhoenixStage API is found once at start, through discovery.
    settings.scanning.disabled = bool(options.namespaces) and not any(
        set(namespace) & NAMESPACE_PATTERN_CHARACTERS for namespace in options.namespaces
    )
    run_kopf = functools.partial(
        kopf.operator,
        settings=settings,
        standalone=True,
        clusterwide=not options.namespaces,
        namespaces=options.namespaces,
        liveness_endpoint=options.liveness,
        memo=kopf.Memo(context=context),
        stop_flag=stop,
    )
    async with serving_metrics(options.metrics_port, ApiReachability(api_client)):
        if lease is None:
            LEADER.set(1)
            await run_kopf()
        else:
            await leader.lead(leader.LeaseElector(api_client, lease), run_kopf, stop, LEADER.set)


def run(options: OperatorOptions) -> int:
    kopf.configure(verbose=options.verbose, log_format=kopf.LogFormat[options.log_format.upper()])
    lease = None
    try:
        # The same OTEL_* environment as the workers': a span per reconcile (stage_reconcile.reconcile_stage).
        shutdown_tracing = configure_tracing(MANAGED_BY)  # its service.name unless OTEL_SERVICE_NAME
    except TracingConfigError as exc:
        print(f"phoenix operator: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if shutdown_tracing is not None:
        for handler in logging.getLogger().handlers:  # kopf.configure's: every line it writes
            handler.addFilter(TraceIdsFilter())
    if options.leader_election:
        try:
            lease = leader.lease_config(options.lease_name, options.lease_namespace)
        except leader.LeaseConfigError as exc:
            print(f"phoenix operator: {exc}", file=sys.stderr)
            return 2
    if options.acl is not None:
        try:
            leader.lease_namespace(options.acl.admin_namespace)
        except leader.LeaseConfigError:
            print(
                "phoenix operator: --redis-acl-admin-secret needs the operator's namespace: --lease-namespace (or "
                "$POD_NAMESPACE) when not running in a pod",
                file=sys.stderr,
            )
            return 2
    api_client = load_client(API_THREADS)
    context = OperatorContext(KubeApi(api_client), options.namespaces, options.refresh_interval)
    loop = asyncio.new_event_loop()
    loop.set_default_executor(ThreadPoolExecutor(API_THREADS, thread_name_prefix="kube-api"))
    try:
        loop.run_until_complete(operate(options, api_client, context, lease))
    finally:
        loop.close()
        if shutdown_tracing is not None:
            shutdown_tracing()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_options(None if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
