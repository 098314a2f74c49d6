#!/usr/bin/env python3
"""Does ext4 FS_IOC_SHUTDOWN(NOLOGFLUSH) + umount + e2fsck -p + mount lose data that fdatasync()
had acknowledged?  No etcd involved.

A writer appends 4 KiB records (sequence number + pattern) to a file, like etcd's WAL: preallocated
with fallocate (mode 0, unwritten extents) or plain appends. After each record it calls
fdatasync() and records the highest acknowledged sequence number. After --run-s seconds the fs is
shut down with NOLOGFLUSH, unmounted, e2fsck -p is run (unless --no-fsck), the fs is mounted again,
and the file is read back. Any acknowledged record that is missing or zeroed counts as LOST.

Usage: fsync_detach_test.py [--trials N] [--prealloc|--append] [--no-fsck]
Creates and removes its own loop device under ./run/fsynctest (beside this script).
"""
import argparse, fcntl, os, subprocess, threading, time, shutil, struct

ap = argparse.ArgumentParser()
ap.add_argument("--trials", type=int, default=10)
ap.add_argument("--mode", choices=["prealloc", "append"], default="prealloc")
ap.add_argument("--no-fsck", action="store_true")
ap.add_argument("--run-s", type=float, default=1.5)
ap.add_argument("--recsize", type=int, default=4096, help="bytes per record (etcd WAL records are small, e.g. 200)")
args = ap.parse_args()

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run", "fsynctest")
IMG = os.path.join(RUN, "d.img"); MNT = os.path.join(RUN, "mnt")
REC = args.recsize


def sh(*c, check=True):
    r = subprocess.run(c, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{c}: {r.returncode} {r.stderr}")
    return r


dev = None
mounted = False
try:
    os.makedirs(MNT, exist_ok=True)
    with open(IMG, "wb") as f:
        f.truncate(256 << 20)
    dev = sh("losetup", "-f", "--show", IMG).stdout.strip()
    sh("mkfs.ext4", "-q", "-F", dev)
    lost_trials = 0
    for t in range(args.trials):
        sh("mount", dev, MNT); mounted = True
        path = os.path.join(MNT, f"wal{t}")
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        if args.mode == "prealloc":
            os.posix_fallocate(fd, 0, 64 << 20)  # like etcd's WAL segment preallocation
        acked = [-1]; stop = threading.Event(); err = [None]

        def writer():
            seq = 0
            try:
                while not stop.is_set() and (seq + 1) * REC <= (60 << 20):
                    buf = struct.pack("<Q", seq + 1) + bytes([seq % 251 + 1]) * (REC - 8)
                    os.pwrite(fd, buf, seq * REC)
                    os.fdatasync(fd)
                    acked[0] = seq
                    seq += 1
            except OSError as e:
                err[0] = e
        th = threading.Thread(target=writer); th.start()
        time.sleep(args.run_s)
        dfd = os.open(MNT, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.ioctl(dfd, 0x8004587D, (2).to_bytes(4, "little"))  # FS_IOC_SHUTDOWN, NOLOGFLUSH
        os.close(dfd)
        ack_at_shutdown = acked[0]
        stop.set(); th.join()
        try:
            os.close(fd)
        except OSError:
            pass
        sh("umount", MNT); mounted = False
        fsck = "skipped"
        if not args.no_fsck:
            r = sh("e2fsck", "-p", dev, check=False); fsck = f"rc={r.returncode}"
        sh("mount", dev, MNT); mounted = True
        with open(path, "rb") as f:
            data = f.read()
        good = 0
        for s in range(ack_at_shutdown + 1):
            rec = data[s * REC:(s + 1) * REC]
            if len(rec) == REC and struct.unpack("<Q", rec[:8])[0] == s + 1:
                good += 1
        first_bad = next((s for s in range(ack_at_shutdown + 1)
                          if not (len(data[s*REC:(s+1)*REC]) == REC and
                                  struct.unpack("<Q", data[s*REC:s*REC+8])[0] == s + 1)), None)
        lost = (ack_at_shutdown + 1) - good
        if lost:
            lost_trials += 1
        print(f"trial {t}: mode={args.mode} fsck={fsck} acked_records={ack_at_shutdown+1} "
              f"intact={good} LOST={lost} first_bad={first_bad} writer_err={err[0]!r}", flush=True)
        os.unlink(path)
        sh("umount", MNT); mounted = False
    print(f"RESULT mode={args.mode} fsck={'no' if args.no_fsck else 'e2fsck -p'}: "
          f"{lost_trials} of {args.trials} trials lost fdatasync-acknowledged records", flush=True)
finally:
    if mounted:
        sh("umount", MNT, check=False)
    if dev:
        sh("losetup", "-d", dev, check=False)
    shutil.rmtree(RUN, ignore_errors=True)
