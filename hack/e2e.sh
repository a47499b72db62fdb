#!/usr/bin/env bash
# `make e2e`: the e2e suite (tests/e2e) on a real single-node Kubernetes on this machine. Installs the Debian
# packages it needs when missing, builds or reuses (cached in .cache/ by version or input hash) the control plane,
# the node's binaries, kube-router, KEDA and helm (side by side: make e2e-tools) and the images, starts the node,
# runs the suite, and tears everything down, also after a failure or Ctrl-C. Needs Linux and root. Extra arguments
# go to pytest (e.g. -k scaling).
# Every run keeps its evidence in .cache/e2e/runs/<UTC time>/: the suite's output, pytest's junit XML, the
# components' logs, and for each failed test the cluster's state at the failure (tests/e2e/evidence.py); on failure
# the end of the suite's output says which test failed, why, and where its evidence is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if [[ $(uname -s) != Linux ]]; then
  echo "make e2e needs Linux (containers, network namespaces, iptables). Elsewhere run the suite against a cluster:" >&2
  echo "  KUBECONFIG=... .venv/bin/python -m pytest -m e2e tests/e2e   (docs/e2e.md)" >&2
  exit 2
fi
if [[ $(id -u) != 0 ]]; then
  echo "make e2e needs root: it mounts, creates network namespaces, iptables rules and cgroups (sudo make e2e)." >&2
  echo "Against an existing cluster no root is needed: KUBECONFIG=... .venv/bin/python -m pytest -m e2e tests/e2e" >&2
  exit 2
fi

packages=(runc containernetworking-plugins buildah debootstrap iptables ipset conntrack)
missing=()
for p in "${packages[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# In cgroup hybrid mode (v1 hierarchies beside a cgroup2 at /sys/fs/cgroup/unified) crun, which runs buildah's RUN
# steps, refuses to start while cgroup2 offers any controller ("cgroups in hybrid mode not supported, drop all
# controllers from cgroupv2"). Machines of this kind come up with `hugetlb` left on cgroup2: each controller left
# there gets a v1 hierarchy of its own, which takes it off cgroup2 (nothing uses it there).
unified=/sys/fs/cgroup/unified
if [[ -f $unified/cgroup.controllers ]]; then
  read -r -a controllers < "$unified/cgroup.controllers" || true
  for controller in "${controllers[@]}"; do
    mkdir -p "/sys/fs/cgroup/$controller"
    mount -t cgroup -o "$controller" cgroup "/sys/fs/cgroup/$controller"
    echo "cgroup controller $controller moved from cgroup2 to a v1 hierarchy (hybrid mode, for crun)"
  done
fi

make --no-print-directory e2e-tools
bash hack/build-images.sh
run=.cache/e2e/runs/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$run"
export PHOENIX_E2E_REPORT_DIR=$root/$run
echo "this run's evidence: $run"
# exec keeps e2e_cluster.py the process that SIGTERM reaches (it tears the cluster down); tee -i outlives Ctrl-C.
exec > >(tee -i "$run/output.log") 2>&1
exec .venv/bin/python hack/e2e_cluster.py run --logs "$run/logs" -- \
  .venv/bin/python -m pytest -m e2e tests/e2e -v -p no:cacheprovider --junitxml "$run/junit.xml" "$@"
