//! Removing a node and proving it is gone: [`sweep`] (teardown, `node down`, `reap` after a
//! `kill -9`) works from the node directory and what the machine shows (/proc, cgroupfs,
//! `ip link`, nftables), never from a running shakedown's bookkeeping; [`leftovers`] lists what
//! of the node is still on the machine.
//!
//! The node's network (bridge, address, pods' veths, nftables table, network sysctls) lives in a
//! network namespace its holder process made, and the pods' namespaces hang off it: once every
//! process of the node is gone, so is all of it, with nothing to delete. What `leftovers` checks
//! in the host's namespace (a link named like the node's bridge, a table named like its) is the
//! proof that the host's was not used.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::layout::Layout;
use super::{HostRecord, NodeError, POLL, TEARDOWN_BOUND};
use crate::command::{run, run_bounded, COMMAND_BOUND};

/// What of a node is still on the machine.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Leftovers {
    pub processes: Vec<(i32, String)>,
    pub cgroups: Vec<PathBuf>,
    /// Links of the node's names in the host's network namespace (a node never makes any).
    pub links: Vec<String>,
    /// A table of the node's name in the host's ruleset (a node never makes one).
    pub nft_table: bool,
    pub mounts: Vec<String>,
    pub sysctls: Vec<String>,
    pub host_dirs: Vec<PathBuf>,
    /// Loop devices (the machine's, not a namespace's) backed by a file in the node's directory:
    /// a privileged pod's (the soak farm's local stack) that was killed before it detached them.
    pub loops: Vec<String>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty()
            && self.cgroups.is_empty()
            && self.links.is_empty()
            && !self.nft_table
            && self.mounts.is_empty()
            && self.sysctls.is_empty()
            && self.host_dirs.is_empty()
            && self.loops.is_empty()
    }
}

impl fmt::Display for Leftovers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return write!(f, "nothing");
        }
        let mut parts = vec![];
        if !self.processes.is_empty() {
            parts.push(format!("processes {:?}", self.processes));
        }
        if !self.cgroups.is_empty() {
            parts.push(format!("cgroups {:?}", self.cgroups));
        }
        if !self.links.is_empty() {
            parts.push(format!("links {:?}", self.links));
        }
        if self.nft_table {
            parts.push("an nftables table in the host's ruleset".into());
        }
        if !self.mounts.is_empty() {
            parts.push(format!("mounts {:?}", self.mounts));
        }
        if !self.sysctls.is_empty() {
            parts.push(format!("sysctls {:?}", self.sysctls));
        }
        if !self.host_dirs.is_empty() {
            parts.push(format!("host directories {:?}", self.host_dirs));
        }
        if !self.loops.is_empty() {
            parts.push(format!("loop devices {:?}", self.loops));
        }
        write!(f, "{}", parts.join("; "))
    }
}

/// The cgroup hierarchies of this machine: every v1 controller's root and the unified one.
pub fn hierarchies() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return vec![];
    };
    let mut out: Vec<PathBuf> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The node's cgroup directories in every hierarchy, deepest first.
fn cgroup_dirs(l: &Layout) -> Vec<PathBuf> {
    let mut dirs = vec![];
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(d.to_path_buf());
    }
    for h in hierarchies() {
        let root = h.join(&l.cgroup_root);
        if root.is_dir() {
            walk(&root, &mut dirs);
        }
    }
    dirs
}

/// Every process of the node: by the node directory on its command line (the components, the
/// holder, containerd's shims) and by the node's cgroup (the pods' processes).
pub fn processes(l: &Layout) -> Vec<(i32, String)> {
    let mut pids: BTreeSet<i32> = crate::procs::processes_of(&l.dir).into_iter().map(|(p, _)| p).collect();
    for d in cgroup_dirs(l) {
        if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
            pids.extend(procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()));
        }
    }
    pids.into_iter()
        .filter(|p| *p != std::process::id() as i32)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&raw).replace('\0', " ").trim().to_string()))
        })
        .collect()
}

