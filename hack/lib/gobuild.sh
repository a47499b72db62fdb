# shellcheck shell=bash
# Sourced by hack/build-*.sh: build Go commands from their published modules with the machine's toolchain into a
# cache directory, and reuse them while the versions stamped there still match. A script is its versions, then
#   go_build_begin WHAT BIN WANT BINARY...   (exits when up to date)
#   the builds (module_src for a command of one published module)
#   go_build_done WHAT BIN WANT
# or, for the one command of one published module, its `ldflags` function and module_command (which does all three).

# Where the builds keep their sources and binaries (the scripts' default BINs): PHOENIX_CACHE, else the checkout's
# .cache.
# shellcheck disable=SC2034  # read by the scripts that source this file
cache=${PHOENIX_CACHE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.cache}

# up_to_date STAMP WANT BIN NAME...: the stamp says WANT and every NAME is an executable in BIN.
up_to_date() {
  local stamp=$1 want=$2 bin=$3
  shift 3
  [[ -f $stamp && $(cat "$stamp") == "$want" ]] || return 1
  local b
  for b in "$@"; do [[ -x $bin/$b ]] || return 1; done
}

# go_build_begin WHAT BIN WANT BINARY...: exits saying WHAT is up to date when BIN's stamp says WANT and every
# BINARY is there; otherwise the toolchain set up, BIN made and its stamp removed, so that a build stopped half-way
# is never taken for a finished one.
go_build_begin() {
  local what=$1 bin=$2 want=$3
  shift 3
  if up_to_date "$bin/.versions" "$want" "$bin" "$@"; then
    echo "$what up to date in $bin ($want)"
    exit 0
  fi
  go_setup "hack/$(basename "$0")"
  mkdir -p "$bin"
  rm -f "$bin/.versions"
}

# go_build_done WHAT BIN WANT: BIN stamped with WANT, once everything is built.
go_build_done() {
  echo "$3" > "$2/.versions"
  echo "$1 built in $2 ($3)"
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
  local json
  # go prints a failure (an unknown version, no network) as JSON on stdout: say it, or the build stops silently.
  json=$(go mod download -json "$1") || {
    echo "go mod download $1 failed: $(sed -n 's/.*"Error": "\(.*\)".*/\1/p' <<<"$json")" >&2
    return 1
  }
  sed -n 's/.*"Dir": "\(.*\)",/\1/p' <<<"$json"
}

# module_src SRC GO MODULE VERSION PACKAGE...: SRC made the module that builds PACKAGEs of MODULE@vVERSION (go GO),
# and the working directory: it requires MODULE with MODULE's own replace and exclude directives (single lines and
# blocks), which must hold in any module that builds it, then the script's own `replaces` (lines `replace A => B V`:
# a dependency at a version the module proxy serves, where it refuses the one MODULE pins), and keeps each
# PACKAGE's dependencies (tools.go, go get, go mod tidy). Sets moddir, MODULE's extracted source (its VERSION file,
# its manifests).
module_src() {
  local src=$1 go=$2 module=$3 version=$4
  shift 4
  mkdir -p "$src"
  moddir=$(module_dir "$module@v$version")
  {
    printf 'module phoenix.local/%sbuild\n\ngo %s\n\n' "$(basename "$(dirname "$src")")" "$go"
    awk '/^(replace|exclude) \($/ {block=1} block || /^(replace|exclude) / {print} /^\)$/ {block=0}' "$moddir/go.mod"
    [[ -z ${replaces:-} ]] || printf '%s\n' "$replaces"
  } > "$src/go.mod"
  tools_go "$src" "$@"
  cd "$src" || exit
  go get "$module@v$version"
  go mod tidy
}

# module_command NAME BIN WANT GO MODULE VERSION [GO BUILD FLAG...]: the whole build of a script whose one command is
# cmd/NAME of MODULE@vVERSION (go GO): exits when BIN is up to date (go_build_begin), else sets up its source
# (module_src, in $cache/NAME/src), builds BIN/NAME with the flags the script's function `ldflags` prints (it may
# read moddir, the module's extracted source) and stamps BIN with WANT.
module_command() {
  local name=$1 bin=$2 want=$3 go=$4 module=$5 version=$6 flags
  shift 6
  go_build_begin "$name" "$bin" "$want" "$name"
  module_src "$cache/$name/src" "$go" "$module" "$version" "$module/cmd/$name"
  flags=$(ldflags)
  echo "building $name ($want)"
  go build -trimpath "$@" -ldflags "$flags" -o "$bin/$name" "$module/cmd/$name"
  go_build_done "$name" "$bin" "$want"
}
