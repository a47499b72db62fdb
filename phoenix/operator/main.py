"""`phoenix operator`: runs the kopf operator for PhoenixStages until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import kopf

from phoenix.operator import handlers  # noqa: F401  (registers the kopf handlers)
from phoenix.operator.context import OperatorContext
from phoenix.operator.kube import KubeApi, load_client
from phoenix.operator.options import OperatorOptions, parse_options

# Kubernetes calls run in threads (the official client blocks); 200 stages reconciling at once need more
# than asyncio's default of cpu+4 threads to stay quick.
API_THREADS = 32


def run(options: OperatorOptions) -> int:
    kopf.configure(verbose=options.verbose, log_format=kopf.LogFormat[options.log_format.upper()])
    context = OperatorContext(KubeApi(load_client(API_THREADS)), options.namespaces, options.refresh_interval)
    loop = asyncio.new_event_loop()
    loop.set_default_executor(ThreadPoolExecutor(API_THREADS, thread_name_prefix="kube-api"))
    try:
        kopf.run(
            loop=loop,
            standalone=True,
            clusterwide=not options.namespaces,
            namespaces=options.namespaces,
            liveness_endpoint=options.liveness,
            memo=kopf.Memo(context=context),
        )
    finally:
        loop.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_options(None if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
