"""`make bench-operator`: 200 PhoenixStages on the tests' local control plane, one operator, one Valkey.

Prints the time from `kubectl apply` until every stage is Ready, and the cost of one status refresh cycle over
all of them (Redis round trips, status patches, seconds) as the operator reports it on its liveness endpoint.
Targets: all Ready within 60 s; one refresh cycle under 1 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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


def ready_count(plane: ControlPlane) -> int:
    listed = json.loads(plane.kubectl("get", "phoenixstages", "-n", NAMESPACE, "-o", "json").stdout)
    return sum(
        any(c["type"] == "Ready" and c["status"] == "True" for c in (item.get("status") or {}).get("conditions", []))
        for item in listed["items"]
    )


def wait_for_cycle(liveness: str, predicate: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reports = health(liveness).get("statusRefresh") or {}
        for report in reports.values():
            if predicate(report):
                return report
        time.sleep(1)
    raise TimeoutError("no matching status refresh cycle")


def all_changed_cycle(liveness: str, producers: list[SyncProducer]) -> dict[str, Any]:
    """The refresh cycle after a record is written to every stage: it patches each stage's status. The producers
    write stage by stage, so a cycle may read between their writes and patch only some: then the round is written
    again."""
    while True:
        seen = health(liveness).get("statusRefresh", {}).get("lastWithChanges")
        for producer in producers:
            producer.send("r")
        cycle = wait_for_cycle(liveness, lambda r, seen=seen: r["patched"] > 0 and r != seen)
        if cycle["patched"] == len(producers):
            return cycle


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
            steady = wait_for_cycle(liveness, lambda r: r["stages"] == args.stages and r["patched"] == 0)
            # Every stage's backlog changes: the next cycle patches all of them. Three times, the median reported.
            with redis.Redis.from_url(redis_url) as connection:
                producers = [SyncProducer(connection, f"stage-{i:03d}", NAMESPACE) for i in range(args.stages)]
                busy_cycles = [all_changed_cycle(liveness, producers) for _ in range(ROUNDS)]
            busy = sorted(busy_cycles, key=lambda r: r["seconds"])[ROUNDS // 2]
    print(f"{args.stages} PhoenixStages, one Redis, one operator (2 cores)")
    print(f"all Ready after           {all_ready:6.1f} s   (target < 60 s)")
    rounds = ", ".join(f"{r['seconds']:.3f} s (reading {r['read_seconds']:.3f} s)" for r in busy_cycles)
    print(f"all-changed cycles: {rounds} (median below)")
    for label, report in (("refresh, nothing changed", steady), ("refresh, all changed", busy)):
        print(
            f"{label:<25} {report['seconds']:6.3f} s   Redis round trips {report['redis_round_trips']}, "
            f"status patches {report['patched']}   (target < 1 s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
