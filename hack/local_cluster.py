"""Run the tests' local control plane by hand; started by hack/local-cluster.sh (see there)."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from types import FrameType

# The launcher lives with the test fixtures so that the tests and this script share one implementation.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.cluster_objects import (
    KEDA_CRDS,
    MANIFESTS,
    install_crds,
    operator_kubeconfig,
    project_crd_files,
)
from tests.fixtures.control_plane import running_control_plane


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-keda", action="store_true", help="do not install KEDA's ScaledObject CRDs")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _exit_on_signal)
    with running_control_plane() as plane:
        install_crds(plane, [*project_crd_files(), *([] if args.no_keda else [KEDA_CRDS])])
        print(f"API server: {plane.server}")
        print(f"export KUBECONFIG={plane.kubeconfig}   # cluster admin")
        if list((MANIFESTS / "rbac").glob("*.yaml")):
            operator = operator_kubeconfig(plane, plane.workdir / "operator.kubeconfig")
            print(f"export KUBECONFIG={operator}   # the operator's ServiceAccount (manifests/rbac applied)")
        print(f"kubectl: {plane.bin_dir / 'kubectl'}; logs: {plane.workdir / 'logs'}")
        print("No kubelet: pods are created but never run. Ctrl-C stops and deletes everything.", flush=True)
        try:
            # Stops with the log tail of whichever component dies.
            while True:
                plane.check_running()
                time.sleep(1)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
