#!/bin/bash
# Which invariant names the planted endpoint-no-health-check (a paused member left in HAProxy's
# rotation) first: seed 3, 9 steps, the default profile named "quick" with converge = "5s" and
# op = "20s" in /tmp/exp/quick.toml (as tests/local_target.rs's quick_profile). Run as root:
#   probe-rounds.sh BINARY LABEL RUNS
# probe-rounds.log: the binary before (old, 3 of 8 named durability: the read-back drew the
# paused member, the probes did not) and after (new, 8 of 8 reachability) probing in rounds.
for i in $(seq 1 $3); do
  out=$($1 run --seed 3 --steps 9 --profile /tmp/exp/quick.toml --testbed-bug endpoint-no-health-check --runs-dir /tmp/exp/runs-$2 --seeds-dir /tmp/exp/seeds-$2 2>/dev/null | grep '^FAIL\|^PASS' | head -1)
  echo "$2 $i: $(echo "$out" | grep -o 'invariant [a-z]* violated at step [0-9]*\|^PASS')"
done
