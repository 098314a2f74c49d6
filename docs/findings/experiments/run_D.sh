#!/bin/bash
# Experiment D: run 2 (DEFAULT on 3.4.23 again), started when run 1 (pid $1) exits.
set -u
cd "$(dirname "$0")"
while kill -0 "$1" 2>/dev/null; do sleep 1; done
COMMON="--writers 12 --load-s 1.0 --post-s 1.0 --down-s 0.3 --faults-per-check 5 --rebuild-every 10 --cycles 100000"
nice -n 5 python3 crashloop.py --etcd /usr/bin/etcd --fault detach --shutdown-flag default $COMMON --max-minutes ${2:-12} --tag D-default-3.4.23b
