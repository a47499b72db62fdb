#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from their Go modules with the machine's
# Go toolchain into $KUBE_BIN (default .cache/kube/bin), and reuses them when the versions already match.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.35.4}
ETCD_VERSION=${ETCD_VERSION:-3.6.5}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/gobuild.sh"
bin=${KUBE_BIN:-$cache/kube/bin}
want="kubernetes=$KUBE_VERSION etcd=$ETCD_VERSION"
go_build_begin "kube binaries" "$bin" "$want" etcd kube-apiserver kube-controller-manager kubectl

# etcd: its server module has the etcd main package.
src="$cache/kube/src-etcd"
mkdir -p "$src"
printf 'module phoenix.local/etcdbuild\n\ngo 1.24\n' > "$src/go.mod"
tools_go "$src" go.etcd.io/etcd/server/v3
(cd "$src" && go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" && go build -trimpath -o "$bin/etcd" go.etcd.io/etcd/server/v3)

# Kubernetes components.
src="$cache/kube/src-k8s"
mkdir -p "$src"
k8s_wrapper_gomod phoenix.local/kubebuild "$KUBE_VERSION" > "$src/go.mod"
tools_go "$src" k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
cd "$src"
go mod tidy
for b in kube-apiserver kube-controller-manager kubectl; do
  echo "building $b $KUBE_VERSION"
  go build -trimpath -ldflags "$(k8s_ldflags "$KUBE_VERSION")" -o "$bin/$b" "k8s.io/kubernetes/cmd/$b"
done
go_build_done "kube binaries" "$bin" "$want"
