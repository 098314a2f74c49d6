#!/usr/bin/env bash
# Builds etcd 3.4.23 with etcd's own failpoints compiled in (gofail), from Debian's source
# (golang-etcd-server-dev, the very source Debian's etcd-server 3.4.23 is built from) with
# Debian's gofail (golang-github-etcd-io-gofail) and Go 1.19, for the local target's `failpoint`
# op (`[etcd] failpoints = true` in a profile). As root, Debian 12. Caches into
# ${SHAKEDOWN_FAILPOINT_CACHE:-/var/cache/shakedown/etcd-3.4-failpoints}:
#   etcd         the failpoint build (`etcd --version` still says 3.4.23); started with
#                GOFAIL_HTTP=HOST:PORT it serves gofail's endpoint (GET lists the failpoints,
#                PUT /NAME arms one with terms such as `panic` or `1*sleep(2000)`)
#   etcdctl      Debian's etcdctl 3.4.23 (the restore tool beside it)
#   failpoints   the failpoints this binary reports on that endpoint, one per line
# Skips everything when the cached binary runs and its list exists. About 30 s once the Go
# packages are installed (they come with golang-etcd-server-dev's dependencies).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cache="${SHAKEDOWN_FAILPOINT_CACHE:-/var/cache/shakedown/etcd-3.4-failpoints}"
if [ -x "$cache/etcd" ] && [ -s "$cache/failpoints" ] && "$cache/etcd" --version >/dev/null 2>&1; then
  echo "etcd failpoint build cached: $("$cache/etcd" --version | sed -n 1p), $(wc -l < "$cache/failpoints") failpoints in $cache"
  exit 0
fi
need=()
for p in golang-go golang-etcd-server-dev golang-github-etcd-io-gofail golang-github-etcd-io-gofail-dev etcd-client curl; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]} (the etcd 3.4.23 source, gofail and Go, for the failpoint build)"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
src=/usr/share/gocode/src/go.etcd.io/etcd
[ -f "$src/main.go" ] || { echo "golang-etcd-server-dev has no etcd source at $src" >&2; exit 1; }
work="$(mktemp -d)"
trap 'pkill -f "$work/etcd" 2>/dev/null || true; rm -rf "$work"' EXIT
# 1. A GOPATH of our own with a copy of the source; gofail rewrites its `// gofail:` comments
#    into failpoints in the three packages that have them (raft loop, peer transport, backend).
mkdir -p "$work/go/src/go.etcd.io"
cp -r "$src" "$work/go/src/go.etcd.io/etcd"
cd "$work/go/src/go.etcd.io/etcd"
gofail enable etcdserver etcdserver/api/rafthttp mvcc/backend 2>/dev/null
grep -q 'gofail/runtime' etcdserver/raft.fail.go || { echo "gofail enable produced no failpoints" >&2; exit 1; }
# 2. Built the way Debian builds it (GOPATH mode against Debian's Go packages), static.
export GOPATH="$work/go:/usr/share/gocode" GO111MODULE=off CGO_ENABLED=0 GOCACHE="$work/gocache"
go build -o "$work/etcd" go.etcd.io/etcd
# 3. The failpoints the binary reports, asked from a throwaway member on loopback.
port=$((30000 + RANDOM % 20000))
GOFAIL_HTTP="127.0.0.1:$port" "$work/etcd" --data-dir "$work/data" \
  --listen-client-urls "http://127.0.0.1:$((port + 1))" --advertise-client-urls "http://127.0.0.1:$((port + 1))" \
  --listen-peer-urls "http://127.0.0.1:$((port + 2))" --initial-advertise-peer-urls "http://127.0.0.1:$((port + 2))" \
  --initial-cluster "default=http://127.0.0.1:$((port + 2))" > "$work/etcd.log" 2>&1 &
list=""
for _ in $(seq 1 50); do
  list="$(curl -sf --max-time 1 "http://127.0.0.1:$port/" || true)"
  [ -n "$list" ] && break
  sleep 0.2
done
kill %1 2>/dev/null || true
wait 2>/dev/null || true
[ -n "$list" ] || { echo "the failpoint build did not serve gofail's endpoint; its log:" >&2; cat "$work/etcd.log" >&2; exit 1; }
mkdir -p "$cache"
printf '%s\n' "$list" | sed -n 's/=.*//p' | grep . > "$cache/failpoints.tmp"
install -m 0755 "$work/etcd" "$cache/etcd.tmp"
install -m 0755 /usr/bin/etcdctl "$cache/etcdctl"
mv "$cache/etcd.tmp" "$cache/etcd"
mv "$cache/failpoints.tmp" "$cache/failpoints"
echo "etcd failpoint build: $("$cache/etcd" --version | sed -n 1p), $(wc -l < "$cache/failpoints") failpoints in $cache"
