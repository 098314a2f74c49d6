//! `cargo bench --bench workload`: a workload on a healthy local stack.
//!
//! For each client count: the store's write rate (revisions per second: one per write request
//! etcd applied, however many keys it wrote), acknowledged writes per second (one per key),
//! conflicts, lease puts, watch events, sustained over a window (after a warm-up); for `kv` the
//! requests its clients drew per second; where the machine's CPU went over the window (busy,
//! the etcd members, this process: the clients and the checks; shares of every core together,
//! so that a client that is not the bottleneck shows as such); and the cost
//! of a full check (observe + judge, every invariant) taken every 50 ms under that load (median,
//! p99) — with every check required to pass (a failure is printed: the check must raise no
//! false alarm under load).
//!
//! With `SHAKEDOWN_BENCH_REFERENCE=1` it first measures etcd's own client on a stack of the same
//! shape in the same run: `etcdctl check perf --load=l` against the members (its 60 s run,
//! about 8,000 writes/s asked of 1,000 clients), and reports each row's write rate as a ratio
//! of it.
//!
//! Needs what `scripts/install-deps.sh` installs, and root for loop-mounted disks. Writes
//! `target/bench/workload.json`. `SHAKEDOWN_BENCH_WINDOW` sets the window in seconds (default
//! 20), `SHAKEDOWN_BENCH_CLIENTS` the client counts (default `8,16,32`), `SHAKEDOWN_BENCH_KIND`
//! the workload (`kube`, the default, or `kv`: etcd's whole key-value API);
//! `SHAKEDOWN_BENCH_CHECKS=0` leaves the checks out (the workload's own rate, nothing judging);
//! `SHAKEDOWN_BENCH_KV_ONLY=put` (any `[workload.kv]` weight's name) gives that request all the
//! `kv` weight.

use std::time::{Duration, Instant};

use shakedown::binaries::{discover, BinaryOverrides};
use shakedown::invariants::{check_all, InvariantId};
use shakedown::targets::local::{DiskMode, LocalTarget, TestbedConfig};
use shakedown::targets::Target;

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// CPU time (user + system) of process `pid` in clock ticks (`None`: gone).
fn proc_ticks(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces) in parentheses: utime and stime
    // are the 14th and 15th of the line.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// The machine's busy and total clock ticks over every core (`/proc/stat`'s first line).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let total: u64 = v.iter().sum();
    // idle and iowait
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Where the CPU went: this process (the clients and the checks), the etcd members, the machine.
struct Cpu {
    me: u64,
    etcd: u64,
    busy: u64,
    total: u64,
}

fn cpu(target: &LocalTarget) -> Cpu {
    let etcd = target.testbed.members.values().filter_map(|m| m.pid()).filter_map(|p| proc_ticks(&p.to_string())).sum();
    let (busy, total) = machine_ticks();
    Cpu { me: proc_ticks("self").unwrap_or(0), etcd, busy, total }
}

