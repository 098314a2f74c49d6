#!/bin/bash
# Experiment C: disk detach with different FS_IOC_SHUTDOWN flags, one 3-member cluster at a time.
set -u
cd "$(dirname "$0")"
E3423=/usr/bin/etcd
E3516=$PWD/bin/etcd-3.5.16
M=${1:-8}
COMMON="--writers 12 --load-s 1.0 --post-s 1.0 --down-s 0.3 --faults-per-check 5 --rebuild-every 10 --cycles 100000"
nice -n 5 python3 crashloop.py --etcd $E3423 --fault detach --shutdown-flag logflush   $COMMON --max-minutes $M --tag C-logflush-3.4.23
nice -n 5 python3 crashloop.py --etcd $E3516 --fault detach --shutdown-flag logflush   $COMMON --max-minutes $M --tag C-logflush-3.5.16
nice -n 5 python3 crashloop.py --etcd $E3423 --fault detach --shutdown-flag nologflush $COMMON --max-minutes $M --tag C-nologflush-3.4.23
