//! `cargo bench --bench core`: the core issue's targets, measured on this machine.
//!
//! - plan generation rate (ops/s, median of 7 batches);
//! - three-member local stack: bring-up until healthy, and teardown (medians of N runs);
//! - invariant checks after a step on a healthy stack (observe + judge; median and p99);
//! - a disk-detach → disk-reattach cycle until every invariant holds again (median);
//! - backup + restore of a 10,000-key store until every invariant holds again (median).
//!
//! Needs what `scripts/install-deps.sh` installs, and root for loop-mounted disks
//! (without root it measures plain-directory disks and says so). Writes
//! `target/bench/core.json` beside the printed table. `SHAKEDOWN_BENCH_RUNS` sets N (default 5).

use std::time::{Duration, Instant};

use shakedown::binaries::{discover, BinaryOverrides};
use shakedown::faults::{generate, MemberId, Model, Op};
use shakedown::invariants::{check_all, InvariantId};
use shakedown::targets::local::{DiskMode, LocalTarget, Testbed, TestbedConfig};
use shakedown::targets::Target;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let runs: usize = std::env::var("SHAKEDOWN_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let profile = shakedown::profiles::load("nightly").unwrap();

    // Plan generation.
    let mut rates = Vec::new();
    for b in 0..7u64 {
        let t = Instant::now();
        let mut ops = 0usize;
        for seed in 0..200u64 {
            ops += generate(b * 1000 + seed, &profile).ops.len();
        }
        rates.push(ops as f64 / t.elapsed().as_secs_f64());
    }
    let gen_rate = median(&mut rates);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let binaries = discover(&profile.versions, &BinaryOverrides::default()).expect("binaries (run scripts/install-deps.sh)");
    let (disks, why) = DiskMode::detect();
    if let Some(why) = why {
        eprintln!("note: {why}");
    }
    let root = tempfile::Builder::new().prefix("shakedown-bench-").tempdir().unwrap();
    let cfg = |i: usize| {
        let run_dir = root.path().join(format!("run{i}"));
        std::fs::create_dir_all(&run_dir).unwrap();
        TestbedConfig {
            run_id: format!("sd-bench{i}"),
            run_dir,
            binaries: binaries.clone(),
            disks,
            bug: None,
            heartbeat_ms: shakedown::targets::local::HEARTBEAT_MS,
            election_ms: shakedown::targets::local::ELECTION_MS,
            stack: shakedown::faults::Stack::Etcd,
            etcd: Default::default(),
        }
    };
    let model = profile.initial_model();

    // Bring-up and teardown.
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let t = Instant::now();
        let mut tb = rt.block_on(Testbed::up(cfg(i), &model, Duration::from_secs(30))).expect("bring-up");
        up.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        tb.teardown();
        down.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    // Invariant checks on a healthy stack with the workload running.
    let mut checks = Vec::new();
    rt.block_on(async {
        let mut target = LocalTarget::start(cfg(runs), &profile, &model, Duration::from_secs(30)).await.expect("bring-up");
        for _ in 0..100 {
            let t = Instant::now();
            let obs = target.observe(&model, &InvariantId::ALL).await;
            let failures = check_all(&shakedown::targets::checked(&target), &model, &obs);
            checks.push(t.elapsed().as_secs_f64() * 1000.0);
            assert!(failures.is_empty(), "healthy stack fails: {failures:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        target.teardown().await;
    });

    // Op cycles, each measured until every invariant holds again.
    let (mut disk_cycles, mut restore_cycles) = (Vec::new(), Vec::new());
    if disks == DiskMode::Loop {
        rt.block_on(async {
            let mut model = profile.initial_model();
            let mut target = LocalTarget::start(cfg(runs + 1), &profile, &model, Duration::from_secs(30)).await.expect("bring-up");
            async fn step(target: &mut LocalTarget, model: &mut Model, op: Op) {
                let before = model.clone();
                model.apply(&op).unwrap();
                target.execute(&op, &before, model).await.unwrap_or_else(|e| panic!("{op}: {e}"));
            }
            async fn converged(target: &mut LocalTarget, model: &Model) {
                let t = Instant::now();
                loop {
                    let obs = target.observe(model, &InvariantId::ALL).await;
                    if check_all(&shakedown::targets::checked(&*target), model, &obs).is_empty() {
                        break;
                    }
                    assert!(t.elapsed() < Duration::from_secs(60), "did not converge");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                target.end_step().await;
            }
            for i in 0..runs {
                let m = MemberId(model.members.keys().nth(i % 3).unwrap().0);
                let t = Instant::now();
                step(&mut target, &mut model, Op::DiskDetach { member: m }).await;
                converged(&mut target, &model).await;
                step(&mut target, &mut model, Op::DiskReattach { member: m }).await;
                converged(&mut target, &model).await;
                disk_cycles.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            // A 10,000-key store, written in transactions of 100.
            let mut c = etcd_client::Client::connect([target.testbed.endpoint_url()], None).await.unwrap();
            for batch in 0..100 {
                let ops: Vec<etcd_client::TxnOp> =
                    (0..100).map(|k| etcd_client::TxnOp::put(format!("/bench/{batch:03}/{k:03}"), vec![b'x'; 100], None)).collect();
                c.txn(etcd_client::Txn::new().and_then(ops)).await.unwrap();
            }
            for _ in 0..runs {
                let t = Instant::now();
                step(&mut target, &mut model, Op::Backup).await;
                target.end_step().await;
                let b = *model.backups.last().unwrap();
                step(&mut target, &mut model, Op::Restore { backup: b }).await;
                converged(&mut target, &model).await;
                restore_cycles.push(t.elapsed().as_secs_f64() * 1000.0);
                if model.backups.len() >= shakedown::faults::MAX_BACKUPS {
                    break;
                }
            }
            target.teardown().await;
        });
    }

    let disk_note = format!("{disks:?}").to_lowercase();
    let rows = [
        ("plan generation", format!("{:.0} ops/s", gen_rate), "≥ 100,000 ops/s"),
        (
            "bring-up (3 members, healthy)",
            format!(
                "median {:.0} ms (min {:.0}, max {:.0})",
                median(&mut up.clone()),
                pct(&mut up.clone(), 0.0),
                pct(&mut up.clone(), 1.0)
            ),
            "≤ 2 s",
        ),
        (
            "teardown",
            format!(
                "median {:.0} ms (min {:.0}, max {:.0})",
                median(&mut down.clone()),
                pct(&mut down.clone(), 0.0),
                pct(&mut down.clone(), 1.0)
            ),
            "≤ 1 s",
        ),
        (
            "invariant checks (healthy)",
            format!("median {:.1} ms, p99 {:.1} ms", median(&mut checks.clone()), pct(&mut checks.clone(), 0.99)),
            "≤ 50 ms median",
        ),
        (
            "disk-detach → reattach, converged",
            if disk_cycles.is_empty() {
                "n/a (needs root)".into()
            } else {
                format!(
                    "median {:.0} ms (min {:.0}, max {:.0})",
                    median(&mut disk_cycles.clone()),
                    pct(&mut disk_cycles.clone(), 0.0),
                    pct(&mut disk_cycles.clone(), 1.0)
                )
            },
            "≤ 5 s median",
        ),
        (
            "backup + restore, 10,000 keys",
            if restore_cycles.is_empty() {
                "n/a (needs root)".into()
            } else {
                format!(
                    "median {:.0} ms (min {:.0}, max {:.0})",
                    median(&mut restore_cycles.clone()),
                    pct(&mut restore_cycles.clone(), 0.0),
                    pct(&mut restore_cycles.clone(), 1.0)
                )
            },
            "≤ 5 s median",
        ),
    ];
    println!("shakedown core benchmark · {runs} stack runs · disks: {disk_note}");
    println!("{:<36} {:<44} target", "measure", "result");
    for (a, b, c) in &rows {
        println!("{a:<36} {b:<44} {c}");
    }
    let json = serde_json::json!({
        "runs": runs, "disks": disk_note,
        "plan_generation_ops_per_s": gen_rate,
        "bring_up_ms": up, "teardown_ms": down, "check_ms": checks,
        "disk_detach_reattach_ms": disk_cycles, "backup_restore_10k_ms": restore_cycles,
    });
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("core.json"), serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("written: {}", out.join("core.json").display());
}
