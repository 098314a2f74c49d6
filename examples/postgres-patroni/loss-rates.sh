#!/usr/bin/env bash
# How many acknowledged writes does a failover lose, per replication configuration? Soaks the
# `app-database` tier against the reference application in one configuration for CAP in all,
# reinstalling the application whenever a soak stops (a cluster left without a primary for good
# ends a soak: docs/findings.md, findings 11 and 12), until FAILOVERS failovers have happened or
# CAP is spent. Then prints the failovers, the losses of the leader, the seeds and how many of
# them lost acknowledged writes, and every app-durability verdict.
#
#   examples/postgres-patroni/loss-rates.sh -c async -t 20m -n 20 -o /tmp/loss
#
# Configurations (-c), each patroni.yaml as shipped but for:
#   strict            nothing (synchronous_mode and synchronous_mode_strict)
#   async             synchronous_mode: false, synchronous_mode_strict: false
#   async-timeline    async, and check_timeline: true
#   async-no-rewind   async, and use_pg_rewind: false
# The asynchronous ones use app.toml without its synchronous-standby probe.
#
# Needs a node with the image loaded and opted in to chaos (the README beside this script),
# KUBECONFIG pointing at it, and the shakedown binary ($SHAKEDOWN, else on PATH). Each soak goes
# to DIR/<config>/soak-<i>/ (-o DIR; default ./loss-rates). Exit 0 when the soaks ran (whatever
# they found), 2 on bad usage, 4 when the application could not be installed.
set -euo pipefail
config=
cap=
want=20
out=loss-rates
seed=1
usage() { echo "usage: $0 -c strict|async|async-timeline|async-no-rewind -t CAP -n FAILOVERS [-s FIRST-SEED] [-o DIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -c) [ $# -ge 2 ] || usage; config=$2; shift 2 ;;
    -t) [ $# -ge 2 ] || usage; cap=$2; shift 2 ;;
    -n) [ $# -ge 2 ] || usage; want=$2; shift 2 ;;
    -s) [ $# -ge 2 ] || usage; seed=$2; shift 2 ;;
    -o) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) usage ;;
  esac
done
case "$config" in strict|async|async-timeline|async-no-rewind) ;; *) usage ;; esac
[[ "$cap" =~ ^[0-9]+[smh]$ && "$want" =~ ^[1-9][0-9]*$ && "$seed" =~ ^[0-9]+$ ]] || usage
[ -n "${KUBECONFIG:-}" ] || { echo "$0: set KUBECONFIG to the node's kubeconfig" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
bin="${SHAKEDOWN:-$(command -v shakedown || true)}"
[ -n "$bin" ] && [ -x "$bin" ] || { echo "$0: no shakedown binary (set SHAKEDOWN)" >&2; exit 2; }
secs() { local n=${1%?}; case "$1" in *s) echo "$n" ;; *m) echo $((n * 60)) ;; *h) echo $((n * 3600)) ;; esac; }
deadline=$((SECONDS + $(secs "$cap")))
dir="$out/$config"
mkdir -p "$dir"

# The configuration's manifests and app profile.
manifest="$dir/patroni.yaml"
profile="$dir/app.toml"
cp "$here/patroni.yaml" "$manifest"
cp "$here/app.toml" "$profile"
if [ "$config" != strict ]; then
  sed -i -e 's/^\( *synchronous_mode\): true/\1: false/' -e 's/^\( *synchronous_mode_strict\): true/\1: false/' "$manifest"
  # The synchronous-standby probe: there is none to find.
  python3 - "$profile" <<'EOF'
import sys
p = sys.argv[1]
s = open(p).read()
# The paragraph (comment and table) of that probe.
s = "\n\n".join(b for b in s.split("\n\n") if 'name = "a synchronous standby' not in b)
open(p, "w").write(s)
EOF
fi
[ "$config" = async-timeline ] && sed -i 's/^\( *\)maximum_lag_on_failover: \(.*\)$/&\n\1check_timeline: true/' "$manifest"
[ "$config" = async-no-rewind ] && sed -i 's/^\( *use_pg_rewind\): true/\1: false/' "$manifest"
grep -q 'name = "a synchronous standby' "$profile" && [ "$config" != strict ] && { echo "$0: could not take the synchronous probe out of $profile" >&2; exit 4; }

install() {
  kubectl delete namespace pg --ignore-not-found --wait=true --timeout=180s >/dev/null
  kubectl apply -f "$manifest" >/dev/null
  kubectl -n pg rollout status statefulset/pg --timeout=300s >/dev/null
  for _ in $(seq 1 60); do
    [ -n "$(kubectl -n pg get pods -l role=master -o name 2>/dev/null)" ] && return 0
    sleep 2
  done
  return 1
}

failovers() { # total failovers over the soaks so far (their summaries' "leader lost" rows)
  # "  leader lost  N times: F failed over (median …) · K kept by the operator, …"
  cat "$dir"/soak-*/soak.out 2>/dev/null | sed -n 's/^ *leader lost .* times: \([0-9]*\) failed over.*/\1/p' |
    awk '{s += $1} END {print s + 0}'
}

i=0
while [ $SECONDS -lt $deadline ] && [ "$(failovers)" -lt "$want" ]; do
  i=$((i + 1))
  install || { echo "$0: the application did not come up (kubectl -n pg get pods)" >&2; exit 4; }
  left=$((deadline - SECONDS))
  [ $left -gt 60 ] || break
  s="$dir/soak-$i"
  rm -rf "$s" && mkdir -p "$s"
  echo "soak $i: $config, seed $seed on, ${left}s left, $(failovers) failovers so far"
  code=0
  "$bin" soak --target app --app-profile "$profile" --profile app-database --for "${left}s" --seed "$seed" --max-failures 1 \
    --runs-dir "$s/runs" --seeds-dir "$s/seeds" >"$s/soak.out" 2>"$s/soak.err" || code=$?
  echo "soak $i exited $code: $(grep -c . "$s"/runs/soak-*/soak.jsonl 2>/dev/null || echo 0) seeds"
  seed=$((seed + 1000))
done
echo "== $config: $(failovers) failovers over $i soak(s)"
grep -h 'leader lost' "$dir"/soak-*/soak.out || true
grep -h '"verdict":"FAIL' "$dir"/soak-*/runs/soak-*/soak.jsonl 2>/dev/null | sed -E 's/.*"seed":([0-9]+).*"verdict":"([^"]{0,200}).*/seed \1: \2/' || true
