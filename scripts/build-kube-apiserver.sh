#!/usr/bin/env bash
# Builds kube-apiserver 1.20.2 from Debian's `kubernetes` source package with Go 1.19 (as root,
# Debian 12) for the kube target's tests, and caches the binary under
# ${SHAKEDOWN_KUBE_CACHE:-/var/cache/shakedown/kube}/kube-apiserver. Skips everything when the
# cached binary exists and runs. Facts: tests/fixtures/crds/README.md and the comments below. About 7 minutes on 2 cores
# the first time; seconds afterwards.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cache="${SHAKEDOWN_KUBE_CACHE:-/var/cache/shakedown/kube}"
bin="$cache/kube-apiserver"
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
  echo "kube-apiserver cached: $("$bin" --version) ($bin)"
  exit 0
fi
mkdir -p "$cache"

# 1. A deb-src entry mirroring the existing Debian entry (deb822 or one-line format): the same
#    mirror, suites and keys as this machine's own `deb` entry.
src_list=/etc/apt/sources.list.d/shakedown-deb-src.sources
if ! grep -rqs '^Types:.*deb-src\|^deb-src ' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed -e 's/^Types: *deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$src_list"
  elif grep -qs '^deb ' /etc/apt/sources.list; then
    grep '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' > /etc/apt/sources.list.d/shakedown-deb-src.list
  else
    echo "no Debian apt entry to mirror as deb-src; add one (a deb-src entry for the kubernetes source package)" >&2
    exit 4
  fi
fi
apt-get update -qq
# 2. Go 1.19, rsync (the build's helper scripts), dpkg-dev (apt-get source), reflect2 1.0.2.
apt-get install -y -qq --no-install-recommends golang-go rsync dpkg-dev make \
  golang-github-modern-go-reflect2-dev >/dev/null

work="$cache/build"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
apt-get source -qq kubernetes >/dev/null 2>&1 || apt-get source kubernetes
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -1)"
[ -n "$src" ] || { echo "apt-get source kubernetes produced no source tree" >&2; exit 1; }

# 3. The vendored reflect2 v1.0.1 crashes under Go 1.19: replace it with Debian's 1.0.2.
r2="$(dpkg -L golang-github-modern-go-reflect2-dev | grep '/github.com/modern-go/reflect2$' | head -1)"
[ -n "$r2" ] || { echo "reflect2 source not found in golang-github-modern-go-reflect2-dev" >&2; exit 1; }
rm -rf "$src/vendor/github.com/modern-go/reflect2"
cp -rL "$r2" "$src/vendor/github.com/modern-go/reflect2"

# 4. GOPATH layout, static binary.
mkdir -p "$work/.go/src/k8s.io"
ln -sfn "$src" "$work/.go/src/k8s.io/kubernetes"
cd "$work/.go/src/k8s.io/kubernetes"
export GOPATH="$work/.go" GO111MODULE=off CGO_ENABLED=0 GOFLAGS=-mod=vendor
export GOCACHE="$cache/gocache"
# KUBE_GIT_VERSION: a source package has no git metadata.
make WHAT=cmd/kube-apiserver KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
out="$(find "$work/.go/src/k8s.io/kubernetes/_output" -type f -name kube-apiserver -perm -u+x | head -1)"
[ -n "$out" ] || { echo "build produced no kube-apiserver" >&2; exit 1; }
install -m 0755 "$out" "$bin.tmp" && mv "$bin.tmp" "$bin"
"$bin" --version
# The source tree (~1 GiB) is not needed once the binary is cached; the Go cache is kept.
cd / && rm -rf "$work"
echo "kube-apiserver built: $bin"
