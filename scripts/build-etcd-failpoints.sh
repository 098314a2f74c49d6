#!/usr/bin/env bash
# Builds etcd with etcd's own failpoints compiled in (gofail), from Debian's source — the very
# source Debian's etcd-server is built from — for the local target's `failpoint` op
# (`[etcd] failpoints = true` in a profile). As root, Debian 12. Two builds:
#   3.4.23  bookworm's golang-etcd-server-dev and gofail, with the system's Go 1.19 (installed
#           with apt), into ${SHAKEDOWN_FAILPOINT_CACHE:-/var/cache/shakedown}/etcd-3.4-failpoints
#   3.5.16  trixie's golang-etcd-server-dev and gofail with trixie's Go 1.24, their .debs fetched
#           with a private apt configuration and unpacked into a scratch directory (nothing of
#           trixie is installed), into …/etcd-3.5-failpoints
# Each cache holds `etcd` (its `--version` says the plain version), the restore tool beside it
# (Debian's etcdctl 3.4.23; etcdutl 3.5.16 from scripts/fetch-etcd-3.5.sh's cache) and
# `failpoints`: the failpoints the binary serves on gofail's endpoint (GOFAIL_HTTP=HOST:PORT;
# GET lists them, PUT /NAME arms one with terms such as `panic("…")` or `1*sleep(2000)`), one per
# line, as it names them (`etcdserver/raftBeforeSave` on 3.4, `raftBeforeSave` on 3.5).
# Skips a build whose cache holds a binary that runs and its list. The first time, on 2 cores:
# about 30 s (3.4) and 90 s (3.5) idle, 3 minutes in all beside a running soak.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
root="${SHAKEDOWN_FAILPOINT_CACHE:-/var/cache/shakedown}"
cached() { # DIR → true if DIR holds a working failpoint build with its raft loop's failpoints
  [ -x "$1/etcd" ] && grep -q 'raftBeforeSave$' "$1/failpoints" 2>/dev/null && "$1/etcd" --version >/dev/null 2>&1
}
work="$(mktemp -d)"
trap 'pkill -f "$work/" 2>/dev/null || true; rm -rf "$work"' EXIT

# list_failpoints BINARY OUT: start a throwaway member on loopback with gofail's endpoint and
# write the failpoints it serves into OUT.
list_failpoints() {
  local bin="$1" out="$2" ip list=""
  # An address of its own on loopback (shakedown's stacks use 127.64–127.243, docs/findings' experiments 127.250), etcd's own ports.
  ip="127.251.$((RANDOM % 250)).$((RANDOM % 250 + 1))"
  GOFAIL_HTTP="$ip:22381" "$bin" --data-dir "$work/data-$ip" \
    --listen-client-urls "http://$ip:2379" --advertise-client-urls "http://$ip:2379" \
    --listen-peer-urls "http://$ip:2380" --initial-advertise-peer-urls "http://$ip:2380" \
    --initial-cluster "default=http://$ip:2380" > "$work/etcd-$ip.log" 2>&1 &
  local pid=$!
  # gofail's endpoint serves as soon as its runtime package is initialised, before the packages
  # that register failpoints are: a list read then misses some (on a loaded machine, all of the
  # raft loop's). Read it once the member answers its health check (every package initialised).
  for _ in $(seq 1 100); do
    if curl -sf --max-time 1 "http://$ip:2379/health" >/dev/null; then
      list="$(curl -sf --max-time 1 "http://$ip:22381/" || true)"
      [ -n "$list" ] && break
    fi
    sleep 0.2
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [ -n "$list" ] || { echo "the failpoint build $bin did not serve gofail's endpoint; its log:" >&2; cat "$work/etcd-$ip.log" >&2; exit 1; }
  printf '%s\n' "$list" | sed -n 's/=.*//p' | grep . > "$out"
}

# install_build DIR BINARY TOOL: the binary, its restore tool and its failpoints list into DIR.
install_build() {
  local dir="$1" bin="$2" tool="$3"
  mkdir -p "$dir"
  list_failpoints "$bin" "$dir/failpoints.tmp"
  grep -q 'raftBeforeSave$' "$dir/failpoints.tmp" || {
    echo "the failpoint build $bin serves no raftBeforeSave; it serves:" >&2; cat "$dir/failpoints.tmp" >&2; exit 1; }
  install -m 0755 "$tool" "$dir/$(basename "$tool")"
  install -m 0755 "$bin" "$dir/etcd.tmp"
  mv "$dir/etcd.tmp" "$dir/etcd"
  mv "$dir/failpoints.tmp" "$dir/failpoints"
  echo "etcd failpoint build: $("$dir/etcd" --version | sed -n 1p), $(wc -l < "$dir/failpoints") failpoints in $dir"
}

