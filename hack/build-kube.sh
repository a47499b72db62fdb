#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from their Go modules with the machine's
# Go toolchain into $KUBE_BIN (default .cache/kube/bin), and reuses them when the versions already match.
# k8s.io/kubernetes is not meant to be a dependency: its go.mod points its staging modules at ./staging, so a
# tiny wrapper module maps each of them to the published k8s.io/<name> v0.<minor>.<patch> instead.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.35.4}
ETCD_VERSION=${ETCD_VERSION:-3.6.5}
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${PHOENIX_CACHE:-$root/.cache}
bin=${KUBE_BIN:-$cache/kube/bin}
stamp="$bin/.versions"
want="kubernetes=$KUBE_VERSION etcd=$ETCD_VERSION"

up_to_date() {
  [[ -f $stamp && $(cat "$stamp") == "$want" ]] || return 1
  for b in etcd kube-apiserver kube-controller-manager kubectl; do [[ -x $bin/$b ]] || return 1; done
}
if up_to_date; then
  echo "kube binaries up to date in $bin ($want)"
  exit 0
fi

command -v go >/dev/null || { echo "hack/build-kube.sh: the Go toolchain is needed (go not on PATH)" >&2; exit 1; }
mkdir -p "$bin"
# The machine's toolchain, never a downloaded one; the module and build caches stay at Go's defaults so that
# every checkout on this machine shares them.
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local

# etcd: its server module has the etcd main package.
src="$cache/kube/src-etcd"
mkdir -p "$src"
cat > "$src/go.mod" <<MOD
module phoenix.local/etcdbuild

go 1.24
MOD
cat > "$src/tools.go" <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
(cd "$src" && go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" && go build -trimpath -o "$bin/etcd" go.etcd.io/etcd/server/v3)

# Kubernetes components.
src="$cache/kube/src-k8s"
mkdir -p "$src"
modfile=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
staging=$(awk '/^\t?k8s\.io\/[a-z0-9-]+ v0\.0\.0$/ {print $1}' "$modfile" | sort -u)
{
  echo "module phoenix.local/kubebuild"
  echo
  echo "go 1.24"
  echo
  echo "require k8s.io/kubernetes v$KUBE_VERSION"
  echo
  for m in $staging; do echo "replace $m => $m v0.${KUBE_VERSION#1.}"; done
} > "$src/go.mod"
cat > "$src/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
cd "$src"
go mod tidy
for b in kube-apiserver kube-controller-manager kubectl; do
  echo "building $b $KUBE_VERSION"
  go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=v$KUBE_VERSION -X k8s.io/client-go/pkg/version.gitVersion=v$KUBE_VERSION" -o "$bin/$b" "k8s.io/kubernetes/cmd/$b"
done
echo "$want" > "$stamp"
echo "kube binaries built in $bin ($want)"
