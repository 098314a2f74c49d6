#!/usr/bin/env bash
# Finding 7 (etcd-io/etcd#18667) without shakedown: a 3-member cluster, 20 puts, a compaction to
# revision 15, then through member 2 a transaction that deletes a key and ranges another at the
# compacted revision 5. etcd refuses it ("required revision has been compacted"); the script then
# prints every member's revision and applied index. With the defect, member 2 stays at revision
# 21 while members 1 and 3 applied the delete (revision 22), all at the same applied index.
#
#   ./txn-range-compacted.sh                      # Debian's etcd 3.4.23 (/usr/bin/etcd, etcdctl)
#   ETCD=/var/cache/shakedown/etcd-3.5/etcd ./txn-range-compacted.sh   # 3.5.16
#
# Uses 127.250.7.1-3, ports 23071/23072, and a temporary data directory removed at the end.
set -euo pipefail
ETCD=${ETCD:-/usr/bin/etcd}
ETCDCTL=${ETCDCTL:-etcdctl}
export ETCDCTL_API=3
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cluster="x1=http://127.250.7.1:23072,x2=http://127.250.7.2:23072,x3=http://127.250.7.3:23072"
for i in 1 2 3; do
  ip=127.250.7.$i
  "$ETCD" --name "x$i" --data-dir "$work/d$i" --listen-peer-urls "http://$ip:23072" \
    --initial-advertise-peer-urls "http://$ip:23072" --listen-client-urls "http://$ip:23071" \
    --advertise-client-urls "http://$ip:23071" --initial-cluster "$cluster" \
    --initial-cluster-state new >"$work/x$i.log" 2>&1 &
  pids+=($!)
done
at() { "$ETCDCTL" --endpoints="http://127.250.7.$1:23071" --command-timeout=5s "${@:2}"; }
for _ in $(seq 50); do at 1 endpoint health >/dev/null 2>&1 && at 3 endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
for i in $(seq 1 20); do at 1 put "/k/$i" "v$i" >/dev/null; done
at 1 compact 15
status() {
  for i in 1 2 3; do
    at "$i" endpoint status -w json | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]["Status"]
applied = s.get("raftAppliedIndex", s.get("raft_applied_index", "?"))
print("member", sys.argv[1] + ": revision", s["header"]["revision"], "applied index", applied)' "$i"
  done
}
status
echo "transaction through member 2: if mod(/k/1) > 0 then delete /k/2, get /k/3 at revision 5"
at 2 txn <<'TXN' || true
mod("/k/1") > "0"

del /k/2
get /k/3 --rev=5


TXN
sleep 1
status
