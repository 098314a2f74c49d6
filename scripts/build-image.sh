#!/usr/bin/env bash
# Builds the in-cluster image (ci/k8s) without a Docker engine or a registry: buildah (Debian's,
# installed when missing) assembles it FROM scratch with what the binary needs at run time — the
# binary, the shared libraries `ldd` names (glibc, libgcc_s: the kube client is rustls, so no
# libssl), the CA bundle — as uid/gid 65532 with the binary as entrypoint, the way
# ci/k8s/Dockerfile describes it for builders that can pull base images. Writes an OCI archive
# that `skopeo copy oci-archive:… docker://REGISTRY/shakedown:TAG`, `podman load` or
# `ctr images import` take.
#
#   scripts/build-image.sh [OUT.tar]          (default: target/shakedown-image.tar; as root)
#   SHAKEDOWN_BIN=PATH scripts/build-image.sh (package a binary built elsewhere)
#
# The soak farm's image (ci/k8s/farm, the local target in privileged pods) is this image with
# the local stack's programs in it, built by scripts/build-farm-image.sh through three settings:
#   SHAKEDOWN_IMAGE_TAG    the image's name (default shakedown:latest)
#   SHAKEDOWN_IMAGE_USER   uid:gid it runs as (default 65532:65532)
#   SHAKEDOWN_IMAGE_EXTRA  more files, each copied to its own path with the libraries ldd names
#
# Checks the image before writing it: the binary inside answers `--version` when run from the
# image's own root (buildah run, chroot isolation), as uid 65532.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-target/shakedown-image.tar}"
bin="${SHAKEDOWN_BIN:-}"
tag="${SHAKEDOWN_IMAGE_TAG:-shakedown:latest}"
user="${SHAKEDOWN_IMAGE_USER:-65532:65532}"
extra="${SHAKEDOWN_IMAGE_EXTRA:-}"
for f in $extra; do
  [ -f "$f" ] || { echo "SHAKEDOWN_IMAGE_EXTRA: no file $f" >&2; exit 4; }
done
if [ -z "$bin" ]; then
  cargo build --release --locked --bin shakedown
  bin="${CARGO_TARGET_DIR:-target}/release/shakedown"
fi
[ -x "$bin" ] || { echo "no shakedown binary at $bin" >&2; exit 4; }
if ! command -v buildah >/dev/null; then
  echo "installing: buildah (Debian)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends buildah >/dev/null
fi
# vfs: no overlay mounts needed (works inside containers and on any filesystem).
store=$(mktemp -d /var/tmp/shakedown-image-XXXXXX)
bh() { buildah --storage-driver vfs --root "$store/root" --runroot "$store/run" "$@"; }
ctr=""
cleanup() {
  [ -n "$ctr" ] && bh rm "$ctr" >/dev/null 2>&1 || true
  bh rmi --all --force >/dev/null 2>&1 || true
  rm -rf "$store"
}
trap cleanup EXIT
ctr=$(bh from scratch)
root=$(bh mount "$ctr")
install -D -m 0755 "$bin" "$root/usr/local/bin/shakedown"
# The shared libraries and the dynamic loader, at their paths (the extra files' too).
for f in $extra; do
  install -D -m "$(stat -c %a "$f")" "$f" "$root$f"
done
for f in "$bin" $extra; do
  # A file that is not a dynamic executable (a static one, a configuration file) has none.
  for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [ -e "$root$lib" ] || install -D -m 0755 "$lib" "$root$lib"
  done
done
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
printf 'root:x:0:0:root:/:/nonexistent\nshakedown:x:65532:65532:shakedown:/var/lib/shakedown:/nonexistent\n' > "$root/etc/passwd"
printf 'root:x:0:\nshakedown:x:65532:\n' > "$root/etc/group"
bh umount "$ctr" >/dev/null
bh config --user "$user" --entrypoint '["/usr/local/bin/shakedown"]' --cmd '["--help"]' \
  --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt --workingdir /var/lib/shakedown \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --label org.opencontainers.image.title=shakedown \
  --label "org.opencontainers.image.version=$("$bin" --version | awk '{print $2}')" "$ctr"
version=$(bh run --isolation chroot --user "$user" "$ctr" -- /usr/local/bin/shakedown --version)
echo "in the image, as uid ${user%%:*}: $version"
# Each extra program starts inside the image (a library ldd missed would stop it at the loader).
for f in $extra; do
  [ -x "$f" ] || continue
  said=$(bh run --isolation chroot --user "$user" "$ctr" -- "$f" --version 2>&1 || true)
  if printf '%s' "$said" | grep -q -e 'error while loading shared libraries' -e 'no such file or directory'; then
    echo "$f does not start inside the image: $said" >&2
    exit 4
  fi
done
mkdir -p "$(dirname "$out")"
rm -f "$out"
bh commit --quiet "$ctr" "$tag" >/dev/null
bh push --quiet "$tag" "oci-archive:$out:$tag"
echo "image: $out ($(du -h "$out" | cut -f1); oci-archive, tag $tag)"
