#!/usr/bin/env bash
# Builds Kubernetes 1.20.2 from Debian's `kubernetes` source package with Go 1.19 (as root,
# Debian 12) for the kube and app targets' tests: kube-apiserver (the kube target's tests), and
# kubelet, kube-controller-manager, kube-scheduler, kube-proxy and a static pause binary (the local node,
# `shakedown node up`). Caches them under ${SHAKEDOWN_KUBE_CACHE:-/var/cache/shakedown/kube}.
# Skips everything when every cached binary exists and runs. Facts: tests/fixtures/crds/README.md
# and the comments below. About 12 minutes on 2 cores the first time; seconds afterwards.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cache="${SHAKEDOWN_KUBE_CACHE:-/var/cache/shakedown/kube}"
bins=(kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy)
cached=1
for b in "${bins[@]}"; do
  { [ -x "$cache/$b" ] && "$cache/$b" --version >/dev/null 2>&1; } || cached=0
done
[ -x "$cache/pause" ] || cached=0
if [ "$cached" = 1 ]; then
  echo "Kubernetes cached: $("$cache/kube-apiserver" --version), ${bins[*]} and pause in $cache"
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
apt-get install -y -qq --no-install-recommends golang-go rsync dpkg-dev make gcc libc6-dev \
  golang-github-modern-go-reflect2-dev >/dev/null

work="$cache/build"
rm -rf "$work"
mkdir -p "$work"
cd "$work"
apt-get source -qq kubernetes >/dev/null 2>&1 || apt-get source kubernetes
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | sed -n 1p)"
[ -n "$src" ] || { echo "apt-get source kubernetes produced no source tree" >&2; exit 1; }

# 3. The vendored reflect2 v1.0.1 crashes under Go 1.19: replace it with Debian's 1.0.2.
r2="$(dpkg -L golang-github-modern-go-reflect2-dev | grep '/github.com/modern-go/reflect2$' | sed -n 1p)"
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
make WHAT="$(printf 'cmd/%s ' "${bins[@]}")" KUBE_GIT_VERSION=v1.20.2 KUBE_GIT_TREE_STATE=clean
for b in "${bins[@]}"; do
  out="$(find "$work/.go/src/k8s.io/kubernetes/_output" -type f -name "$b" -perm -u+x | sed -n 1p)"
  [ -n "$out" ] || { echo "build produced no $b" >&2; exit 1; }
  install -m 0755 "$out" "$cache/$b.tmp" && mv "$cache/$b.tmp" "$cache/$b"
  "$cache/$b" --version
done
# 5. The pause binary of the node's sandbox image, as build/pause/Makefile builds it.
gcc -Os -static -DVERSION=v3.4-shakedown -o "$cache/pause.tmp" build/pause/linux/pause.c
mv "$cache/pause.tmp" "$cache/pause"
# The source tree (~1 GiB) is not needed once the binaries are cached; the Go cache is kept.
cd / && rm -rf "$work"
echo "Kubernetes built: ${bins[*]} and pause in $cache"
