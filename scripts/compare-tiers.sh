#!/usr/bin/env bash
# Which of several tiers finds defects fastest? Soaks each profile given for CAP from the same
# first seed, then prints one row per profile: seeds and steps run, failures (safety and
# liveness, by what failed), and the known defects the verdicts named, each per hour of soak,
# with the time to the first report of each. The way a tier's weights are chosen by measurement
# (docs/development.md, "Choosing a tier's weights").
#
#   scripts/compare-tiers.sh -c 12m -s 500 ci/profiles/failpoints.toml /tmp/fp-heavy.toml
#   scripts/compare-tiers.sh -c 10m -s 1 -j 2 -o /tmp/cmp a.toml b.toml c.toml d.toml
#
# Each soak goes to DIR/<profile file name without .toml>/ (-o DIR; default ./compare-tiers),
# with its runs and seed records; -j N runs N soaks side by side (default 1: every profile
# alone on the machine; side by side they share its cores, so compare only soaks run alike).
# Below the table, each soak's summary as `shakedown merge` gives it (ops by family among the
# rows), its HTML index in DIR/<name>/merged/.
# The binary is $SHAKEDOWN (default: target/release/shakedown, else target/debug/shakedown,
# under $CARGO_TARGET_DIR when set). Root, like any local-target run. Exit 0 when every soak ran
# (whatever it found), 2 on bad usage, 4 when a soak could not run.
set -euo pipefail
cap=
seed=
jobs=1
out=compare-tiers
usage() { echo "usage: $0 -c CAP -s FIRST-SEED [-j JOBS] [-o DIR] PROFILE.toml..." >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    -c) [ $# -ge 2 ] || usage; cap=$2; shift 2 ;;
    -s) [ $# -ge 2 ] || usage; seed=$2; shift 2 ;;
    -j) [ $# -ge 2 ] || usage; jobs=$2; shift 2 ;;
    -o) [ $# -ge 2 ] || usage; out=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) usage ;;
    *) break ;;
  esac
done
[ -n "$cap" ] && [[ "$seed" =~ ^[0-9]+$ ]] && [[ "$jobs" =~ ^[1-9][0-9]*$ ]] && [ $# -gt 0 ] || usage
names=()
for p in "$@"; do
  [ -f "$p" ] || { echo "$0: no profile file $p" >&2; exit 2; }
  n=$(basename "$p" .toml)
  for m in "${names[@]}"; do [ "$m" != "$n" ] || { echo "$0: two profiles named $n: rename one" >&2; exit 2; }; done
  names+=("$n")
done
here="$(cd "$(dirname "$0")/.." && pwd)"
bin="${SHAKEDOWN:-}"
if [ -z "$bin" ]; then
  for b in "${CARGO_TARGET_DIR:-$here/target}/release/shakedown" "${CARGO_TARGET_DIR:-$here/target}/debug/shakedown"; do
    [ -x "$b" ] && { bin=$b; break; }
  done
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "$0: no shakedown binary (cargo build --release, or set SHAKEDOWN)" >&2; exit 4; }
mkdir -p "$out"

pids=()
# A soak runs in a subshell of its own: the soak itself (its child) is what must hear the signal,
# to tear its stack down.
stop() { for p in "${pids[@]}"; do pkill -TERM -P "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# One soak; a soak that finds a defect exits 1, which is what it is run for.
soak() {
  local profile=$1 dir=$2 code=0
  rm -rf "$dir" && mkdir -p "$dir"
  "$bin" soak --for "$cap" --profile "$profile" --seed "$seed" \
    --runs-dir "$dir/runs" --seeds-dir "$dir/seeds" >"$dir/soak.out" 2>"$dir/soak.err" || code=$?
  echo "$code" >"$dir/exit"
}
i=0
for p in "$@"; do
  soak "$p" "$out/${names[$i]}" &
  pids+=($!)
  i=$((i + 1))
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || true
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || true; done
pids=()

failed=0
for n in "${names[@]}"; do
  code=$(cat "$out/$n/exit")
  if [ "$code" -gt 1 ]; then
    echo "$0: the soak of $n exited $code (see $out/$n/soak.err)" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 4
# Each soak's whole summary (ops by family, failovers, records), beside its directory.
for n in "${names[@]}"; do
  "$bin" merge "$out/$n"/runs/soak-* --out "$out/$n/merged" >"$out/$n/merged.out" 2>&1 || true
done

python3 - "$out" "${names[@]}" <<'EOF'
import glob, json, sys
out, names = sys.argv[1], sys.argv[2:]
print(f"| profile | seeds | steps | hours | failures (per hour) | known defects: reports per hour, seeds, first at |")
print("|---|---|---|---|---|---|")
for n in names:
    lines = []
    for f in glob.glob(f"{out}/{n}/runs/soak-*/soak.jsonl"):
        for l in open(f):
            if l.strip():
                try:
                    lines.append(json.loads(l))
                except ValueError:
                    pass
    if not lines:
        print(f"| {n} | 0 | 0 | 0 | no seed ended | |")
        continue
    hours = max(l["elapsed_s"] for l in lines) / 3600
    steps = sum(l["steps"] for l in lines)
    fails = {}
    known = {}
    for l in sorted(lines, key=lambda l: l["elapsed_s"]):
        v = l["verdict"]
        if v.startswith("FAIL "):
            what = v[5:].split(" at step ")[0]
            fails[what] = fails.get(what, 0) + 1
        for d, k in l.get("known_defects", {}).items():
            e = known.setdefault(d, [0, 0, l["elapsed_s"]])
            e[0] += k
            e[1] += 1
    f = " · ".join(f"{w} {c} ({c / hours:.1f})" for w, c in sorted(fails.items())) or "none"
    k = " · ".join(f"{d} {c / hours:.1f}/h, {s} seed(s), first at {t:.0f} s" for d, (c, s, t) in sorted(known.items())) or "none"
    print(f"| {n} | {len(lines)} | {steps} | {hours:.2f} | {f} | {k} |")
for n in names:
    print(f"\n{n} ({out}/{n}/merged.out):")
    for l in open(f"{out}/{n}/merged.out"):
        if l.startswith("  ") and not l.lstrip().startswith(("soaks", "reports")):
            print(l.rstrip())
EOF
