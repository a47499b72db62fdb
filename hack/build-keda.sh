#!/usr/bin/env bash
# Builds KEDA's operator (keda) and metrics adapter (keda-adapter) from its Go module with the machine's Go toolchain
# into $KEDA_BIN (default .cache/keda/bin), and copies the module's kustomize manifests (config/) next to them
# (.cache/keda/config); both are reused while the version matches. The operator takes ~13 min cold on 2 cores.
set -euo pipefail

KEDA_VERSION=${KEDA_VERSION:-2.21.0}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/gobuild.sh"
cache=${PHOENIX_CACHE:-$root/.cache}
bin=${KEDA_BIN:-$cache/keda/bin}
config="$(dirname "$bin")/config"
stamp="$bin/.versions"
want="keda=$KEDA_VERSION"

if up_to_date "$stamp" "$want" "$bin" keda keda-adapter && [[ -d $config/minimal ]]; then
  echo "KEDA binaries up to date in $bin ($want)"
  exit 0
fi
go_setup hack/build-keda.sh
mkdir -p "$bin"
rm -f "$stamp"

src="$cache/keda/src"
mkdir -p "$src"
module="github.com/kedacore/keda/v2"
moddir=$(module_dir "$module@v$KEDA_VERSION")
{
  printf 'module phoenix.local/kedabuild\n\ngo 1.24\n\n'
  # KEDA's own single-line replace and exclude directives must hold in any module that builds it.
  grep -E '^(replace|exclude) ' "$moddir/go.mod"
} > "$src/go.mod"
tools_go "$src" "$module/cmd/operator" "$module/cmd/adapter"
cd "$src"
go get "$module@v$KEDA_VERSION"
go mod tidy
ldflags="-s -w -X $module/version.Version=$KEDA_VERSION -X $module/version.GitCommit=v$KEDA_VERSION"
echo "building keda $KEDA_VERSION"
go build -trimpath -ldflags "$ldflags" -o "$bin/keda" "$module/cmd/operator"
echo "building keda-adapter $KEDA_VERSION"
go build -trimpath -ldflags "$ldflags" -o "$bin/keda-adapter" "$module/cmd/adapter"

rm -rf "$config"
cp -r "$moddir/config" "$config"
chmod -R u+w "$config"
echo "$want" > "$stamp"
echo "KEDA binaries built in $bin ($want)"
