#!/usr/bin/env bash
# Fetches a fixed etcd 3.5 (Debian trixie's etcd-server/etcd-client 3.5.16-4) into ./bin beside
# this script, without touching the system's packages: a private apt configuration downloads the
# two .debs and dpkg-deb extracts the binaries. Needs the Debian mirror (deb.debian.org).
set -euo pipefail
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" bin
echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main' > "$work/sources.list"
opts=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Get::List-Cleanup=0)
apt-get "${opts[@]}" update -qq
(cd "$work" && apt-get "${opts[@]}" download etcd-server=3.5.16-4 etcd-client=3.5.16-4)
for deb in "$work"/etcd-server_*.deb "$work"/etcd-client_*.deb; do dpkg-deb -x "$deb" "$work/x"; done
cp "$work/x/usr/bin/etcd" bin/etcd-3.5.16
cp "$work/x/usr/bin/etcdctl" bin/etcdctl-3.5.16
[ -f "$work/x/usr/bin/etcdutl" ] && cp "$work/x/usr/bin/etcdutl" bin/etcdutl-3.5.16
bin/etcd-3.5.16 --version | head -1
