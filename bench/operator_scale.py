"""`make bench-operator`: 200 PhoenixStages on the tests' local control plane, one operator, one Valkey.

Prints the time from `kubectl apply` until every stage is Ready, and the cost of one status refresh cycle over
all of them (Redis round trips, status patches, seconds) as the operator reports it on its liveness endpoint:
when every stage began to queue (a change of state, written at once), then when every stage's figures moved
(written a share a cycle, refresh.due_writes), with the seconds until every stage's status showed them.
Targets: all Ready within 60 s; one refresh cycle under 1 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

# The launcher lives with the test fixtures so that the tests and the benchmarks share one implementation.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phoenix.embedded import embedded_valkey
from phoenix.producer import SyncProducer
from tests.fixtures.cluster_objects import (
    KEDA_CRDS,
    ensure_namespace,
    install_crds,
    operator_kubeconfig,
    project_crd_files,
)
from tests.fixtures.control_plane import ControlPlane, running_control_plane
from tests.fixtures.operator_process import health, kubectl_apply, running_operator

NAMESPACE = "bench"
ROUNDS = 3


def stages(count: int) -> list[dict[str, Any]]:
    # replicas.min 0: there is no kubelet here, and a stage scaled to zero is Ready without pods.
    return [
        {
            "apiVersion": "phoenix.io/v1alpha1",
            "kind": "PhoenixStage",
            "metadata": {"name": f"stage-{i:03d}", "namespace": NAMESPACE},
            "spec": {
                "processor": "router",
                "image": "ghcr.io/phoenix/phoenix:0.1.0",
                "redis": {"urlSecretRef": {"name": "phoenix-redis", "key": "url"}},
                "replicas": {"min": 0, "max": 5},
            },
        }
        for i in range(count)
    ]


def listed_status(plane: ControlPlane) -> list[dict[str, Any]]:
    listed = json.loads(plane.kubectl("get", "phoenixstages", "-n", NAMESPACE, "-o", "json").stdout)
    return [item.get("status") or {} for item in listed["items"]]


def ready_count(plane: ControlPlane) -> int:
    return sum(
        any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))
        for status in listed_status(plane)
    )


def cycles_after(liveness: str, since: float, timeout: float = 60) -> Iterator[dict[str, Any]]:
    """Every refresh cycle begun after `since` (epoch seconds), in order: the last one is polled well within a
    refresh interval, so none is missed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = (health(liveness).get("statusRefresh") or {}).get("last")
        if last is not None and last["started_at"] > since:
            since = last["started_at"]
            yield last
        time.sleep(0.1)
    raise TimeoutError("no status refresh cycle")


def all_changed(
    plane: ControlPlane, liveness: str, producers: list[SyncProducer], backlog: int
) -> tuple[dict[str, Any], float, int]:
    """A record written to every stage (each then holds `backlog` or more, no worker runs): the first refresh
    cycle after, and the seconds until every stage's status shows the new backlog. While a stage has a backlog its
    figures (the age of its oldest entry) move every cycle, so from the second round on every cycle sees all
    stages changed. The producers write stage by stage, so a cycle may read between their writes and see only
    some: then the round is written again. Returns the backlog each stage holds now too."""
    while True:
        for producer in producers:
            producer.send("r")
        backlog += 1
        written = time.time()
        first = next(cycles_after(liveness, written))
        if first["patched"] + first["deferred"] == len(producers):
            break
    while not all((status.get("queue") or {}).get("lag") == backlog for status in listed_status(plane)):
        if time.time() - written > 120:
            raise TimeoutError(f"the backlog of {backlog} not shown by every stage after 120 s")
        time.sleep(0.2)
    return first, time.time() - written, backlog


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stages", type=int, default=200)
    args = parser.parse_args()
    with running_control_plane() as plane, embedded_valkey() as redis_url:
        install_crds(plane, [*project_crd_files(), KEDA_CRDS])
        kubeconfig = operator_kubeconfig(plane, plane.workdir / "operator.kubeconfig")
        ensure_namespace(plane, NAMESPACE)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "phoenix-redis", "namespace": NAMESPACE},
            "stringData": {"url": redis_url},
        }
        kubectl_apply(plane, [secret])
        with running_operator(plane, kubeconfig, refresh_interval=2.0) as (_, liveness):
            started = time.monotonic()
            kubectl_apply(plane, stages(args.stages))
            while (ready := ready_count(plane)) < args.stages:
                if time.monotonic() - started > 300:
                    print(f"only {ready}/{args.stages} Ready after 300 s", file=sys.stderr)
                    return 1
                time.sleep(0.5)
            all_ready = time.monotonic() - started
            steady = next(c for c in cycles_after(liveness, 0) if c["stages"] == args.stages and c["patched"] == 0)
            with redis.Redis.from_url(redis_url) as connection:
                producers = [SyncProducer(connection, f"stage-{i:03d}", NAMESPACE) for i in range(args.stages)]
                # Every stage's backlog goes from 0 to 1: each stage began to queue, a change written at once.
                began, _, backlog = all_changed(plane, liveness, producers, 0)
                # Then every stage's backlog grows: figures only. Three times, the median reported.
                busy_rounds = []
                for _ in range(ROUNDS):
                    first, shown, backlog = all_changed(plane, liveness, producers, backlog)
                    busy_rounds.append((first, shown))
            busy, shown = sorted(busy_rounds, key=lambda r: r[0]["seconds"])[ROUNDS // 2]
    print(f"{args.stages} PhoenixStages, one Redis, one operator (2 cores)")
    print(f"all Ready after           {all_ready:6.1f} s   (target < 60 s)")
    rounds = ", ".join(
        f"{r['seconds']:.3f} s (reading {r['read_seconds']:.3f} s; {r['patched']} patched; every stage's status "
        f"showed it after {after:.1f} s)"
        for r, after in busy_rounds
    )
    print(f"all-figures-changed cycles: {rounds} (median below)")
    for label, report in (
        ("refresh, nothing changed", steady),
        ("refresh, all began to queue", began),
        ("refresh, all figures moved", busy),
    ):
        print(
            f"{label:<28} {report['seconds']:6.3f} s   Redis round trips {report['redis_round_trips']}, "
            f"status patches {report['patched']}, left for later {report['deferred']}   (target < 1 s)"
        )
    print(f"every stage's status showed the new backlog {shown:.1f} s after it was written (median round)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
