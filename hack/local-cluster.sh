#!/usr/bin/env bash
# Starts the same local control plane the tests use (etcd, kube-apiserver, kube-controller-manager; no
# kubelet) with the project's and KEDA's CRDs, prints the KUBECONFIG to use, and runs until Ctrl-C.
# Options: --no-keda (leave KEDA's CRDs out). Builds the binaries first if needed (hack/build-kube.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/hack/build-kube.sh" >&2
cd "$root"
exec "$root/.venv/bin/python" "$root/hack/local_cluster.py" "$@"