fn kill_all(procs: &[(i32, String)]) {
    for (pid, _) in procs {
        // SAFETY: plain kill(2) on a pid just found; SIGKILL also ends stopped processes.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
}

/// The links attached to the node's bridge (the pods' host-side veths).
fn bridge_ports(bridge: &str) -> Vec<String> {
    let Ok(out) = run_bounded("ip", &["-o", "link", "show", "master", bridge], COMMAND_BOUND) else {
        return vec![];
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

/// Whether the host's network namespace has a link of this name.
fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

/// The pid of the node's holder process (`tail -f <node dir>/holder`), whose namespaces every
/// component shares.
pub fn holder_pid(l: &Layout) -> Option<i32> {
    let file = l.holder_file().display().to_string();
    crate::procs::processes_of(&l.dir).into_iter().find(|(_, cmd)| cmd.starts_with("tail ") && cmd.ends_with(&file)).map(|(p, _)| p)
}

/// `nsenter`'s arguments that run `argv` in the network namespace of process `holder`.
pub(crate) fn netns_args<'a>(holder: &'a str, argv: &[&'a str]) -> Vec<&'a str> {
    let mut all = vec!["-t", holder, "-n", "--"];
    all.extend_from_slice(argv);
    all
}

/// Runs `program args` inside the node's network namespace (bounded).
pub fn in_netns(l: &Layout, program: &str, args: &[&str]) -> Result<std::process::Output, NodeError> {
    let pid = holder_pid(l).ok_or_else(|| NodeError::NoHolder(l.holder_file()))?;
    let pid = pid.to_string();
    Ok(run_bounded("nsenter", &netns_args(&pid, &[&[program], args].concat()), COMMAND_BOUND)?)
}

/// Whether another node is up on this machine (a held slot lock): it may be using the host
/// mount points this node created, so those stay.
fn other_nodes_up(l: &Layout) -> bool {
    let dir = super::slots_dir();
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().to_string();
        if name == format!("slot-{}.lock", l.net.slot) {
            return false;
        }
        let Ok(f): Result<File, _> = OpenOptions::new().write(true).open(e.path()) else {
            return false;
        };
        // SAFETY: flock on a file descriptor we own.

        (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0)
    })
}

/// The marker `Node::detach` leaves in a node directory: the node was left running on purpose.
pub const DETACHED: &str = "detached";

/// Finds and removes the nodes whose owner died without a teardown (a run or a test killed with
/// SIGKILL, a session cut off): a slot whose lock nobody holds but whose lock file still names a
/// node that is not `detached` and has something on the machine. Each is swept while its slot's
/// lock is held, so no new node takes the slot meanwhile. Works without the node directory (its
/// layout is in the lock file); only the sysctls need the directory's host record. Returns each
/// node removed and what could not be.
pub fn reap_strays() -> Vec<(Layout, Leftovers)> {
    let Ok(rd) = std::fs::read_dir(super::slots_dir()) else {
        return vec![];
    };
    let mut reaped = vec![];
    let mut files: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    files.sort();
    for path in files {
        let Ok(f): Result<File, _> = OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        // SAFETY: flock on a file descriptor we own; released when `f` closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // its node's owner is alive
        }
        let Some(l) = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| Layout::from_json(Path::new(v.get("dir")?.as_str()?), v.get("layout")?))
        else {
            continue;
        };
        // Only what a node itself holds counts: sysctls that differ from a node's record, or a
        // host directory, say as much about the machine since as about this node.
        let left = leftovers(&l);
        let holds = !left.processes.is_empty()
            || !left.cgroups.is_empty()
            || !left.links.is_empty()
            || left.nft_table
            || !left.mounts.is_empty()
            || !left.loops.is_empty();
        if l.dir.join(DETACHED).exists() || !holds {
            continue;
        }
        let left = sweep(&l);
        if left.is_empty() {
            let _ = f.set_len(0);
        }
        reaped.push((l, left));
    }
    reaped
}

