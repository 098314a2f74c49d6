#!/bin/sh
# In-cluster entrypoint. `seeds`: the seeds of this pod of the Indexed Job (JOB_COMPLETION_INDEX);
# `soak-kube DURATION`: seed after seed until DURATION is up. Every failure leaves a seed record
# in $SHAKEDOWN_SEEDS_DIR and the pod's log ends with the replay command.
set -eu
: "${SHAKEDOWN_CLUSTER:?set SHAKEDOWN_CLUSTER=NAMESPACE/NAME}"
export SHAKEDOWN_SEEDS_DIR="${SHAKEDOWN_SEEDS_DIR:-/var/lib/shakedown/seeds}" SHAKEDOWN_RUNS_DIR="${SHAKEDOWN_RUNS_DIR:-/var/lib/shakedown/runs}"
kp=""; [ -f /etc/shakedown/kube-profile.toml ] && kp="--kube-profile /etc/shakedown/kube-profile.toml"
run() { shakedown run --target kube --cluster "$SHAKEDOWN_CLUSTER" --profile "${SHAKEDOWN_PROFILE:-nightly}" $kp --seed "$1"; }
rc=0
case "${1:-seeds}" in
  seeds)
    i="${JOB_COMPLETION_INDEX:?not an Indexed Job pod}"; n="${SEEDS_PER_POD:-4}"; base="${SEED_BASE:-0}"
    s=$((base + i * n)); end=$((s + n))
    while [ "$s" -lt "$end" ]; do run "$s" || rc=1; s=$((s + 1)); done ;;
  soak-kube)
    end=$(( $(date +%s) + $(echo "${2:-8h}" | sed 's/h$/*3600/; s/m$/*60/' | bc) ))
    while [ "$(date +%s)" -lt "$end" ]; do run "$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')" || rc=1; done ;;
  *) exec shakedown "$@" ;;
esac
exit $rc
