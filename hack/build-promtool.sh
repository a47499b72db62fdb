#!/usr/bin/env bash
# Builds Prometheus's promtool (cmd/promtool of github.com/prometheus/prometheus) from its Go module with the machine's
# Go toolchain into $PROMTOOL_BIN (default .cache/promtool/bin), reused while the version matches. The test suite
# runs `promtool check rules` and `promtool test rules` with it (tests/test_alert_rules.py).
# Measured on 2 cores shared with other builds (load average 10-14, nice -n 10): cold (empty GOCACHE, modules not yet
# downloaded) 28 min wall / 15 min CPU; warm (build cache full) 58 s, mostly go mod tidy and the link; stamped: 0.1 s.
set -euo pipefail

PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-0.316.0}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/gobuild.sh"
cache=${PHOENIX_CACHE:-$root/.cache}
bin=${PROMTOOL_BIN:-$cache/promtool/bin}
stamp="$bin/.versions"
want="prometheus=$PROMETHEUS_VERSION"

if up_to_date "$stamp" "$want" "$bin" promtool; then
  echo "promtool up to date in $bin ($want)"
  exit 0
fi
go_setup hack/build-promtool.sh
mkdir -p "$bin"
rm -f "$stamp"

src="$cache/promtool/src"
mkdir -p "$src"
module="github.com/prometheus/prometheus"
moddir=$(module_dir "$module@v$PROMETHEUS_VERSION")
{
  printf 'module phoenix.local/promtoolbuild\n\ngo 1.25\n\n'
  # Prometheus's replace and exclude directives (single lines and blocks) must hold in any module that builds it.
  awk '/^(replace|exclude) \($/ {block=1} block || /^(replace|exclude) / {print} /^\)$/ {block=0}' "$moddir/go.mod"
} > "$src/go.mod"
tools_go "$src" "$module/cmd/promtool"
cd "$src"
go get "$module@v$PROMETHEUS_VERSION"
go mod tidy
# The module's VERSION file holds the release (3.x) that `promtool --version` reports.
release=$(cat "$moddir/VERSION")
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"
ldflags+=" -X github.com/prometheus/common/version.Revision=v$PROMETHEUS_VERSION"
echo "building promtool $release ($module v$PROMETHEUS_VERSION)"
go build -trimpath -tags netgo -ldflags "$ldflags" -o "$bin/promtool" "$module/cmd/promtool"
echo "$want" > "$stamp"
echo "promtool built in $bin ($want)"
