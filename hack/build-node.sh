#!/usr/bin/env bash
# Builds what a node adds to the control plane of hack/build-kube.sh, from their Go modules with the machine's Go
# toolchain, into $NODE_BIN (default .cache/node/bin), and reuses them while the versions match:
#   kubelet, kube-scheduler, kube-proxy (k8s.io/kubernetes), containerd + containerd-shim-runc-v2 + ctr
#   (github.com/containerd/containerd/v2) and coredns (github.com/coredns/coredns, with only the plugins the
#   cluster's Corefile uses).
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.35.4}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-2.2.9}
COREDNS_VERSION=${COREDNS_VERSION:-1.14.7}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/gobuild.sh"
bin=${NODE_BIN:-$cache/node/bin}
want="kubernetes=$KUBE_VERSION containerd=$CONTAINERD_VERSION coredns=$COREDNS_VERSION"
binaries=(kubelet kube-scheduler kube-proxy containerd containerd-shim-runc-v2 ctr coredns)
go_build_begin "node binaries" "$bin" "$want" "${binaries[@]}"

# Kubernetes node components.
src="$cache/node/src-k8s"
mkdir -p "$src"
k8s_wrapper_gomod phoenix.local/nodebuild "$KUBE_VERSION" > "$src/go.mod"
tools_go "$src" k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy
(
  cd "$src"
  go mod tidy
  for b in kubelet kube-scheduler kube-proxy; do
    echo "building $b $KUBE_VERSION"
    go build -trimpath -ldflags "$(k8s_ldflags "$KUBE_VERSION")" -o "$bin/$b" "k8s.io/kubernetes/cmd/$b"
  done
)

# containerd 2.x: the CRI plugin needs none of the snapshotters that want cgo or kernel modules here.
src="$cache/node/src-containerd"
mkdir -p "$src"
printf 'module phoenix.local/containerdbuild\n\ngo 1.24\n' > "$src/go.mod"
tools_go "$src" github.com/containerd/containerd/v2/cmd/containerd
(
  cd "$src"
  go get "github.com/containerd/containerd/v2@v$CONTAINERD_VERSION"
  go mod tidy
  tags="no_btrfs no_devmapper no_zfs no_aufs"
  ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION"
  for b in containerd containerd-shim-runc-v2 ctr; do
    echo "building $b $CONTAINERD_VERSION"
    go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$bin/$b" "github.com/containerd/containerd/v2/cmd/$b"
  done
)

# CoreDNS: its own main with the plugins of the cluster's Corefile (tests/fixtures/node/cluster_dns.py), in CoreDNS's order.
src="$cache/node/src-coredns"
mkdir -p "$src"
printf 'module phoenix.local/corednsbuild\n\ngo 1.24\n' > "$src/go.mod"
plugins=(reload bind ready health errors log loadbalance cache kubernetes loop forward)
{
  printf 'package main\n\nimport (\n'
  printf '\t"github.com/coredns/coredns/core/dnsserver"\n\t"github.com/coredns/coredns/coremain"\n'
  for p in "${plugins[@]}"; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
  printf ')\n\nfunc init() {\n\tdnsserver.Directives = []string{'
  for p in "${plugins[@]}"; do printf '"%s", ' "$p"; done
  printf '}\n}\n\nfunc main() { coremain.Run() }\n'
} > "$src/main.go"
(
  cd "$src"
  gofmt -w main.go
  go get "github.com/coredns/coredns@v$COREDNS_VERSION"
  go mod tidy
  echo "building coredns $COREDNS_VERSION"
  go build -trimpath -ldflags "-s -w" -o "$bin/coredns" .
)

go_build_done "node binaries" "$bin" "$want"
