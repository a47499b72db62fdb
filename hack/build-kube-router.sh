#!/usr/bin/env bash
# Builds kube-router (cmd/kube-router of github.com/cloudnativelabs/kube-router/v2) from its Go module with the
# machine's Go toolchain into $KUBE_ROUTER_BIN (default .cache/kube-router/bin), reused while the versions match.
# The e2e node runs only its network policy controller (--run-firewall; no routing, no service proxy: the CNI
# bridge and kube-proxy do those), so that NetworkPolicies are enforced (tests/fixtures/node/components.py).
set -euo pipefail

# 2.10.0: the one release of 2.5-2.11 the module proxy serves here (the others answer 403 "not available").
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-2.10.0}
# kube-router pins netlink at a commit (v1.3.2-0.20260505210927-99e979749d3e) the proxy refuses (403); its last
# release builds it.
NETLINK_VERSION=${NETLINK_VERSION:-1.3.1}
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/hack/lib/gobuild.sh"
module="github.com/cloudnativelabs/kube-router/v2"
# shellcheck disable=SC2034  # read by module_src
replaces="replace github.com/vishvananda/netlink => github.com/vishvananda/netlink v$NETLINK_VERSION"

# What `kube-router --version` reports (kube-router's Makefile sets the same variable).
ldflags() {
  echo "-s -w -X $module/pkg/version.Version=v$KUBE_ROUTER_VERSION"
}

module_command kube-router "${KUBE_ROUTER_BIN:-$cache/kube-router/bin}" \
  "kube-router=$KUBE_ROUTER_VERSION netlink=$NETLINK_VERSION" 1.26 "$module" "$KUBE_ROUTER_VERSION"
