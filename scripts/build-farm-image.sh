#!/usr/bin/env bash
# Builds the soak farm's image (ci/k8s/farm: local-target soaks in privileged pods): the
# in-cluster image of scripts/build-image.sh plus what the local stack runs — etcd 3.4 and 3.5
# with their etcdctl/etcdutl (at the paths shakedown looks for them), HAProxy, nft, and the
# disk tools (losetup, mkfs.ext4, e2fsck, mount, umount) — each with the libraries it needs, run
# as root (loop devices, mounts and nftables need it; the pod is privileged). Tag
# shakedown-local:latest.
#
#   scripts/build-farm-image.sh [OUT.tar]          (default: target/shakedown-farm-image.tar; as root)
#   SHAKEDOWN_BIN=PATH scripts/build-farm-image.sh (package a binary built elsewhere)
#
# What goes in is what `./scripts/install-deps.sh` installs on this machine: run it first.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/shakedown-farm-image.tar}"
files=()
for p in haproxy nft losetup mkfs.ext4 e2fsck mount umount; do
  f=$(command -v "$p") || { echo "$p not found: run ./scripts/install-deps.sh" >&2; exit 4; }
  files+=("$f")
done
# etcd 3.4 (Debian's etcd-server) and 3.5 (scripts/fetch-etcd-3.5.sh's cache), with their tools.
for f in /usr/bin/etcd /usr/bin/etcdctl /var/cache/shakedown/etcd-3.5/etcd /var/cache/shakedown/etcd-3.5/etcdctl /var/cache/shakedown/etcd-3.5/etcdutl; do
  [ -x "$f" ] || { echo "$f not found: run ./scripts/install-deps.sh" >&2; exit 4; }
  files+=("$f")
done
files+=(/etc/mke2fs.conf)
SHAKEDOWN_IMAGE_TAG=shakedown-local:latest SHAKEDOWN_IMAGE_USER=0:0 SHAKEDOWN_IMAGE_EXTRA="${files[*]}" \
  exec ./scripts/build-image.sh "$out"
