#!/usr/bin/env python3
"""Crash-loop divergence test for a 3-member etcd cluster.

Each cycle: run a put load (unique keys) for --load-s seconds, inject a fault on a
random member (kill -9, or ext4 FS_IOC_SHUTDOWN NOLOGFLUSH "disk detach" followed by
kill -9 / umount / e2fsck -p / mount), restart it on its own data, run load again,
then stop the load, wait until all members report the same raft index and applied
index, and compare revision, HashKV(rev=min revision) and key count across members.

A divergence (same raft index, different revision/hash/count) is counted, logged,
and the cluster is rebuilt from scratch so that the next cycles count new events.

Only uses 127.250.0.0/16 and ports 23000-23999; creates its own loop devices and
removes them (and kills its etcd processes, unmounts) on exit, including on errors.

Usage: crashloop.py --etcd BIN --fault kill|detach --cycles N [--disk loop|dir]
"""
import argparse, base64, http.client, json, os, random, signal, subprocess, sys
import threading, time, fcntl, shutil

HERE = os.path.dirname(os.path.abspath(__file__))
ETCDCTL = os.path.join(HERE, "bin", "etcdctl-3.5.16")
IPS = ["127.250.0.1", "127.250.0.2", "127.250.0.3"]
FS_IOC_SHUTDOWN = 0x8004587D
FS_GOING_FLAGS_NOLOGFLUSH = 2
FS_GOING_FLAGS = {"default": 0, "logflush": 1, "nologflush": 2}

ap = argparse.ArgumentParser()
ap.add_argument("--etcd", required=True)
ap.add_argument("--fault", choices=["kill", "detach"], default="kill")
ap.add_argument("--shutdown-flag", choices=sorted(FS_GOING_FLAGS), default="nologflush",
                help="FS_IOC_SHUTDOWN flag for --fault detach: default=0 (freeze+flush), logflush=1, nologflush=2")
ap.add_argument("--cycles", type=int, default=20)
ap.add_argument("--disk", choices=["loop", "dir"], default="loop")
ap.add_argument("--writers", type=int, default=6, help="writer threads (unthrottled)")
ap.add_argument("--load-s", type=float, default=3.0, help="load seconds before the fault")
ap.add_argument("--post-s", type=float, default=2.0, help="load seconds after restart")
ap.add_argument("--down-s", type=float, default=0.5, help="seconds the member stays down")
ap.add_argument("--port-base", type=int, default=23000)
ap.add_argument("--heartbeat", type=int, default=50)
ap.add_argument("--election", type=int, default=500)
ap.add_argument("--tag", default=None)
ap.add_argument("--seed", type=int, default=None)
ap.add_argument("--max-minutes", type=float, default=1e9)
ap.add_argument("--faults-per-check", type=int, default=1,
                help="faults (each: fault one member, restart it, wait healthy) between two consistency checks")
ap.add_argument("--rebuild-every", type=int, default=25,
                help="rebuild a fresh cluster after this many checks (keeps the db small so HashKV stays fast)")
args = ap.parse_args()
if args.fault == "detach" and args.disk != "loop":
    sys.exit("detach needs --disk loop")

tag = args.tag or f"{os.path.basename(args.etcd)}-{args.fault}-{args.disk}"
RUN = os.path.join(HERE, "run", tag)
LOG = os.path.join(HERE, "results", tag + ".log")
os.makedirs(os.path.dirname(LOG), exist_ok=True)
logf = open(LOG, "a")
rng = random.Random(args.seed)


def log(*a):
    s = time.strftime("%H:%M:%S ") + " ".join(str(x) for x in a)
    print(s, flush=True)
    logf.write(s + "\n"); logf.flush()


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{cmd}: rc={r.returncode} {r.stderr.strip()}")
    return r


def cport(i): return args.port_base + 1 + i
def pport(i): return args.port_base + 101 + i
def curl_(i): return f"http://{IPS[i]}:{cport(i)}"
def purl(i): return f"http://{IPS[i]}:{pport(i)}"

