//! Removing what a run left behind, recognised by its run directory: every process the local
//! target starts names a path inside the run directory on its command line, every mount point
//! and every loop device's backing file lies inside it. Nothing else is touched.

use std::path::{Path, PathBuf};

use shakedown_invariants::LocalInventory;

use super::disk::{loop_backing, loops_under, mounts_under, run_cmd_sync};

/// What a sweep found and removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    pub processes: Vec<(i32, String)>,
    pub mounts: Vec<PathBuf>,
    pub loops: Vec<String>,
    pub nft_table: bool,
}

impl Swept {
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.mounts.is_empty() && self.loops.is_empty() && !self.nft_table
    }
}

pub use crate::procs::processes_of;

/// What of the run is on the machine now, found from the machine itself (/proc, /proc/mounts,
/// sysfs, nftables, the run directory), not from the target's bookkeeping.
pub async fn inventory(run_dir: &Path, nft_table: &str, loop_disks: bool, control_plane: bool) -> LocalInventory {
    let members = run_dir.join("members");
    let member_of =
        |p: &Path| p.strip_prefix(&members).ok().and_then(|r| r.components().next()).map(|c| c.as_os_str().to_string_lossy().to_string());
    let mut inv = LocalInventory { loop_disks, apiservers: control_plane.then(Default::default), ..Default::default() };
    for (_, cmd) in processes_of(run_dir) {
        if cmd.contains("haproxy") {
            inv.haproxies += 1;
        } else if let Some(name) = super::apiserver::machine_of(&cmd) {
            inv.apiservers.get_or_insert_with(Default::default).insert(name);
        } else if let Some(name) = cmd.split(" --name ").nth(1).and_then(|r| r.split_whitespace().next()) {
            inv.processes.insert(name.to_string());
        }
    }
    inv.mounts = mounts_under(&members).iter().filter_map(|m| member_of(m)).collect();
    let disks = run_dir.join("disks");
    inv.loop_devices = loops_under(run_dir)
        .iter()
        .filter_map(|d| loop_backing(d))
        .filter_map(|b| b.strip_prefix(&disks).ok().and_then(|f| f.to_str()).and_then(|f| f.strip_suffix(".img")).map(str::to_string))
        .collect();
    if let Ok(rd) = std::fs::read_dir(&members) {
        inv.data_dirs =
            rd.flatten().filter(|e| e.path().join("data").is_dir()).map(|e| e.file_name().to_string_lossy().to_string()).collect();
    }
    if let Ok(rd) = std::fs::read_dir(run_dir.join("backups")) {
        inv.backups = rd.flatten().filter_map(|e| e.file_name().to_str().and_then(|f| f.strip_suffix(".db")).map(str::to_string)).collect();
    }
    if loop_disks {
        inv.partition_rules = super::nft::rules(nft_table).await.into_iter().collect();
    }
    inv
}

/// Kills every process of the run, unmounts its filesystems and detaches its loop devices.
pub fn sweep(run_dir: &Path) -> Swept {
    let mut swept = Swept { processes: processes_of(run_dir), ..Default::default() };
    for (pid, _) in &swept.processes {
        // SAFETY: plain kill(2) on a pid we just found; SIGKILL also ends stopped processes.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    // Give the kernel a bounded moment to release the files the processes held open.
    for _ in 0..100 {
        if swept.processes.iter().all(|(pid, _)| !Path::new(&format!("/proc/{pid}")).exists() || is_zombie(*pid)) {
            break;
        }
        std::thread::sleep(super::testbed::REAP_POLL);
    }
    for m in mounts_under(run_dir) {
        let p = m.to_string_lossy().to_string();
        if run_cmd_sync("umount", &[&p]).is_err() {
            let _ = run_cmd_sync("umount", &["-l", &p]);
        }
        swept.mounts.push(m);
    }
    for dev in loops_under(run_dir) {
        let _ = run_cmd_sync("losetup", &["-d", &dev]);
        swept.loops.push(dev);
    }
    if let Some(run_id) = run_dir.file_name().and_then(|n| n.to_str()) {
        swept.nft_table = super::nft::delete_table(&super::nft::table_name(run_id));
    }
    swept
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}
