# shellcheck shell=bash
# Sourced by hack/build-*.sh: build Go commands from their published modules with the machine's toolchain into a
# cache directory, and reuse them while the versions stamped there still match.

# up_to_date STAMP WANT BIN NAME...: the stamp says WANT and every NAME is an executable in BIN.
up_to_date() {
  local stamp=$1 want=$2 bin=$3
  shift 3
  [[ -f $stamp && $(cat "$stamp") == "$want" ]] || return 1
  local b
  for b in "$@"; do [[ -x $bin/$b ]] || return 1; done
}

# go_setup SCRIPT: the machine's toolchain, never a downloaded one, static binaries. The module and build caches
# stay at Go's defaults so that every checkout on this machine shares them.
go_setup() {
  command -v go >/dev/null || { echo "$1: the Go toolchain is needed (go not on PATH)" >&2; exit 1; }
  export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=local
}

# tools_go DIR IMPORT...: a tools.go in DIR that imports each package, so `go mod tidy` keeps their modules.
tools_go() {
  local dir=$1
  shift
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    local p
    for p in "$@"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } > "$dir/tools.go"
}

# k8s_wrapper_gomod MODULE VERSION: a go.mod requiring k8s.io/kubernetes@vVERSION. k8s.io/kubernetes is not meant to
# be a dependency: its go.mod points its staging modules at ./staging, so each of them is mapped to the published
# k8s.io/<name> v0.<minor>.<patch> instead.
k8s_wrapper_gomod() {
  local module=$1 version=$2 modfile staging m
  modfile=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
  staging=$(awk '/^\t?k8s\.io\/[a-z0-9-]+ v0\.0\.0$/ {print $1}' "$modfile" | sort -u)
  echo "module $module"
  echo
  echo "go 1.24"
  echo
  echo "require k8s.io/kubernetes v$version"
  echo
  for m in $staging; do echo "replace $m => $m v0.${version#1.}"; done
}

# k8s_ldflags VERSION: what `kubectl version` and the components report.
k8s_ldflags() {
  echo "-s -w -X k8s.io/component-base/version.gitVersion=v$1 -X k8s.io/client-go/pkg/version.gitVersion=v$1"
}

# module_dir MODULE@VERSION: the module's extracted source in the module cache (downloaded if needed).
module_dir() {
  go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)",/\1/p'
}
