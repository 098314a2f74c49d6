#!/usr/bin/env bash
# Finding 8 (etcd-io/etcd#18089) without shakedown: one member; put /k, delete /k (revision 3),
# compact to 3, then watch from revision 3. etcd accepts the watch (3 is not below the compacted
# revision), so it owes the delete at revision 3. With the defect the compaction removed that
# tombstone and the watch delivers nothing for it; fixed, it delivers "DELETE /k".
#
#   ./watch-compacted-tombstone.sh                                      # Debian's etcd 3.4.23
#   ETCD=/var/cache/shakedown/etcd-3.5/etcd ./watch-compacted-tombstone.sh   # 3.5.16
#
# Uses 127.250.7.9, ports 23073/23074, and a temporary data directory removed at the end.
set -euo pipefail
ETCD=${ETCD:-/usr/bin/etcd}
ETCDCTL=${ETCDCTL:-etcdctl}
export ETCDCTL_API=3
work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ip=127.250.7.9
"$ETCD" --name x --data-dir "$work/d" --listen-peer-urls "http://$ip:23074" --initial-advertise-peer-urls "http://$ip:23074" \
  --listen-client-urls "http://$ip:23073" --advertise-client-urls "http://$ip:23073" \
  --initial-cluster "x=http://$ip:23074" >"$work/x.log" 2>&1 &
pid=$!
e() { "$ETCDCTL" --endpoints="http://$ip:23073" --command-timeout=5s "$@"; }
for _ in $(seq 50); do e endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
"$ETCD" --version | head -1
e put /k v1 -w json | python3 -c 'import json,sys; print("put /k at revision", json.load(sys.stdin)["header"]["revision"])'
e del /k -w json | python3 -c 'import json,sys; print("delete /k at revision", json.load(sys.stdin)["header"]["revision"])'
e put /other x >/dev/null
e compact 3
echo "watch /k from revision 3 (2 s):"
timeout 2 "$ETCDCTL" --endpoints="http://$ip:23073" watch /k --rev=3 || true
echo "(end of watch)"
