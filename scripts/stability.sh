#!/usr/bin/env bash
# Are the real-stack tests stable with the machine loaded? Runs the tests RUNS times in a row
# (default 5) beside BURNERS busy loops (default: one per core), and stops at the first run
# that fails. Arguments after `--` go to `cargo nextest run` (default: the whole workspace).
#
#   scripts/stability.sh                          # the whole suite, 5 runs, one burner per core
#   scripts/stability.sh -n 10 -- --test local_target
#   scripts/stability.sh -b 2 -- --test node --test app_target
#   scripts/stability.sh -b 0 -o /tmp/node-runs -- --test node --test app_target   # beside another
#
# Each run's output goes to DIR/run-<i>.log (-o DIR; default $CARGO_TARGET_DIR/stability); the
# last line says how many runs passed in a row. Exit 0 when every run passed, 1 when one failed,
# 2 on bad usage.
# Root, like the tests; needs cargo-nextest (`cargo install --locked cargo-nextest`).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5
burners=$(nproc)
logs=
usage() { echo "usage: $0 [-n RUNS] [-b BURNERS] [-o LOG-DIR] [-- NEXTEST-ARGS...]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -n) [ $# -ge 2 ] || usage; runs=$2; shift 2 ;;
    -b) [ $# -ge 2 ] || usage; burners=$2; shift 2 ;;
    -o) [ $# -ge 2 ] || usage; logs=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) usage ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ && "$burners" =~ ^[0-9]+$ ]] || usage
cargo nextest --version >/dev/null 2>&1 || { echo "$0: cargo-nextest is missing: cargo install --locked cargo-nextest" >&2; exit 2; }
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--workspace)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/cache/shakedown/target}"
logs="${logs:-$CARGO_TARGET_DIR/stability}"
mkdir -p "$logs"
# Build before loading the machine: the load is for the tests.
cargo nextest run --no-run "${args[@]}"

pids=()
stop_burners() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop_burners EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq 1 "$burners"); do
  ( while :; do :; done ) &
  pids+=($!)
done
echo "stability: $runs run(s) of cargo nextest run ${args[*]} beside $burners burner(s); logs in $logs"
for i in $(seq 1 "$runs"); do
  start=$SECONDS
  if cargo nextest run --no-fail-fast "${args[@]}" >"$logs/run-$i.log" 2>&1; then
    echo "run $i/$runs: passed in $((SECONDS - start)) s ($(grep -m1 -o '[0-9]* tests run: .*' "$logs/run-$i.log" || true))"
  else
    echo "run $i/$runs: FAILED after $((SECONDS - start)) s; $((i - 1)) passed in a row. Failing tests:"
    grep -E '^ *(FAIL|TIMEOUT|SIGSEGV|SIGABRT|LEAK-FAIL) ' "$logs/run-$i.log" | sort -u || true
    echo "(the whole output: $logs/run-$i.log)"
    exit 1
  fi
done
echo "stability: $runs of $runs runs passed in a row"
