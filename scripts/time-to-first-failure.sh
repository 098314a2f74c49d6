#!/usr/bin/env bash
# How long does a tier take to find a defect? Runs one soak per first seed given (each until its
# first failing seed, or CAP), and prints each soak's time from its start to the end of its first
# failing seed — the invariant and the seed — then the median over the soaks that failed.
# With -k ISSUE, the time to the first seed that reported that known defect instead (a defect the
# verdicts name as known, e.g. etcd-io/etcd#18089, is reported, not failed).
#
#   scripts/time-to-first-failure.sh -p docs/findings/txn-range-compacted-profile.toml -c 10m 1 100 200
#   scripts/time-to-first-failure.sh -p ci/profiles/failpoints.toml -c 30m -k etcd-io/etcd#18089 1 2 3
#
# Soaks run one after another in DIR (-o DIR; default ./ttff), each in its own runs and seeds
# directory. The binary is $SHAKEDOWN (default: target/release/shakedown, else
# target/debug/shakedown). Root, like any local-target run. Exit 0 when every soak ran (found or
# not), 2 on bad usage, 4 when a soak could not run.
set -euo pipefail
profile=
cap=
known=
out=ttff
usage() { echo "usage: $0 -p PROFILE -c CAP [-k ISSUE] [-o DIR] FIRST-SEED..." >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -p) [ $# -ge 2 ] || usage; profile=$2; shift 2 ;;
    -c) [ $# -ge 2 ] || usage; cap=$2; shift 2 ;;
    -k) [ $# -ge 2 ] || usage; known=$2; shift 2 ;;
    -o) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ -n "$profile" ] && [ -n "$cap" ] && [ $# -gt 0 ] || usage
for s in "$@"; do [[ "$s" =~ ^[0-9]+$ ]] || usage; done
here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SHAKEDOWN:-}"
if [ -z "$bin" ]; then
  for b in "$here/target/release/shakedown" "$here/target/debug/shakedown"; do
    [ -x "$b" ] && { bin=$b; break; }
  done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "$0: no shakedown binary (cargo build --release, or set SHAKEDOWN)" >&2; exit 4; }
mkdir -p "$out"
times=()
for seed in "$@"; do
  dir="$out/seed-$seed"
  rm -rf "$dir" && mkdir -p "$dir"
  stop=(--max-failures 1)
  [ -n "$known" ] && stop=()
  # A soak that finds a defect exits 1; that is what it is run for.
  set +e
  "$bin" soak --for "$cap" --profile "$profile" --seed "$seed" "${stop[@]}" \
    --runs-dir "$dir/runs" --seeds-dir "$dir/seeds" >"$dir/soak.out" 2>"$dir/soak.err"
  code=$?
  set -e
  [ "$code" -le 1 ] || { echo "$0: the soak from seed $seed exited $code (see $dir/soak.err)" >&2; exit 4; }
  jsonl=$(ls "$dir"/runs/soak-*/soak.jsonl 2>/dev/null | head -n 1)
  [ -n "$jsonl" ] || { echo "$0: the soak from seed $seed wrote no soak.jsonl (see $dir/soak.err)" >&2; exit 4; }
  if [ -n "$known" ]; then
    line=$(grep -F "\"$known\"" "$jsonl" | head -n 1 || true)
  else
    line=$(grep -F '"verdict":"FAIL' "$jsonl" | head -n 1 || true)
  fi
  seeds=$(grep -c . "$jsonl" || true)
  if [ -z "$line" ]; then
    echo "soak from seed $seed: none within $cap ($seeds seeds)"
    continue
  fi
  at=$(sed -E 's/.*"elapsed_s":([0-9.]+).*/\1/' <<<"$line")
  which=$(sed -E 's/.*"seed":([0-9]+).*/\1/' <<<"$line")
  what=$(sed -E 's/.*"verdict":"(FAIL [a-z-]+ at step [0-9]+|[A-Z]+).*/\1/' <<<"$line")
  printf 'soak from seed %s: %.0f s (seed %s, %s; %s seeds run)\n' "$seed" "$at" "$which" "$what" "$seeds"
  times+=("$at")
done
if [ ${#times[@]} -gt 0 ]; then
  median=$(printf '%s\n' "${times[@]}" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}')
  printf 'median time to the first %s: %.0f s over %d of %d soaks\n' "${known:-failure}" "$median" "${#times[@]}" "$#"
else
  echo "no soak found it within $cap"
fi