/// Removes everything of the node (bounded by [`TEARDOWN_BOUND`]), then says what is left.
pub fn sweep(l: &Layout) -> Leftovers {
    let deadline = Instant::now() + TEARDOWN_BOUND;
    // kubelet first (it would restart what the next kill ends), then everything else, repeated
    // until nothing is left: a shim may start a process between two reads.
    kill_all(&processes(l).into_iter().filter(|(_, c)| c.contains("kubelet")).collect::<Vec<_>>());
    loop {
        let procs = processes(l);
        if procs.is_empty() || Instant::now() > deadline {
            break;
        }
        kill_all(&procs);
        std::thread::sleep(POLL);
    }
    // Loop devices a pod attached (a privileged pod's own stack, killed with its node) outlive
    // every process: detached once their users are gone.
    for dev in loop_devices(l) {
        let _ = run_bounded("losetup", &["-d", &dev], COMMAND_BOUND);
    }
    // Found by their files' inodes: once the data directories are gone (below), only now.
    let stuck_loops = loop_devices(l);
    // Mounts of the node in this (the host's) namespace: none are made here, but unmount any
    // that shows up (a mount that should have gone into the node's namespace).
    let marker = l.dir.to_string_lossy().to_string();
    for line in std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default().lines().filter(|m| m.contains(&marker)) {
        if let Some(point) = line.split_whitespace().nth(4) {
            let _ = run_bounded("umount", &["-l", point], COMMAND_BOUND);
        }
    }
    // The node's network namespace, its bridge, veths and nftables table went with its last
    // process. A node of an earlier shakedown made its bridge and table in the host's
    // namespace: those are deleted here (nothing of the kind exists for a node of this one).
    if link_exists(&l.bridge) {
        let ports = bridge_ports(&l.bridge);
        let _ = run_bounded("ip", &["link", "del", &l.bridge], COMMAND_BOUND);
        while ports.iter().any(|p| link_exists(p)) && Instant::now() < deadline {
            for p in ports.iter().filter(|p| link_exists(p)) {
                let _ = run_bounded("ip", &["link", "del", p], COMMAND_BOUND);
            }
            std::thread::sleep(POLL);
        }
    }
    // Cgroups, deepest first; a cgroup empties a moment after its last process died.
    loop {
        let dirs = cgroup_dirs(l);
        if dirs.is_empty() || Instant::now() > deadline {
            break;
        }
        for d in &dirs {
            let _ = std::fs::remove_dir(d);
        }
        std::thread::sleep(POLL);
    }
    if host_has_table(l) {
        let _ = run_bounded("nft", &["delete", "table", "inet", &l.nft_table], COMMAND_BOUND);
    }
    let record: HostRecord = std::fs::read_to_string(l.host_record()).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
    for (k, v) in &record.sysctls {
        let _ = std::fs::write(Path::new("/proc/sys").join(k), v);
    }
    if !other_nodes_up(l) {
        // Deepest first, and only when empty: the host's own files are never removed.
        let mut created = record.created.clone();
        created.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in created {
            let _ = std::fs::remove_dir(&d);
        }
    }
    for d in l.data_dirs() {
        let _ = std::fs::remove_dir_all(&d);
    }
    let mut left = leftovers(l);
    for d in stuck_loops {
        if !left.loops.contains(&d) {
            left.loops.push(d);
        }
    }
    // Put back once: a later sweep of this node (`reap` over its runs directory) must not write
    // the record's values over what the machine has since (another node's, the user's own).
    if left.sysctls.is_empty() && left.host_dirs.is_empty() && l.host_record().exists() {
        let _ = std::fs::rename(l.host_record(), l.dir.join("host.restored.json"));
    }
    left
}

/// What of the node is on the machine now.
pub fn leftovers(l: &Layout) -> Leftovers {
    let record: HostRecord = std::fs::read_to_string(l.host_record()).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
    let marker = l.dir.to_string_lossy().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|m| m.contains(&marker))
        .map(str::to_string)
        .collect();
    let links = std::iter::once(l.bridge.clone()).filter(|b| link_exists(b)).collect();
    let sysctls = record
        .sysctls
        .iter()
        .filter_map(|(k, v)| {
            let now = std::fs::read_to_string(Path::new("/proc/sys").join(k)).ok()?.trim().to_string();
            (&now != v).then(|| format!("{k}={now} (was {v})"))
        })
        .collect();
    let host_dirs = if other_nodes_up(l) { vec![] } else { record.created.iter().filter(|p| p.exists()).cloned().collect() };
    Leftovers {
        processes: processes(l),
        cgroups: cgroup_dirs(l),
        links,
        nft_table: host_has_table(l),
        mounts,
        sysctls,
        host_dirs,
        loops: loop_devices(l),
    }
}

