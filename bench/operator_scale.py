"""`make bench-operator`: 200 PhoenixStages on the tests' local control plane, one operator, one Valkey.

Prints the time from `kubectl apply` until every stage is Ready, and the cost of one status refresh cycle over
all of them (Redis round trips, status patches, seconds) as the operator reports it on its liveness endpoint:
when every stage began to queue (a change of state, written at once), then when every stage's figures moved
(written a share a cycle, refresh.due_writes), with the cycles it took until every stage's figures were written.
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


def ready_count(plane: ControlPlane) -> int:
    listed = json.loads(plane.kubectl("get", "phoenixstages", "-n", NAMESPACE, "-o", "json").stdout)
    return sum(
        any(c["type"] == "Ready" and c["status"] == "True" for c in (item.get("status") or {}).get("conditions", []))
        for item in listed["items"]
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


def quiet_after(liveness: str, since: float) -> float:
    """When the first cycle after `since` that wrote nothing and left nothing for later began."""
    return next(c for c in cycles_after(liveness, since) if c["patched"] == 0 and c["deferred"] == 0)["started_at"]


def all_changed(liveness: str, producers: list[SyncProducer], since: float) -> tuple[dict[str, Any], int, float]:
    """The first refresh cycle after a record is written to every stage, the cycles until every stage's status
    was written, and when the last of them began. The producers write stage by stage, so a cycle may read between
    their writes and see only some: then the round is written again."""
    while True:
        since = quiet_after(liveness, since)
        for producer in producers:
            producer.send("r")
        written = time.time()
        cycles = cycles_after(liveness, written)
        first = next(cycles)
        if first["patched"] + first["deferred"] != len(producers):
            since = first["started_at"]
            continue
        last, count = first, 1
        while last["deferred"]:
            last, count = next(cycles), count + 1
        return first, count, last["started_at"]


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
                began, _, since = all_changed(liveness, producers, steady["started_at"])
                # Then every stage's backlog grows: figures only. Three times, the median reported.
                busy_rounds = []
                for _ in range(ROUNDS):
                    first, cycles, since = all_changed(liveness, producers, since)
                    busy_rounds.append((first, cycles))
            busy, cycles = sorted(busy_rounds, key=lambda r: r[0]["seconds"])[ROUNDS // 2]
    print(f"{args.stages} PhoenixStages, one Redis, one operator (2 cores)")
    print(f"all Ready after           {all_ready:6.1f} s   (target < 60 s)")
    rounds = ", ".join(
        f"{r['seconds']:.3f} s (reading {r['read_seconds']:.3f} s; {r['patched']} patched, all after {n} cycles)"
        for r, n in busy_rounds
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
    print(f"every stage's figures written within {cycles} cycles of the change")
    return 0


if __name__ == "__main__":
    sys.exit(main())