fn main() {
    let window = Duration::from_secs(std::env::var("SHAKEDOWN_BENCH_WINDOW").ok().and_then(|s| s.parse().ok()).unwrap_or(20));
    let clients: Vec<u32> = std::env::var("SHAKEDOWN_BENCH_CLIENTS")
        .unwrap_or_else(|_| "8,16,32".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut base = shakedown::profiles::load("default").unwrap();
    if let Ok(kind) = std::env::var("SHAKEDOWN_BENCH_KIND") {
        base.workload.kind = match kind.as_str() {
            "kube" => shakedown::faults::WorkloadKind::Kube,
            "kv" => shakedown::faults::WorkloadKind::Kv,
            other => panic!("SHAKEDOWN_BENCH_KIND={other}: kube or kv"),
        };
    }
    if let Ok(only) = std::env::var("SHAKEDOWN_BENCH_KV_ONLY") {
        let mut mix = toml::Table::new();
        for name in ["put", "get", "delete", "range", "delete_range", "txn", "txn_compacted", "guarded", "lease", "list"] {
            mix.insert(name.into(), toml::Value::Integer(i64::from(name == only)));
        }
        base.workload.kv = toml::Value::Table(mix).try_into().expect("SHAKEDOWN_BENCH_KV_ONLY names a [workload.kv] weight");
    }
    let reference = std::env::var("SHAKEDOWN_BENCH_REFERENCE").is_ok_and(|v| v == "1");
    let checking = std::env::var("SHAKEDOWN_BENCH_CHECKS").map_or(true, |v| v != "0");
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let binaries = discover(&base.versions, &BinaryOverrides::default()).expect("binaries (run scripts/install-deps.sh)");
    let (mut disks, why) = DiskMode::detect();
    if let Some(why) = why {
        eprintln!("note: {why}");
    }
    if reference && disks == DiskMode::Loop {
        // check perf --load=l writes more than a member's 512 MiB image holds (etcd then stops:
        // "no space left on device"): every stack of the run on plain directories instead.
        eprintln!("note: SHAKEDOWN_BENCH_REFERENCE=1: every stack on plain directories (check perf --load=l fills a 512 MiB disk image)");
        disks = DiskMode::Plain;
    }
    let root = tempfile::Builder::new().prefix("shakedown-bench-").tempdir().unwrap();
    let config = |i: usize| {
        let run_dir = root.path().join(format!("run{i}"));
        std::fs::create_dir_all(&run_dir).unwrap();
        TestbedConfig {
            run_id: format!("sd-wbench{i}"),
            run_dir,
            binaries: binaries.clone(),
            disks,
            bug: None,
            heartbeat_ms: 100,
            election_ms: 1000,
            stack: shakedown::faults::Stack::Etcd,
            etcd: Default::default(),
        }
    };
    // etcd's own client on the same shape of stack, the workload all but idle (one put a second).
    let perf = reference.then(|| {
        let mut profile = base.clone();
        profile.workload.kind = shakedown::faults::WorkloadKind::Puts;
        profile.workload.interval = Duration::from_secs(1);
        let model = profile.initial_model();
        rt.block_on(async {
            let target = LocalTarget::start(config(99), &profile, &model, Duration::from_secs(30)).await.expect("bring-up");
            let urls: Vec<String> = target.testbed.members.values().map(|m| m.client_url()).collect();
            let run = tokio::process::Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["check", "perf", "--load=l", "--endpoints", &urls.join(",")])
                .kill_on_drop(true)
                .output();
            // Its run is 60 s; a stack that stops answering leaves it waiting for ever.
            let out = tokio::time::timeout(Duration::from_secs(240), run)
                .await
                .expect("etcdctl check perf answered within 240 s")
                .expect("etcdctl (scripts/install-deps.sh installs etcd-client)");
            let mut target = target;
            target.teardown().await;
            let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            // "PASS: Throughput is 8035 writes/s" or "FAIL: Throughput too low: 3139 writes/s".
            let rate = text
                .lines()
                .find(|l| l.contains("Throughput"))
                .and_then(|l| l.split_whitespace().filter_map(|w| w.parse::<f64>().ok()).next_back())
                .unwrap_or_else(|| panic!("no throughput in etcdctl check perf's output:\n{text}"));
            println!("reference: etcdctl check perf --load=l against the members: {rate:.0} writes/s");
            rate
        })
    });
    let mut rows = Vec::new();
    for (i, &n) in clients.iter().enumerate() {
        let mut profile = base.clone();
        profile.workload.clients = n;
        profile.workload.interval = Duration::ZERO;
        let cfg = config(i);
        let model = profile.initial_model();
        let row = rt.block_on(async {
            let mut target = LocalTarget::start(cfg, &profile, &model, Duration::from_secs(30)).await.expect("bring-up");
            tokio::time::sleep(Duration::from_secs(3)).await;
            let stat = |t: &LocalTarget, k: &str| t.workload_stats()[k].as_u64().unwrap_or(0);
            let (acked0, conflicts0, leases0, events0) =
                (stat(&target, "acked"), stat(&target, "conflicts"), stat(&target, "lease_puts"), stat(&target, "watch_events"));
            let revision = |o: &shakedown::invariants::Observation| o.members.iter().map(|m| m.revision).max().unwrap_or(0);
            let rev0 = revision(&target.observe(&model, &[InvariantId::Members]).await);
            let draws0 = stat(&target, "kv_draws");
            let cpu0 = cpu(&target);
            let t0 = Instant::now();
            let (mut checks, mut judged, mut failed) = (Vec::new(), Vec::new(), Vec::new());
            if !checking {
                tokio::time::sleep(window).await;
            }
            while checking && t0.elapsed() < window {
                let t = Instant::now();
                let obs = target.observe(&model, &InvariantId::ALL).await;
                let tj = Instant::now();
                let failures = check_all(&shakedown::targets::checked(&target), &model, &obs);
                judged.push(tj.elapsed().as_secs_f64() * 1000.0);
                checks.push(t.elapsed().as_secs_f64() * 1000.0);
                if !failures.is_empty() {
                    failed.push(format!("{failures:?}"));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let cpu1 = cpu(&target);
            let rev1 = revision(&target.observe(&model, &[InvariantId::Members]).await);
            let secs = t0.elapsed().as_secs_f64();
            // Shares of the machine's ticks over the window (every core together).
            let all = (cpu1.total - cpu0.total).max(1) as f64;
            let share = |a: u64, b: u64| a.saturating_sub(b) as f64 / all;
            let per_s = |a: u64, b: u64| (a - b) as f64 / secs;
            let writes = (rev1 - rev0) as f64 / secs;
            let row = serde_json::json!({
                "clients": n,
                "kind": format!("{:?}", profile.workload.kind),
                "writes_per_s": writes,
                "ratio_to_check_perf": perf.map(|p| writes / p),
                "kv_draws_per_s": per_s(stat(&target, "kv_draws"), draws0),
                "cpu_busy": share(cpu1.busy, cpu0.busy),
                "cpu_etcd": share(cpu1.etcd, cpu0.etcd),
                "cpu_shakedown": share(cpu1.me, cpu0.me),
                "acked_txn_per_s": per_s(stat(&target, "acked"), acked0),
                "conflicts_per_s": per_s(stat(&target, "conflicts"), conflicts0),
                "lease_puts_per_s": per_s(stat(&target, "lease_puts"), leases0),
                "watch_events_per_s": per_s(stat(&target, "watch_events"), events0),
                "check_ms_median": pct(&mut checks.clone(), 0.5),
                "check_ms_p99": pct(&mut checks.clone(), 0.99),
                "judge_ms_median": pct(&mut judged.clone(), 0.5),
                "checks": checks.len(),
                "checks_failed": failed.len(),
            });
            for f in failed.iter().take(3) {
                eprintln!("clients {n}: a check failed on a healthy stack: {f}");
            }
            target.teardown().await;
            row
        });
        println!(
            "clients {:>3}: {:>7.0} writes/s{}{} · {:>7.0} acknowledged writes/s · {:>5.0} conflicts/s · {:>5.0} lease puts/s · {:>6.0} watch events/s · CPU busy {:.0}% (etcd {:.0}%, shakedown {:.0}%) · check median {:.1} ms (judging {:.1} ms), p99 {:.1} ms ({} checks, {} failed)",
            n,
            row["writes_per_s"].as_f64().unwrap(),
            row["ratio_to_check_perf"].as_f64().map(|r| format!(" ({r:.2} × check perf)")).unwrap_or_default(),
            match row["kv_draws_per_s"].as_f64() {
                Some(d) if d > 0.0 => format!(" · {d:.0} kv requests/s"),
                _ => String::new(),
            },
            row["acked_txn_per_s"].as_f64().unwrap(),
            row["conflicts_per_s"].as_f64().unwrap(),
            row["lease_puts_per_s"].as_f64().unwrap(),
            row["watch_events_per_s"].as_f64().unwrap(),
            row["cpu_busy"].as_f64().unwrap() * 100.0,
            row["cpu_etcd"].as_f64().unwrap() * 100.0,
            row["cpu_shakedown"].as_f64().unwrap() * 100.0,
            row["check_ms_median"].as_f64().unwrap_or(f64::NAN),
            row["judge_ms_median"].as_f64().unwrap_or(f64::NAN),
            row["check_ms_p99"].as_f64().unwrap_or(f64::NAN),
            row["checks"],
            row["checks_failed"],
        );
        rows.push(row);
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("workload.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "window_s": window.as_secs(), "disks": format!("{disks:?}"), "check_perf_writes_per_s": perf, "rows": rows }))
            .unwrap(),
    )
    .unwrap();
}
