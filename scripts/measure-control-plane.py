#!/usr/bin/env python3
"""The control-plane stack's figures (issue 13's targets), measured on this machine.

Runs `shakedown run --profile control-plane --count N` (N seeds in turn, each a fresh stack),
samples the RSS of the stack's processes every second while they run, and reads every run's
event log and API workload samples:

- bring-up (stack up, apiservers ready, API namespace created) and teardown: medians over runs;
- the checks after each step (observe + judge, the check event's last attempt): median and p90;
- acknowledged API writes per second over each whole run (fault windows included, so a lower
  bound of the healthy rate);
- the stack's memory: the peak of the summed RSS of its processes (etcd, kube-apiserver, HAProxy).

Usage (root, after ./scripts/install-deps.sh and cargo build --release):
    python3 scripts/measure-control-plane.py [--bin target/release/shakedown] [--runs 3] [--steps 6]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def rss_of(marker):
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
            if marker not in cmd or "measure-control-plane" in cmd or "shakedown\0run" in cmd:
                continue
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("SHAKEDOWN_BIN", "target/release/shakedown"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seed", type=int, default=8)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shakedown-cp-")
    runs_dir = os.path.join(work, "runs")
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_of(runs_dir))
            time.sleep(1)

    t = threading.Thread(target=sample)
    t.start()
    cmd = [a.bin, "run", "--profile", "control-plane", "--seed", str(a.seed), "--count", str(a.runs), "--steps", str(a.steps),
           "--runs-dir", runs_dir, "--seeds-dir", os.path.join(work, "seeds")]
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    done.set()
    t.join()
    up, down, checks, rates = [], [], [], []
    for run in sorted(os.listdir(runs_dir)):
        ev = os.path.join(runs_dir, run, "events.jsonl")
        if not os.path.exists(ev):
            continue
        first_op_ms = None
        start_ms = None
        for line in open(ev):
            try:
                e = json.loads(line)
            except ValueError:
                continue
            kind = e.get("event")
            if kind == "bring-up":
                up.append(e["ms"])
            elif kind == "teardown":
                down.append(e["ms"])
            elif kind == "check" and e.get("step", 0) > 0 and e.get("last_ms") is not None:
                checks.append(e["last_ms"])
            elif kind == "op-start" and first_op_ms is None:
                first_op_ms = e.get("ts_ms")
            elif kind == "run-start":
                start_ms = e.get("ts_ms")
        samples = os.path.join(runs_dir, run, "api-workload.csv")
        if os.path.exists(samples):
            rows = [r.split(",") for r in open(samples).read().splitlines()[1:] if r]
            ok = [int(r[0]) for r in rows if len(r) > 2 and r[2] == "1"]
            if len(ok) > 10:
                span = (max(ok) - min(ok)) / 1000.0
                if span > 0:
                    rates.append(len(ok) / span)
    q = lambda v, p: sorted(v)[min(len(v) - 1, int(round((len(v) - 1) * p)))] if v else float("nan")
    print(f"runs: {len(up)} (exit {rc}), {a.steps} steps each, seed {a.seed}…; directory {work}")
    print(f"bring-up   median {statistics.median(up) if up else float('nan'):.0f} ms ({min(up, default=0)}–{max(up, default=0)})   target ≤ 10 s")
    print(f"teardown   median {statistics.median(down) if down else float('nan'):.0f} ms ({min(down, default=0)}–{max(down, default=0)})   target ≤ 2 s")
    print(f"checks     median {statistics.median(checks) if checks else float('nan'):.0f} ms, p90 {q(checks, 0.9)} ms over {len(checks)} steps   target ≤ 100 ms median")
    print(f"API writes median {statistics.median(rates) if rates else float('nan'):.0f} acknowledged/s over whole runs (fault windows included: a lower bound)   target ≥ 200/s on a healthy stack")
    print(f"memory     peak {peak[0] / 2**20:.0f} MiB (RSS of the stack's processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
