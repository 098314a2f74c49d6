#!/usr/bin/env bash
# Fetches the local target's default etcd 3.5 — Debian trixie's etcd-server/etcd-client
# (3.5.16-4, which has the fix for etcd-io/etcd#13766) — into DEST (default
# /var/cache/shakedown/etcd-3.5: etcd, etcdctl, etcdutl) without touching the system's packages:
# a private apt configuration downloads the two .debs from the Debian mirror and dpkg-deb
# extracts the binaries. If the mirror no longer has 3.5.16-4, trixie's current etcd 3.5 is
# taken, provided it is 3.5.3 or later (3.5.0–3.5.2 lose applied entries: docs/findings.md,
# finding 1). Idempotent: does nothing when DEST already holds a working etcd 3.5.
set -euo pipefail
dest="${1:-/var/cache/shakedown/etcd-3.5}"
pinned=3.5.16-4
fixed() { # etcd binary → true if it is an etcd 3.5.x with x ≥ 3
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^etcd Version: //p')
  [[ "$v" =~ ^3\.5\.([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 3 ]
}
if [ -x "$dest/etcd" ] && [ -x "$dest/etcdutl" ] && fixed "$dest/etcd"; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main' > "$work/sources.list"
opts=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Get::List-Cleanup=0
      -o APT::Sandbox::User=root)
echo "fetching etcd 3.5 (Debian trixie etcd-server $pinned) into $dest"
apt-get "${opts[@]}" update -qq
if ! (cd "$work" && apt-get "${opts[@]}" download -qq "etcd-server=$pinned" "etcd-client=$pinned"); then
  echo "Debian trixie no longer has etcd $pinned; taking its current etcd-server" >&2
  (cd "$work" && apt-get "${opts[@]}" download -qq etcd-server etcd-client)
fi
for deb in "$work"/etcd-server_*.deb "$work"/etcd-client_*.deb; do dpkg-deb -x "$deb" "$work/x"; done
if ! fixed "$work/x/usr/bin/etcd"; then
  echo "error: the fetched etcd is not 3.5.3 or later: $("$work/x/usr/bin/etcd" --version | sed -n 1p)" >&2
  exit 1
fi
mkdir -p "$dest"
for b in etcd etcdctl etcdutl; do install -m 0755 "$work/x/usr/bin/$b" "$dest/$b"; done
"$dest/etcd" --version | sed -n 1p