CLUSTER = ",".join(f"m{i}={purl(i)}" for i in range(3))

# ---------------------------------------------------------------- disks
loopdevs = {}   # i -> /dev/loopN we created
mounted = set()
procs = {}      # i -> Popen


def mnt(i): return os.path.join(RUN, f"m{i}")
def img(i): return os.path.join(RUN, f"m{i}.img")
def datadir(i): return os.path.join(mnt(i), "data")


def disk_create(i):
    os.makedirs(mnt(i), exist_ok=True)
    if args.disk == "dir":
        return
    with open(img(i), "wb") as f:
        f.truncate(768 << 20)
    dev = sh("losetup", "-f", "--show", img(i)).stdout.strip()
    loopdevs[i] = dev
    sh("mkfs.ext4", "-q", "-F", dev)
    disk_mount(i)


def disk_mount(i):
    sh("mount", "-t", "ext4", loopdevs[i], mnt(i))
    mounted.add(i)


def disk_umount(i):
    if i in mounted:
        for _ in range(50):
            if sh("umount", mnt(i), check=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            sh("umount", "-l", mnt(i), check=False)
        mounted.discard(i)


def disk_destroy(i):
    disk_umount(i)
    if i in loopdevs:
        sh("losetup", "-d", loopdevs.pop(i), check=False)
    if os.path.exists(img(i)):
        os.unlink(img(i))
    shutil.rmtree(mnt(i), ignore_errors=True)


def wal_frag(i):
    """filefrag -v of the member's WAL files (extent map incl. 'unwritten' flags), as text."""
    out = []
    try:
        wd = os.path.join(datadir(i), "member", "wal")
        for n in sorted(os.listdir(wd)):
            pth = os.path.join(wd, n)
            out.append(f"## {n} size={os.path.getsize(pth)}")
            out.append(sh("filefrag", "-v", "-b4096", pth, check=False).stdout)
    except Exception as e:
        out.append(f"wal_frag error {e!r}")
    return "\n".join(out)


def raw_after_repair(i, before):
    """For the repaired (truncated) tail WAL file: look up, in the extent map taken BEFORE restart, the
    blocks just after the repaired size, and read them raw from the loop device (O_DIRECT)."""
    import re
    lines = []
    try:
        wd = os.path.join(datadir(i), "member", "wal")
        wals = sorted(n for n in os.listdir(wd) if n.endswith(".wal"))
        name = wals[-1]
        size = os.path.getsize(os.path.join(wd, name))
        sec = before.split(f"## {name} ")[1]
        ext = []
        for ln in sec.split("\n"):
            m = re.match(r"^\s*\d+:\s*(\d+)\.\.\s*(\d+):\s*(\d+)\.\.\s*(\d+):\s*(\d+):(.*)$", ln)
            if m:
                ext.append((int(m[1]), int(m[2]), int(m[3]), "unwritten" in m[6]))
        lb0 = size // 4096
        lines.append(f"{name}: repaired size={size} (block {lb0} off {size % 4096})")
        for lb in range(lb0, lb0 + 4):
            for (a, b, p0, unw) in ext:
                if a <= lb <= b:
                    pb = p0 + (lb - a)
                    r = subprocess.run(["dd", f"if={loopdevs[i]}", "bs=4096", f"skip={pb}", "count=1",
                                        "iflag=direct", "status=none"], capture_output=True)
                    d = r.stdout
                    nz = sum(1 for x in d if x)
                    with open(LOG + f".raw-m{i}-lb{lb}", "wb") as f:
                        f.write(d)
                    lines.append(f"  logical block {lb} -> physical {pb} extent_unwritten={unw} "
                                 f"raw_nonzero_bytes={nz}/{len(d)}")
                    break
            else:
                lines.append(f"  logical block {lb}: not mapped before restart")
    except Exception as e:
        lines.append(f"raw_after_repair error {e!r}")
    return "\n".join(lines)


def detach(i):
    fd = os.open(mnt(i), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_SHUTDOWN, FS_GOING_FLAGS[args.shutdown_flag].to_bytes(4, "little"))
    finally:
        os.close(fd)

# ---------------------------------------------------------------- etcd


def spawn(i, state):
    os.makedirs(datadir(i), exist_ok=True)
    errf = open(os.path.join(RUN, f"m{i}.log"), "ab")
    cmd = [args.etcd, "--name", f"m{i}", "--data-dir", datadir(i),
           "--listen-client-urls", curl_(i), "--advertise-client-urls", curl_(i),
           "--listen-peer-urls", purl(i), "--initial-advertise-peer-urls", purl(i),
           "--initial-cluster", CLUSTER, "--initial-cluster-state", state,
           "--initial-cluster-token", "stale-" + tag,
           "--heartbeat-interval", str(args.heartbeat), "--election-timeout", str(args.election),
           "--logger", "zap", "--log-outputs", "stderr"]
    procs[i] = subprocess.Popen(cmd, stdout=errf, stderr=errf, start_new_session=True)


def kill9(i):
    p = procs.pop(i, None)
    if p is not None:
        try:
            p.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def call(i, path, body, timeout=2.0):
    c = http.client.HTTPConnection(IPS[i], cport(i), timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{path} {r.status} {data[:200]!r}")
        return json.loads(data)
    finally:
        c.close()


def status(i):
    s = call(i, "/v3/maintenance/status", {})
    return dict(raft_index=int(s.get("raftIndex", 0)), applied=int(s.get("raftAppliedIndex", 0)),
                rev=int(s["header"].get("revision", 0)), leader=s.get("leader"),
                member=s["header"].get("member_id"), term=int(s.get("raftTerm", 0)))


def hashkv(i, rev):
    # HashKV is not exposed by the grpc-gateway: use etcdctl (3.5.16 client; HashKV RPC exists since 3.3)
    r = sh(ETCDCTL, "--endpoints", curl_(i), "--command-timeout", "60s", "endpoint", "hashkv",
           "--rev", str(rev), "-w", "json")
    j = json.loads(r.stdout)[0]["HashKV"]
    return int(j.get("hash", 0)), int(j.get("compact_revision", 0))


def b64(s): return base64.b64encode(s.encode()).decode()

PREFIX = "k/"


def count_keys(i):
    r = call(i, "/v3/kv/range", {"key": b64(PREFIX), "range_end": b64("k0"),
                                 "count_only": True, "serializable": True}, timeout=10)
    return int(r.get("count", 0))


def wait_healthy(timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        ok = 0
        for i in range(3):
            try:
                s = status(i)
                if s["leader"] and s["leader"] != "0":
                    ok += 1
            except Exception:
                pass
        if ok == 3:
            try:  # quorum write works
                call(rng.randrange(3), "/v3/kv/put", {"key": b64("probe"), "value": b64("x")})
                return True
            except Exception:
                pass
        time.sleep(0.2)
    return False

# ---------------------------------------------------------------- load
load_on = threading.Event()
stop_all = threading.Event()
acked = [0]
ack_lock = threading.Lock()


def writer(wid):
    seq = 0
    conn = None
    target = wid % 3
    while not stop_all.is_set():
        if not load_on.is_set():
            if conn: conn.close(); conn = None
            load_on.wait(0.2)
            continue
        try:
            if conn is None:
                conn = http.client.HTTPConnection(IPS[target], cport(target), timeout=2)
            key = f"{PREFIX}{wid:02d}/{time.time_ns()}/{seq}"
            conn.request("POST", "/v3/kv/put", json.dumps({"key": b64(key), "value": b64("v" * 64)}),
                         {"Content-Type": "application/json"})
            r = conn.getresponse(); r.read()
            if r.status == 200:
                seq += 1
                with ack_lock:
                    acked[0] += 1
            else:
                raise RuntimeError(r.status)
        except Exception:
            if conn: conn.close(); conn = None
            target = rng.randrange(3)
            time.sleep(0.05)

# ---------------------------------------------------------------- main


def build_cluster():
    for i in range(3):
        kill9(i); disk_destroy(i)
    shutil.rmtree(RUN, ignore_errors=True)
    os.makedirs(RUN, exist_ok=True)
    for i in range(3):
        disk_create(i)
    for i in range(3):
        spawn(i, "new")
    if not wait_healthy(60):
        raise RuntimeError("cluster did not become healthy")


def teardown():
    load_on.clear(); stop_all.set()
    for i in list(procs):
        kill9(i)
    for i in range(3):
        disk_destroy(i)


def check():
    """Stop load; wait for equal raft index; compare. Returns (verdict, details)."""
    load_on.clear()
    time.sleep(0.3)
    t0 = time.time(); sts = None
    while time.time() - t0 < 30:
        try:
            sts = [status(i) for i in range(3)]
            ri = {s["raft_index"] for s in sts}; ai = {s["applied"] for s in sts}
            if len(ri) == 1 and len(ai) == 1 and sts[0]["raft_index"] == sts[0]["applied"]:
                break
        except Exception:
            sts = None
        time.sleep(0.2)
    else:
        return "noconverge", sts
    revs = [s["rev"] for s in sts]
    r = min(revs)
    hs = [hashkv(i, r)[0] for i in range(3)]
    cnt = [count_keys(i) for i in range(3)]
    d = dict(raft_index=sts[0]["raft_index"], revs=revs, hash_at=r, hashes=hs, counts=cnt)
    if len(set(revs)) > 1 or len(set(hs)) > 1 or len(set(cnt)) > 1:
        try:  # diagnostic: which acknowledged keys are missing where
            sets = []
            for i in range(3):
                r = call(i, "/v3/kv/range", {"key": b64(PREFIX), "range_end": b64("k0"), "keys_only": True,
                                             "serializable": True}, timeout=30)
                sets.append({base64.b64decode(kv["key"]).decode(): int(kv.get("mod_revision", 0))
                             for kv in r.get("kvs", [])})
            allk = set().union(*[set(x) for x in sets])
            d["missing"] = {f"m{i}": sorted(((k, max(x.get(k, 0) for x in sets)) for k in allk - set(sets[i])),
                                           key=lambda t: t[1])[:5] for i in range(3)}
        except Exception as e:
            d["missing"] = repr(e)[:200]
        return "DIVERGED", d
    return "ok", d


def main():
    log(f"=== start tag={tag} etcd={args.etcd} fault={args.fault} shutdown_flag={args.shutdown_flag} disk={args.disk} "
        f"cycles={args.cycles} writers={args.writers} load={args.load_s}+{args.post_s}s "
        f"down={args.down_s}s hb/el={args.heartbeat}/{args.election} "
        f"faults/check={args.faults_per_check} rebuild_every={args.rebuild_every}")
    log(sh(args.etcd, "--version").stdout.splitlines()[0])
    ths = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(args.writers)]
    for t in ths: t.start()
    build_cluster()
    res = dict(ok=0, DIVERGED=0, noconverge=0, restart_failed=0, rebuilds=0)
    t_start = time.time()
    cyc = 0
    faults = 0
    checks_since_build = 0
    for cyc in range(1, args.cycles + 1):
        if time.time() - t_start > args.max_minutes * 60:
            log("time budget reached"); cyc -= 1; break
        a0 = acked[0]; tl = time.time()
        load_on.set()
        victims = []
        failed = None
        for f in range(args.faults_per_check):
            time.sleep(args.load_s * rng.uniform(0.6, 1.4))
            v = rng.randrange(3)
            try:
                st = status(v); was_leader = st["leader"] == st["member"]
            except Exception:
                was_leader = None
            if args.fault == "kill":
                kill9(v)
            else:
                detach(v)
                time.sleep(0.2)
                kill9(v)
            faults += 1
            time.sleep(args.down_s)
            if args.fault == "detach":
                disk_umount(v)
                r = sh("e2fsck", "-p", loopdevs[v], check=False)
                if r.returncode not in (0, 1):
                    log(f"  e2fsck rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()}")
                else:
                    log(f"  e2fsck m{v} rc={r.returncode} " + " | ".join((r.stdout + r.stderr).split("\n")).strip(" |"))
                disk_mount(v)
                frag_before = wal_frag(v)
            spawn(v, "existing")
            ok = wait_healthy(30)
            victims.append(f"m{v}{'L' if was_leader else ''}")
            if not ok or procs[v].poll() is not None:
                failed = v; break
        time.sleep(args.post_s)
        rate = (acked[0] - a0) / max(time.time() - tl, 1e-9)
        if failed is not None:
            v = failed
            res["restart_failed"] += 1
            why = ""
            try:
                txt = open(os.path.join(RUN, f"m{v}.log"), errors="replace").read()
                for k in ("repaired WAL", "tocommit(", "failed to"):
                    j = txt.rfind(k)
                    if j >= 0:
                        why += " [" + txt[j:j + 90].split("\n")[0] + "]"
            except Exception:
                pass
            log(f"check {cyc}: victims {victims} RESTART FAILED m{v} rc={procs[v].poll()}{why}")
            if args.fault == "detach":
                try:
                    fb = os.path.join(HERE, "results", "failed", f"{tag}-c{cyc}-m{v}")
                    os.makedirs(os.path.dirname(fb), exist_ok=True)
                    open(fb + ".frag-before-restart", "w").write(frag_before)
                    open(fb + ".frag-after-repair", "w").write(wal_frag(v))
                    ra = raw_after_repair(v, frag_before)
                    for ln in ra.split("\n"):
                        log("  " + ln)
                except Exception as e:
                    log("  frag dump error", repr(e))
            try:
                os.makedirs(os.path.join(HERE, "results", "failed"), exist_ok=True)
                shutil.copy(os.path.join(RUN, f"m{v}.log"),
                            os.path.join(HERE, "results", "failed", f"{tag}-c{cyc}-m{v}.log"))
            except Exception:
                pass
            load_on.clear(); build_cluster(); res["rebuilds"] += 1; checks_since_build = 0
            continue
        try:
            verdict, d = check()
        except Exception as e:
            verdict, d = "checkerror", repr(e)[:300]
        res[verdict] = res.get(verdict, 0) + 1
        log(f"check {cyc}: victims {victims} puts/s={rate:.0f} -> {verdict} {d}")
        checks_since_build += 1
        if verdict != "ok":
            os.makedirs(os.path.join(HERE, "results", "diverged"), exist_ok=True)
            for i in range(3):
                try:
                    shutil.copy(os.path.join(RUN, f"m{i}.log"),
                                os.path.join(HERE, "results", "diverged", f"{tag}-c{cyc}-m{i}.log"))
                except Exception:
                    pass
        if verdict != "ok" or checks_since_build >= args.rebuild_every:
            build_cluster(); res["rebuilds"] += 1; checks_since_build = 0
    log(f"=== RESULT tag={tag} checks={cyc} faults={faults} diverged={res['DIVERGED']} ok={res['ok']} "
        f"noconverge={res['noconverge']} restart_failed={res['restart_failed']} "
        f"checkerror={res.get('checkerror', 0)} rebuilds={res['rebuilds']} "
        f"total_acked_puts={acked[0]} minutes={(time.time()-t_start)/60:.1f}")


if __name__ == "__main__":
    def _sig(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _sig)
    try:
        main()
    except KeyboardInterrupt:
        log("interrupted")
    except Exception as e:
        log("ERROR", repr(e))
        raise
    finally:
        teardown()
        shutil.rmtree(RUN, ignore_errors=True)
        log("cleaned up")
