//! `shakedown testbed up|status|down` (the local stack by hand) and `shakedown reap`.

use std::path::{Path, PathBuf};

use crate::exit::{Exit, Fatal};
use crate::profiles;
use crate::targets::local::{reap, Testbed, TestbedConfig, BRING_UP_BOUND};

use super::session::{create_run_dir, new_run_id};
use super::TestbedAction;

fn current_testbed(runs_dir: &Path) -> Result<PathBuf, Fatal> {
    let ptr = runs_dir.join("current-testbed");
    let dir = std::fs::read_to_string(&ptr)
        .map_err(|_| Fatal::usage(format!("no testbed is up (no {}): start one with `shakedown testbed up`", ptr.display())))?;
    Ok(PathBuf::from(dir.trim()))
}

pub async fn testbed(action: TestbedAction) -> Result<Exit, Fatal> {
    match action {
        TestbedAction::Up { opts, profile } => {
            let profile = profiles::load(&profile)?;
            if let Ok(dir) = current_testbed(&opts.runs_dir) {
                if dir.exists() {
                    return Err(Fatal::usage(format!("a testbed is already up in {}: `shakedown testbed down` first", dir.display())));
                }
            }
            opts.target.kube.refuse_for("local")?;
            let (binaries, disks) = opts.target.local.environment(&profile)?;
            let run_id = new_run_id();
            let run_dir = create_run_dir(&opts.runs_dir, &run_id)?;
            let cfg = TestbedConfig::new(&run_id, &run_dir, binaries, disks, opts.target.local.testbed_bug);
            let tb = Testbed::up(cfg, &profile.initial_model(), BRING_UP_BOUND)
                .await
                .map_err(|e| Fatal::environment(format!("cannot bring the local stack up: {e}")))?;
            std::fs::write(opts.runs_dir.join("current-testbed"), run_dir.to_string_lossy().as_bytes())
                .map_err(|e| Fatal::environment(e.to_string()))?;
            println!("testbed {run_id} up in {}", run_dir.display());
            println!("endpoint  {}", tb.endpoint_url());
            for m in tb.members.values() {
                println!(
                    "{:<9} {} (site {}, etcd {}, data {})",
                    m.name(),
                    m.client_url(),
                    m.site.0,
                    m.version,
                    m.disk.data_dir().display()
                );
            }
            println!("try: ETCDCTL_API=3 etcdctl --endpoints {} endpoint status", tb.endpoint_url());
            tb.detach();
            Ok(Exit::Pass)
        }
        TestbedAction::Down { runs_dir } => {
            let dir = current_testbed(&runs_dir)?;
            let swept = reap::sweep(&dir);
            let _ = std::fs::remove_dir_all(dir.join("disks"));
            let _ = std::fs::remove_dir_all(dir.join("members"));
            let _ = std::fs::remove_file(runs_dir.join("current-testbed"));
            println!(
                "testbed down: {} processes, {} mounts, {} loop devices removed",
                swept.processes.len(),
                swept.mounts.len(),
                swept.loops.len()
            );
            Ok(Exit::Pass)
        }
        TestbedAction::Status { runs_dir } => {
            let dir = current_testbed(&runs_dir)?;
            let cfg = std::fs::read_to_string(dir.join("haproxy.cfg"))
                .map_err(|e| Fatal::usage(format!("testbed in {} has no haproxy.cfg: {e}", dir.display())))?;
            let mut all_ok = true;
            for line in cfg.lines().map(str::trim) {
                let parts: Vec<&str> = line.split_whitespace().collect();
                let (name, addr) = match parts.as_slice() {
                    ["bind", addr] => ("endpoint", *addr),
                    ["server", name, addr, ..] => (*name, *addr),
                    _ => continue,
                };
                let url = format!("http://{addr}");
                match crate::targets::local::etcd::status(&url, crate::targets::local::REQUEST_BOUND * 2).await {
                    Ok(s) => println!(
                        "{name:<9} {url:<28} ok   etcd {} leader {:x} revision {}",
                        s.version(),
                        s.leader(),
                        s.header().map(|h| h.revision()).unwrap_or(0)
                    ),
                    Err(e) => {
                        all_ok = false;
                        println!("{name:<9} {url:<28} DOWN {e}");
                    }
                }
            }
            Ok(if all_ok { Exit::Pass } else { Exit::Liveness })
        }
    }
}

/// Sweeps every run directory whose owner process is gone, including the run directories
/// grouped under a soak's or a shrink's directory; then the nodes of killed runs wherever they
/// were (a test's temporary directory, say). Returns the run directories and the stray nodes
/// reaped.
pub fn reap_runs(runs_dir: &Path) -> Result<(usize, usize), Fatal> {
    let n = reap_under(runs_dir, 2)?;
    let strays = crate::node::cleanup::reap_strays();
    for (l, left) in &strays {
        println!(
            "{}: node {} of a killed run removed{}",
            l.dir.display(),
            l.node_name,
            if left.is_empty() { String::new() } else { format!(" (left: {left})") }
        );
    }
    Ok((n, strays.len()))
}

fn reap_under(runs_dir: &Path, depth: u32) -> Result<usize, Fatal> {
    let Ok(entries) = std::fs::read_dir(runs_dir) else { return Ok(0) };
    // The node `shakedown node up` left running on purpose: `node down` takes it down.
    let current_node =
        std::fs::read_to_string(runs_dir.join("current-node")).ok().and_then(|d| PathBuf::from(d.trim()).canonicalize().ok());
    let mut n = 0;
    for e in entries.filter_map(|e| e.ok()) {
        let dir = e.path();
        if current_node.is_some() && dir.canonicalize().ok() == current_node {
            continue;
        }
        let Ok(owner) = std::fs::read_to_string(dir.join("run.json")) else {
            if depth > 1 && dir.is_dir() {
                n += reap_under(&dir, depth - 1)?;
            }
            continue;
        };
        let owner: serde_json::Value = serde_json::from_str(&owner).unwrap_or_default();
        let pid = owner.get("pid").and_then(|p| p.as_u64()).unwrap_or(0);
        let alive = pid != 0
            && pid != std::process::id() as u64
            && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("shakedown"));
        if alive {
            continue;
        }
        let dir = dir.canonicalize().unwrap_or(dir);
        // A node of a killed run (the application target's tests, a `node up` whose pointer is
        // gone): its processes, cgroups, bridge, guard table, host mount points and sysctls.
        if let Some(layout) = crate::node::layout::Layout::load(&dir.join("node")) {
            if layout.dir.join("kubelet").exists() || !crate::node::cleanup::leftovers(&layout).is_empty() {
                let left = crate::node::cleanup::sweep(&layout);
                println!(
                    "{}: node {} removed{}",
                    dir.display(),
                    layout.node_name,
                    if left.is_empty() { String::new() } else { format!(" (left: {left})") }
                );
                n += 1;
            }
        }
        let swept = reap::sweep(&dir);
        let had_disks = dir.join("disks").exists() || dir.join("members").exists();
        let _ = std::fs::remove_dir_all(dir.join("disks"));
        let _ = std::fs::remove_dir_all(dir.join("members"));
        if !swept.is_empty() || had_disks {
            println!(
                "{}: {} processes, {} mounts, {} loop devices",
                dir.display(),
                swept.processes.len(),
                swept.mounts.len(),
                swept.loops.len()
            );
            n += 1;
        }
    }
    Ok(n)
}
