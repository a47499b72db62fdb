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
module="github.com/prometheus/prometheus"

# The module's VERSION file holds the release (3.x) that `promtool --version` reports.
ldflags() {
  echo "-s -w -X github.com/prometheus/common/version.Version=$(cat "$moddir/VERSION")" \
    "-X github.com/prometheus/common/version.Revision=v$PROMETHEUS_VERSION"
}

module_command promtool "${PROMTOOL_BIN:-$cache/promtool/bin}" "prometheus=$PROMETHEUS_VERSION" 1.25 "$module" \
  "$PROMETHEUS_VERSION" -tags netgo
