#!/usr/bin/env bash
# Builds the reference application's image, PostgreSQL 15, Patroni 3.0.2 and pgBackRest 2.45 from
# Debian 12's packages, without a registry or Docker: a minimal root filesystem made by debootstrap (as root),
# packed as a `docker save` archive that `shakedown node load` imports. Cached: a second run with
# the archive present (of this script's tag) does nothing.
#
#   ./examples/postgres-patroni/build-image.sh [ARCHIVE]    # default /var/cache/shakedown/images/postgres-patroni.tar
#   shakedown node load /var/cache/shakedown/images/postgres-patroni.tar
#
# The image runs `patroni /etc/patroni/patroni.yml` as the postgres user; the configuration
# comes from the manifests (a ConfigMap) and the pod's environment. About 2 minutes and 300 MB
# the first time (the packages come from the machine's Debian mirror).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
out="${1:-/var/cache/shakedown/images/postgres-patroni.tar}"
tag="shakedown.local/postgres-patroni:15-3.0.2-pgbackrest"
# The tag changes with what the image holds: an archive of another tag is rebuilt.
if [ -s "$out" ] && tar -xOf "$out" manifest.json 2>/dev/null | grep -qF "\"$tag\""; then
  echo "image cached: $tag in $out"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "debootstrap needs root: run as root" >&2; exit 4; }
command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
command -v python3 >/dev/null || { echo "python3 is needed to pack the image (./scripts/install-deps.sh --all installs it)" >&2; exit 4; }
# The machine's own Debian mirror (deb822 or one-line sources), else Debian's.
mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | sed -n 1p)"
[ -n "$mirror" ] || mirror="$(awk '$1 == "deb" { print $2; exit }' /etc/apt/sources.list 2>/dev/null)"
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

mkdir -p "$(dirname "$out")"
work="$(mktemp -d "$(dirname "$out")/.postgres-patroni.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
echo "building $tag: debootstrap bookworm from $mirror"
debootstrap --variant=minbase --include=postgresql-15,patroni,pgbackrest,python3-psycopg2,iproute2,procps,ca-certificates \
  bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
# What a container never uses: the package cache and indexes, documentation, the default cluster
# Debian's postinst made (Patroni bootstraps its own), and the build host's resolv.conf.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
  "$rootfs"/usr/share/man/* "$rootfs"/var/lib/postgresql/15/main "$rootfs"/etc/postgresql/15/main
: > "$rootfs/etc/resolv.conf"
mkdir -p "$rootfs/etc/patroni" "$rootfs/data"
uid="$(awk -F: '$1 == "postgres" { print $3 }' "$rootfs/etc/passwd")"
gid="$(awk -F: '$1 == "postgres" { print $4 }' "$rootfs/etc/passwd")"
[ -n "$uid" ] || { echo "the image has no postgres user" >&2; exit 1; }
chown "$uid:$gid" "$rootfs/data"
tar --numeric-owner -C "$rootfs" -cf "$work/layer.tar" .
python3 - "$work" "$tag" "$uid" "$gid" <<'PY'
import hashlib, json, os, sys
work, tag, uid, gid = sys.argv[1:5]
h = hashlib.sha256()
with open(os.path.join(work, "layer.tar"), "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
config = {
    "architecture": "amd64",
    "os": "linux",
    "config": {
        "User": f"{uid}:{gid}",
        "Entrypoint": ["/usr/bin/patroni"],
        "Cmd": ["/etc/patroni/patroni.yml"],
        "Env": ["PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG=C.UTF-8", "PGHOST=/tmp"],
        "WorkingDir": "/data",
    },
    "rootfs": {"type": "layers", "diff_ids": ["sha256:" + h.hexdigest()]},
}
with open(os.path.join(work, "config.json"), "w") as f:
    json.dump(config, f)
with open(os.path.join(work, "manifest.json"), "w") as f:
    json.dump([{"Config": "config.json", "RepoTags": [tag], "Layers": ["layer.tar"]}], f)
PY
tar -C "$work" -cf "$work/image.tar" manifest.json config.json layer.tar
mv "$work/image.tar" "$out"
echo "image built: $tag ($(du -m "$out" | cut -f1) MB, postgres uid $uid) in $out"
echo "load it: shakedown node load $out"
