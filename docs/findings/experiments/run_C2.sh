#!/bin/bash
# Experiment C (extra): DEFAULT (freeze+flush) shutdown flag on 3.4.23, after run_C.sh finishes.
set -u
cd "$(dirname "$0")"
while kill -0 "$1" 2>/dev/null; do sleep 2; done
COMMON="--writers 12 --load-s 1.0 --post-s 1.0 --down-s 0.3 --faults-per-check 5 --rebuild-every 10 --cycles 100000"
nice -n 5 python3 crashloop.py --etcd /usr/bin/etcd --fault detach --shutdown-flag default $COMMON --max-minutes ${2:-6} --tag C-default-3.4.23