/// The machine's loop devices whose backing file is in the node's directory (found by device
/// and inode: the path a device shows is the one its pod saw, inside its mount namespace).
pub fn loop_devices(l: &Layout) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(out) = run_bounded("losetup", &["--list", "--noheadings", "--output", "NAME,BACK-INO,BACK-MAJ:MIN"], COMMAND_BOUND) else {
        return vec![];
    };
    let devices: Vec<(String, u64, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            Some((f.first()?.to_string(), f.get(1)?.parse().ok()?, f.get(2)?.to_string()))
        })
        .collect();
    if devices.is_empty() {
        return vec![];
    }
    // The files a pod can write that outlive its container: claims (the provisioner's
    // directory) and emptyDir volumes (kubelet's pods directory), of every member.
    let mut files = BTreeSet::new();
    fn walk(d: &Path, out: &mut BTreeSet<(u64, String)>, depth: usize) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let Ok(m) = e.path().symlink_metadata() else { continue };
            if m.is_dir() && depth > 0 {
                walk(&e.path(), out, depth - 1);
            } else if m.is_file() {
                out.insert((m.ino(), format!("{}:{}", libc::major(m.dev()), libc::minor(m.dev()))));
            }
        }
    }
    for m in l.members() {
        walk(&m.dir.join("host"), &mut files, 12);
        walk(&m.kubelet_root().join("pods"), &mut files, 12);
    }
    devices.into_iter().filter(|(_, ino, dev)| files.contains(&(*ino, dev.clone()))).map(|(name, _, _)| name).collect()
}

/// Whether the host's ruleset has a table named like the node's.
fn host_has_table(l: &Layout) -> bool {
    run_bounded("nft", &["list", "table", "inet", &l.nft_table], COMMAND_BOUND).map(|o| o.status.success()).unwrap_or(false)
}

/// The guard, in the network namespace of the node's holder `holder`: an nftables table that
/// drops (and counts) link-local traffic (the cloud metadata address) and anything from the
/// pods' /24 to outside it. The namespace has no way out (no uplink, no default route); the
/// guard is the proof that nothing tried.
pub async fn guard(l: &Layout, holder: u32) -> Result<(), NodeError> {
    let subnet = format!("{}/24", l.net.subnet());
    let rules = format!(
        "table inet {t} {{\n  chain output {{ type filter hook output priority 0; ip daddr 169.254.0.0/16 counter drop; }}\n  chain forward {{ type filter hook forward priority 0; ip saddr {subnet} ip daddr != {subnet} counter drop; ip daddr 169.254.0.0/16 counter drop; }}\n{policy}}}\n",
        t = l.nft_table,
        policy = super::netpol::base_chains()
    );
    let file = l.dir.join("guard.nft");
    std::fs::write(&file, &rules).map_err(|source| NodeError::Io { action: "write", path: file.clone(), source })?;
    let (holder, file_arg) = (holder.to_string(), file.display().to_string());
    let out = run("nsenter", &netns_args(&holder, &["nft", "-f", &file_arg]), COMMAND_BOUND).await?;
    if !out.status.success() {
        return Err(super::failed(format!("nft -f {}", file.display()), &out));
    }
    Ok(())
}

/// Packets the guard dropped so far (0 is what a node that keeps to this machine shows).
/// (The table's policy chains count what NetworkPolicies drop; those are not counted here.)
pub fn guard_drops(l: &Layout) -> u64 {
    ["output", "forward"]
        .iter()
        .filter_map(|chain| in_netns(l, "nft", &["list", "chain", "inet", &l.nft_table, chain]).ok())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split("counter packets ")
                .skip(1)
                .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// RSS (bytes) of the node's processes by component (the binary's name; the pods' processes as
/// `pods`).
pub fn memory(l: &Layout) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let by_cmdline: BTreeSet<i32> = crate::procs::processes_of(&l.dir).into_iter().map(|(p, _)| p).collect();
    for (pid, cmd) in processes(l) {
        let rss = std::fs::read_to_string(format!("/proc/{pid}/statm"))
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
            * 4096;
        let name = if by_cmdline.contains(&pid) {
            let bin = cmd.split_whitespace().next().unwrap_or("?");
            Path::new(bin).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| bin.to_string())
        } else {
            "pods".to_string()
        };
        *out.entry(name).or_insert(0) += rss;
    }
    out
}
