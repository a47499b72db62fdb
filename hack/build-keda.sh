#!/usr/bin/env bash
# Builds KEDA's operator (keda) and metrics adapter (keda-adapter) from its Go module with the machine's Go toolchain
# into $KEDA_BIN (default .cache/keda/bin), and copies the module's kustomize manifests (config/) next to them
# (.cache/keda/config); both are reused while the version matches. The operator takes ~13 min cold on 2 cores.
set -euo pipefail

KEDA_VERSION=${KEDA_VERSION:-2.21.0}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/gobuild.sh"
bin=${KEDA_BIN:-$cache/keda/bin}
config="$(dirname "$bin")/config"
want="keda=$KEDA_VERSION"
# The manifests are part of what is up to date: without them, all is built again.
[[ -d $config/minimal ]] || rm -f "$bin/.versions"
go_build_begin "KEDA binaries" "$bin" "$want" keda keda-adapter

module="github.com/kedacore/keda/v2"
module_src "$cache/keda/src" 1.24 "$module" "$KEDA_VERSION" "$module/cmd/operator" "$module/cmd/adapter"
ldflags="-s -w -X $module/version.Version=$KEDA_VERSION -X $module/version.GitCommit=v$KEDA_VERSION"
echo "building keda $KEDA_VERSION"
go build -trimpath -ldflags "$ldflags" -o "$bin/keda" "$module/cmd/operator"
echo "building keda-adapter $KEDA_VERSION"
go build -trimpath -ldflags "$ldflags" -o "$bin/keda-adapter" "$module/cmd/adapter"

rm -rf "$config"
cp -r "$moddir/config" "$config"
chmod -R u+w "$config"
go_build_done "KEDA binaries" "$bin" "$want"