need=()
for p in golang-go golang-etcd-server-dev golang-github-etcd-io-gofail golang-github-etcd-io-gofail-dev etcd-client curl debian-archive-keyring; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done

# 1. etcd 3.4.23 from bookworm's source, GOPATH mode against Debian's Go packages, as Debian
#    builds it. gofail rewrites the `// gofail:` comments of the three packages that have them.
dest="$root/etcd-3.4-failpoints"
if cached "$dest"; then
  echo "etcd failpoint build cached: $("$dest/etcd" --version | sed -n 1p) in $dest"
else
  if [ ${#need[@]} -gt 0 ]; then
    echo "installing: ${need[*]} (the etcd 3.4.23 source, gofail and Go, for the failpoint build)"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  src=/usr/share/gocode/src/go.etcd.io/etcd
  [ -f "$src/main.go" ] || { echo "golang-etcd-server-dev has no etcd source at $src" >&2; exit 1; }
  mkdir -p "$work/go34/src/go.etcd.io"
  cp -r "$src" "$work/go34/src/go.etcd.io/etcd"
  (
    cd "$work/go34/src/go.etcd.io/etcd"
    gofail enable etcdserver etcdserver/api/rafthttp mvcc/backend 2>/dev/null
    grep -q 'gofail/runtime' etcdserver/raft.fail.go || { echo "gofail enable produced no failpoints" >&2; exit 1; }
    GOPATH="$work/go34:/usr/share/gocode" GO111MODULE=off CGO_ENABLED=0 GOCACHE="$work/gocache34" \
      go build -o "$work/etcd-3.4" go.etcd.io/etcd
  )
  install_build "$dest" "$work/etcd-3.4" /usr/bin/etcdctl
fi

# 2. etcd 3.5.16 from trixie's source. Its .debs (the etcd source, gofail, Go 1.24 and every Go
#    package the source imports: the golang-* part of the dependency closure, all architecture
#    independent but Go itself, which is static) are downloaded with a private apt configuration
#    and unpacked into the scratch directory; GOPATH mode resolves the source's /v3 module paths
#    (Go's minimal module compatibility).
dest="$root/etcd-3.5-failpoints"
if cached "$dest"; then
  echo "etcd failpoint build cached: $("$dest/etcd" --version | sed -n 1p) in $dest"
  exit 0
fi
etcdutl="$root/etcd-3.5/etcdutl"
[ -x "$etcdutl" ] || "$(dirname "$0")/fetch-etcd-3.5.sh" "$root/etcd-3.5"
apt_dir="$work/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$work/debs" "$work/trixie"
echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main' > "$apt_dir/sources.list"
opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Get::List-Cleanup=0
      -o Dir::State::status=/dev/null -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
echo "fetching etcd 3.5's source, gofail and Go 1.24 (Debian trixie's .debs, unpacked in a scratch directory)"
apt-get "${opts[@]}" update -qq
mapfile -t golang < <(apt-get "${opts[@]}" install -s --no-install-recommends golang-etcd-server-dev \
  golang-github-etcd-io-gofail golang-github-etcd-io-gofail-dev golang-go 2>/dev/null | awk '/^Inst golang-/{print $2}')
[ ${#golang[@]} -gt 10 ] || { echo "trixie's golang-etcd-server-dev and its Go packages not found on the mirror" >&2; exit 1; }
(cd "$work/debs" && apt-get "${opts[@]}" download -qq "${golang[@]}")
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/trixie"; done
t="$work/trixie"
goroot="$(find "$t/usr/lib" -maxdepth 1 -type d -name 'go-1.*' | sort -V | tail -1)"
[ -x "$goroot/bin/go" ] || { echo "no Go toolchain in trixie's golang-go" >&2; exit 1; }
mkdir -p "$work/go35/src/go.etcd.io"
cp -r "$t/usr/share/gocode/src/go.etcd.io/etcd" "$work/go35/src/go.etcd.io/etcd"
(
  cd "$work/go35/src/go.etcd.io/etcd/server"
  "$t/usr/bin/gofail" enable etcdserver etcdserver/api/rafthttp lease/leasehttp mvcc mvcc/backend wal 2>/dev/null
  grep -q 'gofail/runtime' etcdserver/raft.fail.go || { echo "gofail enable produced no failpoints" >&2; exit 1; }
  PATH="$goroot/bin:$PATH" GOROOT="$goroot" GOTOOLCHAIN=local GOPATH="$work/go35:$t/usr/share/gocode" GO111MODULE=off \
    CGO_ENABLED=0 GOCACHE="$work/gocache35" go build -o "$work/etcd-3.5" go.etcd.io/etcd/server
)
install_build "$dest" "$work/etcd-3.5" "$etcdutl"
