#!/usr/bin/env bash
# Fresh clone to the README's first PASS, timed step by step (docs/development.md): clone, the
# README's install step, `cargo build --profile quick` with an empty CARGO_HOME and target
# directory, the README's first run. Run it on a machine without the local target's packages to
# measure what a new user waits for. CLONE_FROM (default: this checkout) is the repository cloned;
# the clone and its cargo home are made in a temporary directory and removed at the end.
set -euo pipefail
from="${CLONE_FROM:-$(cd "$(dirname "$0")/.." && pwd)}"
work="$(mktemp -d /tmp/shakedown-first-pass.XXXXXX)"
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
t0=$(now)
git clone -q "$from" "$work/clone"
cd "$work/clone"
./scripts/install-deps.sh
t1=$(now)
CARGO_HOME="$work/cargo" cargo build --profile quick 2>&1 | tail -1
t2=$(now)
CARGO_HOME="$work/cargo" cargo run -q --profile quick -- run --seed 1 --steps 20 | tail -4
t3=$(now)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" \
  'BEGIN { printf "install %.0f s; build %.0f s; run %.0f s; fresh clone to PASS %.0f s\n", b-a, c-b, d-c, d-a }'
