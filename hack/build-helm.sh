#!/usr/bin/env bash
# Builds Helm's command line (cmd/helm) from its Go module with the machine's Go toolchain into $HELM_BIN (default
# .cache/helm/bin), and reuses it while the version matches. Build time on the 2 shared cores
# (load average 13-19 from other builds): 16 min cold (empty build cache, module downloads included; 6 min CPU),
# 21 s warm (build cache full, go mod tidy included), instant when the stamp matches.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-3.22.0}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/gobuild.sh"
cache=${PHOENIX_CACHE:-$root/.cache}
bin=${HELM_BIN:-$cache/helm/bin}
stamp="$bin/.versions"
want="helm=$HELM_VERSION"

if up_to_date "$stamp" "$want" "$bin" helm; then
  echo "helm up to date in $bin ($want)"
  exit 0
fi
go_setup hack/build-helm.sh
mkdir -p "$bin"
rm -f "$stamp"

src="$cache/helm/src"
mkdir -p "$src"
module="helm.sh/helm/v3"
moddir=$(module_dir "$module@v$HELM_VERSION")
{
  printf 'module phoenix.local/helmbuild\n\ngo 1.24\n\n'
  # Helm's own single-line replace and exclude directives must hold in any module that builds it.
  grep -E '^(replace|exclude) ' "$moddir/go.mod" || true
} > "$src/go.mod"
tools_go "$src" "$module/cmd/helm"
cd "$src"
go get "$module@v$HELM_VERSION"
go mod tidy
# What `helm version` reports (Helm's Makefile sets the same variables).
ldflags="-s -w -X $module/internal/version.version=v$HELM_VERSION -X $module/internal/version.gitTreeState=clean"
echo "building helm $HELM_VERSION"
go build -trimpath -ldflags "$ldflags" -o "$bin/helm" "$module/cmd/helm"
echo "$want" > "$stamp"
echo "helm built in $bin ($want)"
