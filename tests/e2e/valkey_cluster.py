"""An in-cluster Valkey Cluster for the e2e suite: three primaries (StatefulSet `valkey`, the e2e's Valkey image,
cluster mode, a password, no replicas), formed by the test itself with CLUSTER ADDSLOTSRANGE and CLUSTER MEET, as
an operator of a managed cluster would have done before any stage uses it.

The nodes announce their pod IPs (the default), which the workers, the operator and KEDA reach in the cluster; the
test reaches each node through a port-forward to its pod, and so sends each key to the node that holds its slot
itself (`node_of`): the slot ranges are the ones it assigned.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import redis as redis_client
from redis.crc import key_slot

from tests.e2e.kubectl import kubectl_json, port_forward
from tests.e2e.redis_set import headless_service, server_statefulset, stage_secret, until_answering, wait_statefulsets

NAMESPACE = "phoenix-cluster"
PASSWORD = "e2e-cluster-password"
PRIMARIES = 3
SLOTS = 16384
DOMAIN = f"{NAMESPACE}.svc.cluster.local"
# Seed nodes for the URL: any one answers with the whole cluster's map.
SEEDS = [f"valkey-{i}.valkey.{DOMAIN}:6379" for i in range(PRIMARIES)]


def slot_range(node: int) -> tuple[int, int]:
    """The slots the test gives primary `node`: an even split, first to last."""
    return SLOTS * node // PRIMARIES, SLOTS * (node + 1) // PRIMARIES - 1


def node_of(key: str) -> int:
    """The primary that holds `key`'s slot."""
    slot = key_slot(key.encode())
    return next(node for node in range(PRIMARIES) if slot_range(node)[0] <= slot <= slot_range(node)[1])


def cluster_set(image: str) -> list[dict[str, Any]]:
    """The stage's Secret (seed URL and password), the headless Service and the StatefulSet."""
    # The image's entrypoint is valkey-server; $(VAR) is the kubelet's expansion of the container's env.
    args = "--port 6379 --cluster-enabled yes --cluster-config-file /data/nodes.conf --cluster-node-timeout 5000"
    args += " --requirepass $(REDIS_PASSWORD) --masterauth $(REDIS_PASSWORD)"
    # No RDB snapshots: --save with an empty argument, which a split string cannot hold.
    start = {"args": [*args.split(), "--save", "", "--appendonly", "no", "--dir", "/data"]}
    return [
        stage_secret(f"redis://:{PASSWORD}@{','.join(SEEDS)}/0", PASSWORD),
        headless_service("valkey", 6379),
        server_statefulset("valkey", "phoenix-e2e-cluster", PRIMARIES, image, start, {"redis": 6379, "bus": 16379}),
    ]


@contextlib.contextmanager
def node_clients() -> Iterator[list[redis_client.Redis]]:
    """A client of each primary, in pod order, through a port-forward to its pod."""
    with contextlib.ExitStack() as stack:
        clients = []
        for node in range(PRIMARIES):
            port = stack.enter_context(port_forward(NAMESPACE, f"pod/valkey-{node}", 6379))
            client = redis_client.Redis(port=port, password=PASSWORD, decode_responses=True, socket_timeout=10)
            stack.callback(client.close)
            clients.append(client)
        until_answering(clients)
        yield clients


def form_cluster(timeout: float = 120) -> None:
    """Give each primary its slots and introduce the others to the first (by pod IP), then wait until every node
    sees all of them and every slot covered."""
    pods = [kubectl_json("get", "pod", "-n", NAMESPACE, f"valkey-{node}") for node in range(PRIMARIES)]
    addresses = [pod["status"]["podIP"] for pod in pods]
    with node_clients() as clients:
        for node, client in enumerate(clients):
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", *slot_range(node))
        for address in addresses[1:]:
            clients[0].execute_command("CLUSTER", "MEET", address, 6379)
        deadline = time.monotonic() + timeout
        while not all(_formed(client) for client in clients):
            if time.monotonic() > deadline:
                raise AssertionError(f"the cluster did not form within {timeout:.0f} s: {_states(clients)}")
            time.sleep(1)


def _formed(client: redis_client.Redis) -> bool:
    info = client.execute_command("CLUSTER", "INFO")
    return "cluster_state:ok" in info and f"cluster_known_nodes:{PRIMARIES}" in info


def _states(clients: list[redis_client.Redis]) -> list[str]:
    infos = [client.execute_command("CLUSTER", "INFO").split() for client in clients]
    return [" ".join(line for line in info if "state" in line or "known" in line) for info in infos]


def wait_set_ready() -> None:
    wait_statefulsets(NAMESPACE, ("valkey",))
