"""The e2e suite's single-node cluster (tests/fixtures/node): `make e2e` runs `run`.

  python hack/e2e_cluster.py run -- CMD...   bring the cluster up, run CMD with KUBECONFIG (and PHOENIX_E2E_IMAGE,
                                             PHOENIX_E2E_VALKEY_IMAGE, PHOENIX_E2E_REDIS_TLS_IMAGE) set, tear
                                             everything down, exit with CMD's code
  python hack/e2e_cluster.py up              bring it up and keep it until Ctrl-C
  python hack/e2e_cluster.py clean           remove what a killed run left (processes, mounts, rules, addresses)

Needs root on Linux, the binaries of hack/build-kube.sh, hack/build-node.sh, hack/build-kube-router.sh and
hack/build-keda.sh and the images of hack/build-images.sh. After teardown it lists anything of the node still on
the host and fails if there is any.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.node.cluster import NodeCluster, host_state, running_node_cluster
from tests.fixtures.node.host import requirements_problem
from tests.fixtures.node.network import NodeNetwork


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _environment(cluster: NodeCluster) -> dict[str, str]:
    return {
        "KUBECONFIG": str(cluster.kubeconfig),
        "PHOENIX_E2E_IMAGE": cluster.images["phoenix"],
        "PHOENIX_E2E_VALKEY_IMAGE": cluster.images["valkey"],
        "PHOENIX_E2E_REDIS_TLS_IMAGE": cluster.images["redis"],
    }


def _check_clean(network: NodeNetwork) -> int:
    leftovers = host_state(network).leftovers()
    for item in leftovers:
        print(f"left behind: {item}", file=sys.stderr)
    if not leftovers:
        print("teardown complete: nothing of the node left (processes, mounts, rules, ipsets, addresses)", flush=True)
    return 1 if leftovers else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("run", "up", "clean"))
    parser.add_argument("--no-keda", action="store_true", help="do not install KEDA")
    parser.add_argument("--logs", type=Path, help="keep the components' logs in this directory")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1 :]
    if args.action == "run" and not args.command:
        parser.error("run needs a command after --")
    if problem := requirements_problem():
        print(f"hack/e2e_cluster.py: {problem}", file=sys.stderr)
        return 2
    network = NodeNetwork()
    if args.action == "clean":
        state = host_state(network)
        state.forget_node_rules()
        state.restore()
        return _check_clean(network)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    code = 1
    started = time.monotonic()
    try:
        with running_node_cluster(with_keda=not args.no_keda, logs_dir=args.logs) as cluster:
            env = _environment(cluster)
            print(f"cluster up in {time.monotonic() - started:.0f} s", flush=True)
            for key, value in env.items():
                print(f"export {key}={value}", flush=True)
            if args.action == "up":
                print("Ctrl-C stops and removes everything.", flush=True)
                try:
                    while True:
                        cluster.check_running()
                        time.sleep(1)
                except KeyboardInterrupt:
                    code = 0
            else:
                code = subprocess.run(args.command, env={**os.environ, **env}, check=False).returncode
    except KeyboardInterrupt:
        code = 130
    finally:
        clean = _check_clean(network)
    return code or clean


if __name__ == "__main__":
    sys.exit(main())
