//! `cargo bench --bench suite`: how fast shakedown finds bugs on the real local stack, and what it
//! costs — against two baselines, on the same planted bugs.
//!
//! Sections (all but `shrink30` by default; name some to run only those:
//! `cargo bench --bench suite -- detect shrink30`):
//! - `framework`: plan generation rate and a determinism check over many seeds; bring-up and
//!   teardown, check latency and framework overhead per step, read off the event logs of every
//!   run this benchmark makes;
//! - `detect`: time-to-detect of every planted bug (`default` profile, 25 steps, seeds 1..=N):
//!   detection rate, median seconds and steps;
//! - `baselines`: (a) a fixed scripted scenario, one op of each family in a fixed order, checked
//!   after every step like a conventional e2e suite (one run per bug: it has no seed);
//!   (b) random crashes (kill a random member, restart it) with no model and no invariants,
//!   checking only reachability at the end (seeds 1..=N);
//! - `shrink`: each bug's first detected failure shrunk with `--max-runs 40`: re-executions and
//!   final length;
//! - `shrink30`: failures of 30 or more steps (the bugs with cheap triggers, on smoke plans of 40
//!   steps whose trigger comes at step 30 or later), shrunk: re-executions and final length;
//! - `soak`: `soak --for 30s --profile smoke`, shakedown's RSS after every seed (for a long
//!   soak: `shakedown soak --for 30m --profile smoke`, then the `rss_kib` column of its
//!   `soak.jsonl`);
//! - `report`: the HTML report of a 1,000-step run (events and 300,000 workload samples shaped
//!   like a real run's), built 5 times.
//!
//! Runs go through the `shakedown` binary, the way a user runs them, three stacks at a time
//! (`SHAKEDOWN_BENCH_LANES`, default 3) except the framework measurements. Needs root and what
//! `scripts/install-deps.sh` installs. Writes `target/bench/suite.json` and `suite.md`
//! (`SHAKEDOWN_BENCH_OUT` to put them elsewhere). `SHAKEDOWN_BENCH_SEEDS` sets N (default 5);
//! `SHAKEDOWN_BENCH_BUGS` (comma-separated names) limits the planted bugs measured.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use shakedown::binaries::{discover, BinaryOverrides};
use shakedown::events::{Check, CheckVerdict, Event, Judged, Line, RunOutcome};
use shakedown::faults::{generate, MemberId, Model, Op, OpKind, OutageMode, Plan, SiteId};
use shakedown::invariants::{check_all, InvariantId};
use shakedown::record::{Expect, Failure, FailureKind, SeedRecord, FORMAT};
use shakedown::targets::local::{DiskMode, LocalTarget, PlantedBug, TestbedConfig};
use shakedown::targets::{Target, TargetSpec};

const BIN: &str = env!("CARGO_BIN_EXE_shakedown");
const DETECT_STEPS: usize = 25;
const SHRINK_MAX_RUNS: u32 = 40;
const CRASH_ROUNDS: usize = 4;
/// The engine's pause between two checks of a step.
const CHECK_RETRY_MS: f64 = shakedown::engine::CHECK_RETRY.as_millis() as f64;

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn pct(v: &[f64], p: f64) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (!v.is_empty()).then(|| v[((v.len() as f64 - 1.0) * p).round() as usize])
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}")).unwrap_or_else(|| "–".into())
}

/// A shakedown command to start: (args, where its output goes).
struct Job {
    args: Vec<String>,
    log: PathBuf,
}

/// Runs jobs `lanes` at a time; returns each job's exit code, in order.
fn run_jobs(jobs: &[Job], lanes: usize) -> Vec<i32> {
    let mut codes = vec![-1; jobs.len()];
    let mut running: Vec<(usize, Child)> = Vec::new();
    let mut next = 0;
    while next < jobs.len() || !running.is_empty() {
        while running.len() < lanes && next < jobs.len() {
            let j = &jobs[next];
            let log = std::fs::File::create(&j.log).unwrap();
            let child = Command::new(BIN)
                .args(&j.args)
                .env("RUST_LOG", "warn")
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .expect("shakedown starts");
            running.push((next, child));
            next += 1;
        }
        std::thread::sleep(Duration::from_millis(100));
        running.retain_mut(|(i, c)| match c.try_wait().unwrap() {
            Some(s) => {
                codes[*i] = s.code().unwrap_or(-1);
                false
            }
            None => true,
        });
    }
    codes
}

fn events(run_dir: &Path) -> Vec<Line> {
    shakedown::events::read(&run_dir.join("events.jsonl")).unwrap_or_default()
}

/// Every real run directory (`run.json` and `events.jsonl`) under `dir`, at any depth.
fn run_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        if p.join("events.jsonl").is_file() && p.join("run.json").is_file() {
            out.push(p.clone());
        }
        if p.is_dir() {
            out.extend(run_dirs(&p));
        }
    }
    out
}

/// (seconds from the run's start to the failing check, failing step, the invariant that broke)
/// of a failed run.
fn time_to_detect(run_dir: &Path) -> Option<(f64, u64, String)> {
    let ev = events(run_dir);
    let t0 = ev.first()?.ts_ms;
    let (ts, check) = ev.iter().find_map(|l| match &l.event {
        Event::Check(c) | Event::Liveness(c) if c.verdict == CheckVerdict::Fail => Some((l.ts_ms, c)),
        _ => None,
    })?;
    let invariant = check.invariant.map(|i| i.to_string()).unwrap_or_else(|| "liveness".into());
    Some(((ts - t0) as f64 / 1000.0, check.step as u64, invariant))
}

/// The only run directory directly under `dir`.
fn only_run(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir).ok()?.flatten().map(|e| e.path()).find(|p| p.join("events.jsonl").is_file())
}

/// The scripted scenario: one op of each family, in the catalogue's order, each on the first
/// member (or site, or backup) it can apply to (a disk replace after a detach of its own).
fn scripted_plan() -> Plan {
    let profile = shakedown::profiles::load("default").unwrap();
    let mut model = profile.initial_model();
    let mut ops = Vec::new();
    let mut last_member = None;
    for kind in OpKind::ALL {
        if kind == OpKind::DiskReplace && model.candidates(kind).is_empty() {
            // Replacing a member's data follows a lost disk, as a reattach does.
            let detach = model.candidates(OpKind::DiskDetach).into_iter().next().expect("a disk to detach");
            last_member = detach.member();
            model.apply(&detach).unwrap();
            ops.push(detach);
        }
        let op = match kind {
            // The recovery and restart ops go with the member or site the fault hit.
            OpKind::Restart | OpKind::Resume | OpKind::DiskReattach | OpKind::DiskReplace => {
                model.candidates(kind).into_iter().find(|o| o.member() == last_member)
            }
            OpKind::SiteOutage => Some(Op::SiteOutage { site: SiteId(1), mode: OutageMode::Isolate }),
            OpKind::SiteRecover => Some(Op::SiteRecover { site: SiteId(1) }),
            _ => model.candidates(kind).into_iter().next(),
        }
        .unwrap_or_else(|| panic!("the scripted scenario has a {kind} op"));
        last_member = op.member().or(last_member);
        model.apply(&op).unwrap();
        ops.push(op);
    }
    Plan { seed: 0, profile: "default".into(), weights: Default::default(), etcd: None, ops }
}

/// A seed record holding `plan`, so `shakedown replay` runs it exactly.
fn record_for(plan: &Plan, bug: PlantedBug) -> String {
    let profile = shakedown::profiles::load("default").unwrap();
    SeedRecord {
        format: FORMAT,
        shakedown_version: env!("CARGO_PKG_VERSION").into(),
        seed: 0,
        run_id: "scripted".into(),
        started: "2026-11-30T00:00:00Z".into(),
        duration_ms: None,
        expect: Expect::Fail,
        versions: Default::default(),
        failure: Failure {
            kind: FailureKind::Violation,
            step: 0,
            op: "scripted scenario".into(),
            invariant: None,
            also: vec![],
            message: "baseline: any failure counts as detection".into(),
            at: "2026-11-30T00:00:00Z".into(),
        },
        profile,
        plan: plan.clone(),
        shrunk: None,
        matching: None,
        reproduction: Vec::new(),
        target: shakedown::targets::TargetSpec::Local(shakedown::targets::local::LocalSpec { testbed_bug: Some(bug) }),
    }
    .to_toml()
}

/// Baseline (b): kill a random member and restart it, `CRASH_ROUNDS` times, no model and no
/// invariant; at the end check reachability once. Returns (detected, seconds).
async fn random_crashes(cfg: TestbedConfig, seed: u64) -> (bool, f64) {
    let profile = shakedown::profiles::load("default").unwrap();
    let model: Model = profile.initial_model();
    let t0 = Instant::now();
    let mut target = LocalTarget::start(cfg, &profile, &model, Duration::from_secs(30)).await.expect("bring-up");
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    for _ in 0..CRASH_ROUNDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let m = MemberId((x % 3) as u32);
        let _ = target.testbed.kill(m).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let cluster = target.testbed.initial_cluster();
        let _ = target.testbed.spawn_member(m, &cluster, "existing");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let obs = target.observe(&model, &[InvariantId::Reachability]).await;
    let detected = !check_all(&[InvariantId::Reachability], &model, &obs).is_empty();
    let secs = t0.elapsed().as_secs_f64();
    target.teardown().await;
    (detected, secs)
}

#[derive(Default)]
struct Report {
    json: serde_json::Map<String, Value>,
    rows: Vec<[String; 3]>,
}

impl Report {
    fn row(&mut self, a: impl Into<String>, b: impl Into<String>, c: impl Into<String>) {
        self.rows.push([a.into(), b.into(), c.into()]);
    }
}

fn main() {
    let t_bench = Instant::now();
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    // `shrink30` (issue 4's shrink target) is not in the default set: it adds minutes.
    let want = |s: &str| (args.is_empty() && s != "shrink30") || args.iter().any(|a| a == s);
    let seeds: u64 = std::env::var("SHAKEDOWN_BENCH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(5);
    let lanes: usize = std::env::var("SHAKEDOWN_BENCH_LANES").ok().and_then(|s| s.parse().ok()).unwrap_or(3).max(1);
    let out = std::env::var("SHAKEDOWN_BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench"));
    let tmp = tempfile::Builder::new().prefix("shakedown-suite-").tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let mut r = Report::default();
    let (disks, why) = DiskMode::detect();
    if let Some(why) = why {
        eprintln!("note: {why}: disk faults and site isolation are skipped, some bugs cannot be planted");
    }
    let only: Option<Vec<String>> =
        std::env::var("SHAKEDOWN_BENCH_BUGS").ok().map(|s| s.split(',').map(|b| b.trim().to_string()).collect());
    let bugs: Vec<PlantedBug> =
        PlantedBug::ALL.iter().copied().filter(|b| only.as_ref().is_none_or(|o| o.iter().any(|n| n == b.name()))).collect();
    let runs_arg = |dir: &Path| {
        vec![
            "--runs-dir".to_string(),
            dir.join("runs").display().to_string(),
            "--seeds-dir".into(),
            dir.join("seeds").display().to_string(),
        ]
    };

    // Plan generation and determinism.
    if want("framework") {
        let profiles: Vec<_> = shakedown::profiles::BUILTIN.iter().map(|(n, _)| shakedown::profiles::load(n).unwrap()).collect();
        let t = Instant::now();
        let mut ops = 0usize;
        let mut same = 0usize;
        let n = 500u64;
        for p in &profiles {
            for seed in 0..n {
                let a = generate(seed, p);
                let b = generate(seed, p);
                ops += a.ops.len() + b.ops.len();
                same += usize::from(a == b);
            }
        }
        let rate = ops as f64 / t.elapsed().as_secs_f64();
        let total = n as usize * profiles.len();
        r.row("plan generation", format!("{rate:.0} ops/s"), "≥ 100,000 ops/s");
        r.row("determinism (same seed → same plan)", format!("{same}/{total} seeds × profiles identical"), "all");
        r.json.insert("plan_generation_ops_per_s".into(), json!(rate));
        r.json.insert("determinism".into(), json!({"identical": same, "total": total}));
        // One passing run of the default tier for the per-step costs (alone on the machine).
        let dir = root.join("framework");
        let mut a = vec!["run".to_string(), "--seed".into(), "1".into(), "--steps".into(), "20".into()];
        a.extend(runs_arg(&dir));
        std::fs::create_dir_all(&dir).unwrap();
        let code = run_jobs(&[Job { args: a, log: dir.join("log") }], 1)[0];
        r.json.insert("framework_run_exit".into(), json!(code));
    }

    // Time-to-detect of every planted bug.
    let mut detected_records: BTreeMap<PlantedBug, PathBuf> = BTreeMap::new();
    if want("detect") {
        let mut jobs = Vec::new();
        let mut keys = Vec::new();
        for bug in bugs.iter().copied() {
            for seed in 1..=seeds {
                let dir = root.join("detect").join(bug.name()).join(seed.to_string());
                std::fs::create_dir_all(&dir).unwrap();
                let mut a = vec![
                    "run".to_string(),
                    "--seed".into(),
                    seed.to_string(),
                    "--steps".into(),
                    DETECT_STEPS.to_string(),
                    "--testbed-bug".into(),
                    bug.name().into(),
                ];
                if bug.stack() == shakedown::faults::Stack::ControlPlane {
                    a.extend(["--profile".to_string(), "control-plane".into()]);
                }
                a.extend(runs_arg(&dir));
                jobs.push(Job { args: a, log: dir.join("log") });
                keys.push((bug, seed, dir));
            }
        }
        let t = Instant::now();
        let codes = run_jobs(&jobs, lanes);
        eprintln!("detect: {} runs in {:.0}s", jobs.len(), t.elapsed().as_secs_f64());
        let mut per_bug = serde_json::Map::new();
        for bug in bugs.iter().copied() {
            let mut secs = Vec::new();
            let mut steps = Vec::new();
            let mut found = 0;
            let mut other = Vec::new();
            let mut rows = Vec::new();
            for ((b, seed, dir), code) in keys.iter().zip(&codes) {
                if *b != bug {
                    continue;
                }
                let run = only_run(&dir.join("runs"));
                let ttd = if *code == 1 || *code == 3 { run.as_deref().and_then(time_to_detect) } else { None };
                let record = std::fs::read_dir(dir.join("seeds")).ok().and_then(|mut d| d.next()).and_then(|e| e.ok()).map(|e| e.path());
                // Detected = caught by the invariant the bug breaks; any other failure is listed
                // (a false alarm, or a second symptom) and not counted.
                match &ttd {
                    Some((s, st, inv)) if *inv == bug.caught_by().to_string() => {
                        found += 1;
                        secs.push(*s);
                        steps.push(*st as f64);
                        if let Some(rec) = record {
                            detected_records.entry(bug).or_insert(rec);
                        }
                    }
                    Some((_, st, inv)) => other.push(format!("seed {seed}: {inv} at step {st}")),
                    None => {}
                }
                rows.push(json!({"seed": seed, "exit": code, "seconds": ttd.as_ref().map(|t| t.0), "step": ttd.as_ref().map(|t| t.1), "invariant": ttd.as_ref().map(|t| t.2.clone())}));
            }
            r.row(
                format!("detect {bug}"),
                format!(
                    "{found}/{seeds} seeds · median {} s, {} steps{}",
                    f(median(&secs), 1),
                    f(median(&steps), 0),
                    if other.is_empty() { String::new() } else { format!(" · other failures: {}", other.join("; ")) }
                ),
                "detected in the batch, median ≤ 60 s",
            );
            per_bug.insert(
                bug.name().into(),
                json!({"detected": found, "seeds": seeds, "median_s": median(&secs), "median_steps": median(&steps), "runs": rows}),
            );
        }
        r.json.insert("detect".into(), Value::Object(per_bug));
    }

    // Baselines.
    if want("baselines") {
        // (a) the scripted scenario, replayed from a record.
        let plan = scripted_plan();
        let mut jobs = Vec::new();
        for bug in bugs.iter().copied() {
            let dir = root.join("scripted").join(bug.name());
            std::fs::create_dir_all(&dir).unwrap();
            let rec = dir.join("scripted.toml");
            std::fs::write(&rec, record_for(&plan, bug)).unwrap();
            let mut a = vec!["replay".to_string(), rec.display().to_string()];
            a.extend(runs_arg(&dir));
            jobs.push(Job { args: a, log: dir.join("log") });
        }
        let codes = run_jobs(&jobs, lanes);
        let mut scripted = serde_json::Map::new();
        for (bug, code) in bugs.iter().zip(&codes) {
            let dir = root.join("scripted").join(bug.name());
            let ttd = if *code == 1 || *code == 3 { only_run(&dir.join("runs")).as_deref().and_then(time_to_detect) } else { None };
            let ttd = ttd.filter(|t| t.2 == bug.caught_by().to_string());
            scripted
                .insert(bug.name().into(), json!({"exit": code, "seconds": ttd.as_ref().map(|t| t.0), "step": ttd.as_ref().map(|t| t.1)}));
        }
        r.json.insert(
            "baseline_scripted".into(),
            json!({"plan": plan.ops.iter().map(|o| o.to_string()).collect::<Vec<_>>(), "bugs": scripted}),
        );

        // (b) random crashes, in-process.
        let binaries = discover(&shakedown::profiles::load("default").unwrap().versions, &BinaryOverrides::default())
            .expect("binaries (run scripts/install-deps.sh)");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut crashes = serde_json::Map::new();
        for bug in bugs.iter().copied() {
            let mut results = Vec::new();
            for pair in (1..=seeds).collect::<Vec<_>>().chunks(lanes) {
                let futs: Vec<_> = pair
                    .iter()
                    .map(|&seed| {
                        let run_dir = root.join("crashes").join(bug.name()).join(seed.to_string());
                        std::fs::create_dir_all(&run_dir).unwrap();
                        let cfg = TestbedConfig {
                            run_id: format!("sd-crash{seed}"),
                            run_dir,
                            binaries: binaries.clone(),
                            disks,
                            bug: Some(bug),
                            heartbeat_ms: shakedown::targets::local::HEARTBEAT_MS,
                            election_ms: shakedown::targets::local::ELECTION_MS,
                            stack: bug.stack(),
                            etcd: Default::default(),
                        };
                        random_crashes(cfg, seed)
                    })
                    .collect();
                let got = rt.block_on(async {
                    let mut out = Vec::new();
                    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
                    for h in handles {
                        out.push(h.await.unwrap());
                    }
                    out
                });
                results.extend(got);
            }
            crashes.insert(bug.name().into(), json!(results.iter().map(|(d, s)| json!({"detected": d, "seconds": s})).collect::<Vec<_>>()));
        }
        r.json.insert("baseline_random_crashes".into(), Value::Object(crashes));

        // Side by side: detection rate and time-to-detect ratios against shakedown.
        for bug in bugs.iter().copied() {
            let sd = &r.json.get("detect").and_then(|d| d.get(bug.name())).cloned().unwrap_or(Value::Null);
            let sd_rate = sd["detected"].as_f64().map(|d| d / seeds as f64);
            let sd_s = sd["median_s"].as_f64();
            let sc = &r.json["baseline_scripted"]["bugs"][bug.name()];
            let sc_s = sc["seconds"].as_f64();
            let cr = r.json["baseline_random_crashes"][bug.name()].as_array().cloned().unwrap_or_default();
            let cr_found: Vec<f64> = cr.iter().filter(|x| x["detected"] == true).filter_map(|x| x["seconds"].as_f64()).collect();
            let ratio = |b: Option<f64>| match (sd_s, b) {
                (Some(a), Some(b)) => format!("{:.2}×", b / a),
                _ => "–".into(),
            };
            r.row(
                format!("baselines {bug}"),
                format!(
                    "scripted: {} in {} s ({} shakedown's) · random crashes: {}/{seeds} ({} s, {})",
                    if sc_s.is_some() { "detected" } else { "missed" },
                    f(sc_s, 1),
                    ratio(sc_s),
                    cr_found.len(),
                    f(median(&cr_found), 1),
                    ratio(median(&cr_found)),
                ),
                format!("shakedown: {} of seeds", sd_rate.map(|x| format!("{:.0}%", x * 100.0)).unwrap_or("–".into())),
            );
        }
    }

    // Shrinking each bug's first detected failure.
    if want("shrink") {
        let mut jobs = Vec::new();
        let mut keys = Vec::new();
        for (bug, rec) in &detected_records {
            let dir = root.join("shrink").join(bug.name());
            std::fs::create_dir_all(&dir).unwrap();
            let copy = dir.join("record.toml");
            std::fs::copy(rec, &copy).unwrap();
            let mut a = vec!["shrink".to_string(), copy.display().to_string(), "--max-runs".into(), SHRINK_MAX_RUNS.to_string()];
            a.extend(runs_arg(&dir));
            jobs.push(Job { args: a, log: dir.join("log") });
            keys.push((*bug, copy));
        }
        run_jobs(&jobs, lanes);
        let mut shrunk = serde_json::Map::new();
        let (mut runs_all, mut len_all) = (Vec::new(), Vec::new());
        for (bug, copy) in keys {
            let Ok(rec) = SeedRecord::load(&copy) else { continue };
            let from = rec.failure.step.min(rec.plan.ops.len());
            let (runs, len, complete) = rec.shrunk.as_ref().map_or((0, from, false), |s| (s.runs, s.ops.len(), s.complete));
            runs_all.push(runs as f64);
            len_all.push(len as f64);
            r.row(
                format!("shrink {bug}"),
                format!("{from} → {len} ops in {runs} runs{}", if complete { ", 1-minimal" } else { "" }),
                "≤ 4 ops, ≤ 40 runs",
            );
            shrunk.insert(
                bug.name().into(),
                json!({"from_steps": from, "plan_ops": rec.plan.ops.len(), "to_ops": len, "runs": runs, "complete": complete}),
            );
        }
        r.row(
            "shrink, median over bugs",
            format!("{} ops in {} runs", f(median(&len_all), 0), f(median(&runs_all), 0)),
            "≤ 4 ops, ≤ 40 runs",
        );
        r.json.insert("shrink".into(), Value::Object(shrunk));
    }

    // Shrinking failures of 30 or more steps: for each bug with a cheap trigger, the first smoke
    // plan (40 steps) whose trigger first comes at step 30 or later.
    if want("shrink30") {
        let mut p = shakedown::profiles::load("smoke").unwrap();
        p.steps = 40;
        let cheap = [PlantedBug::EndpointNoHealthCheck, PlantedBug::RecoverLeavesRule, PlantedBug::RestorePartial];
        let mut jobs = Vec::new();
        let mut keys = Vec::new();
        for bug in cheap {
            let trigger_at = |plan: &Plan| plan.ops.iter().position(|o| bug.triggered_by(o));
            let Some(seed) = (1..50_000u64).find(|&s| trigger_at(&generate(s, &p)).is_some_and(|i| (29..36).contains(&i))) else {
                continue;
            };
            let dir = root.join("shrink30").join(bug.name());
            std::fs::create_dir_all(&dir).unwrap();
            let mut a = vec![
                "run".to_string(),
                "--seed".into(),
                seed.to_string(),
                "--steps".into(),
                "40".into(),
                "--profile".into(),
                "smoke".into(),
                "--testbed-bug".into(),
                bug.name().into(),
            ];
            a.extend(runs_arg(&dir));
            jobs.push(Job { args: a, log: dir.join("log") });
            keys.push((bug, seed, dir));
        }
        run_jobs(&jobs, lanes);
        let mut shrink_jobs = Vec::new();
        let mut records = Vec::new();
        for (bug, seed, dir) in &keys {
            let Some(rec) = std::fs::read_dir(dir.join("seeds")).ok().and_then(|mut d| d.next()).and_then(|e| e.ok()).map(|e| e.path())
            else {
                eprintln!("shrink30: {bug} (seed {seed}) was not detected");
                continue;
            };
            let mut a = vec!["shrink".to_string(), rec.display().to_string(), "--max-runs".into(), SHRINK_MAX_RUNS.to_string()];
            a.extend(runs_arg(dir));
            shrink_jobs.push(Job { args: a, log: dir.join("shrink.log") });
            records.push((*bug, *seed, rec));
        }
        run_jobs(&shrink_jobs, lanes);
        let (mut runs_all, mut len_all, mut rows) = (Vec::new(), Vec::new(), Vec::new());
        for (bug, seed, rec) in records {
            let Ok(rec) = SeedRecord::load(&rec) else { continue };
            let Some(s) = rec.shrunk.as_ref() else { continue };
            runs_all.push(s.runs as f64);
            len_all.push(s.ops.len() as f64);
            rows.push(json!({"bug": bug.name(), "seed": seed, "failing_step": rec.failure.step, "to_ops": s.ops.len(), "runs": s.runs, "complete": s.complete}));
            r.row(
                format!("shrink a {}-step failure ({bug})", rec.failure.step),
                format!("→ {} ops in {} runs", s.ops.len(), s.runs),
                "≤ 4 ops, ≤ 40 runs",
            );
        }
        r.row(
            "shrink 30+ step failures, median",
            format!("{} ops in {} runs ({} failures)", f(median(&len_all), 0), f(median(&runs_all), 0), len_all.len()),
            "≤ 4 ops within ≤ 40 runs",
        );
        r.json.insert("shrink30".into(), json!(rows));
    }

    // Soak memory.
    if want("soak") {
        let dir = root.join("soak");
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = vec!["soak".to_string(), "--for".into(), "30s".into(), "--profile".into(), "smoke".into(), "--seed".into(), "1".into()];
        a.extend(runs_arg(&dir));
        run_jobs(&[Job { args: a, log: dir.join("log") }], 1);
        let soak =
            std::fs::read_dir(dir.join("runs")).ok().and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.join("soak.jsonl").is_file()));
        let rows: Vec<Value> = soak
            .map(|s| std::fs::read_to_string(s.join("soak.jsonl")).unwrap_or_default())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        let series = |key: &str| -> Vec<f64> { rows.iter().filter_map(|v| Some(v[key].as_f64()? / 1024.0)).collect() };
        let (rss, anon) = (series("rss_kib"), series("rss_anon_kib"));
        if let (Some(first), Some(last), Some(a0), Some(a1)) = (rss.first(), rss.last(), anon.first(), anon.last()) {
            r.row(
                "soak memory (30 s, smoke)",
                format!(
                    "RSS {first:.1} → {last:.1} MiB ({:+.1}%), heap+stacks {a0:.1} → {a1:.1} MiB ({:+.1}%) after the first of {} seeds",
                    (last / first - 1.0) * 100.0,
                    (a1 / a0 - 1.0) * 100.0,
                    rss.len()
                ),
                "≤ 10% growth",
            );
        }
        r.json.insert("soak_rss_anon_mib".into(), json!(anon));
        r.json.insert("soak_rss_mib".into(), json!(rss));
    }

    // The HTML report of a 1,000-step run: events and workload samples shaped like a real run's
    // (a smoke-profile op per 1.5 s, a write every 5 ms: 300,000 samples), report built 5 times.
    if want("report") {
        let dir = root.join("report");
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = shakedown::profiles::load("smoke").unwrap();
        p.steps = 1000;
        let plan = generate(7, &p);
        std::fs::write(dir.join("plan.toml"), toml::to_string(&plan).unwrap()).unwrap();
        std::fs::write(dir.join("profile.toml"), p.to_toml()).unwrap();
        let t0 = 1_800_000_000_000u64;
        let mut ev = String::new();
        let inv: Vec<Judged> =
            InvariantId::ALL.iter().map(|&i| Judged { invariant: i, verdict: shakedown::events::JudgedVerdict::Pass, us: 12 }).collect();
        let mut line = |ts_ms: u64, event: Event| {
            let _ = writeln!(ev, "{}", serde_json::to_string(&Line { v: shakedown::events::SCHEMA, ts_ms, event }).unwrap());
        };
        line(
            t0,
            Event::RunStart {
                run_id: "sd-report".into(),
                seed: 7,
                profile: p.name.clone(),
                weights: plan.weights.clone(),
                ops: 1000,
                target: TargetSpec::Local(Default::default()),
            },
        );
        for (i, op) in plan.ops.iter().enumerate() {
            let t = t0 + 500 + i as u64 * 1500;
            line(t, Event::OpStart { step: i + 1, op: op.clone(), text: op.to_string(), family: op.kind() });
            line(t + 400, Event::OpEnd { step: i + 1, ms: 400, error: None });
            line(
                t + 420,
                Event::Check(Check {
                    step: i + 1,
                    verdict: CheckVerdict::Pass,
                    attempts: Some(1),
                    ms: Some(20),
                    last_ms: Some(20),
                    invariant: None,
                    message: None,
                    invariants: inv.clone(),
                    serving_samples: None,
                    workload: None,
                    observation: None,
                }),
            );
        }
        line(t0 + 1_500_600, Event::RunEnd { outcome: RunOutcome::Pass, ms: 1_500_600, failure: None });
        std::fs::write(dir.join("events.jsonl"), ev).unwrap();
        let mut csv = String::from("unix_ms,latency_us,ok\n");
        for k in 0..300_000u64 {
            let _ = writeln!(csv, "{},{},{}", t0 + k * 5, 1500 + (k * 7919) % 4000, u8::from(k % 97 != 0));
        }
        std::fs::write(dir.join("workload.csv"), csv).unwrap();
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let html = shakedown::report::html::run_report(&dir, None).unwrap();
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            size = html.len();
        }
        r.row("HTML report of a 1,000-step run", format!("median {} ms ({} KiB, 300k writes)", f(median(&times), 0), size / 1024), "≤ 1 s");
        r.json.insert("report_1000_steps_ms".into(), json!(times));
    }

    // Per-step costs, from every run this benchmark made.
    if want("framework") {
        let all = run_dirs(&root);
        let (mut up, mut down, mut checks, mut overhead, mut verify, mut step_ms) = (Vec::new(), Vec::new(), Vec::new(), 0.0, 0.0, 0.0);
        let mut per_step_ratio = Vec::new();
        for d in &all {
            let ev = events(d);
            let mut op_ms: BTreeMap<usize, f64> = BTreeMap::new();
            for l in &ev {
                match &l.event {
                    Event::BringUp { ms, .. } => up.push(*ms as f64),
                    Event::Teardown { ms, .. } => down.push(*ms as f64),
                    Event::OpEnd { step, ms, .. } => {
                        op_ms.insert(*step, *ms as f64);
                    }
                    Event::Check(c) if c.verdict == CheckVerdict::Pass => {
                        let (Some(ms), Some(last), Some(attempts)) = (c.ms, c.last_ms, c.attempts) else { continue };
                        let (ms, last) = (ms as f64, last as f64);
                        if attempts == 1 {
                            checks.push(ms);
                        }
                        let Some(op) = op_ms.get(&c.step) else { continue };
                        // Waiting beyond convergence: a check that passed at once waited for
                        // nothing; one that had to retry saw the stack converge somewhere in its
                        // last retry interval (50 ms sleep + one observation): half of it, on
                        // average. The observation itself is the checking cost, counted apart.
                        let o = if attempts > 1 { (CHECK_RETRY_MS + last) / 2.0 } else { 0.0 };
                        overhead += o;
                        verify += last;
                        step_ms += op + ms;
                        per_step_ratio.push(o / (op + ms).max(1.0));
                    }
                    _ => {}
                }
            }
        }
        r.row(
            "bring-up (3 members healthy)",
            format!("median {} ms (min {}, max {}), {} runs", f(median(&up), 0), f(pct(&up, 0.0), 0), f(pct(&up, 1.0), 0), up.len()),
            "≤ 2 s",
        );
        r.row(
            "teardown",
            format!("median {} ms (min {}, max {})", f(median(&down), 0), f(pct(&down, 0.0), 0), f(pct(&down, 1.0), 0)),
            "≤ 1 s",
        );
        r.row(
            "invariant checks after a step",
            format!("p50 {} ms, p99 {} ms ({} checks)", f(median(&checks), 1), f(pct(&checks, 0.99), 1), checks.len()),
            "",
        );
        let ratio = overhead / step_ms.max(1.0);
        r.row(
            "framework overhead per step (waiting beyond convergence)",
            format!("{:.1}% of step time (median step {:.1}%)", ratio * 100.0, median(&per_step_ratio).unwrap_or(0.0) * 100.0),
            "≤ 5%",
        );
        r.row("checking cost per step (the confirming observation)", format!("{:.1}% of step time", verify / step_ms.max(1.0) * 100.0), "");
        r.json.insert("checking_cost_ratio".into(), json!(verify / step_ms.max(1.0)));
        r.json.insert("bring_up_ms".into(), json!(up));
        r.json.insert("teardown_ms".into(), json!(down));
        r.json.insert("check_ms_p50_p99".into(), json!([median(&checks), pct(&checks, 0.99)]));
        r.json.insert("framework_overhead_ratio".into(), json!(ratio));
        r.json.insert("framework_overhead_median_step_ratio".into(), json!(median(&per_step_ratio)));
    }

    let total = t_bench.elapsed().as_secs_f64();
    r.row("benchmark wall time", format!("{:.1} min ({lanes} lanes, {seeds} seeds)", total / 60.0), "≤ 15 min");
    r.json.insert("wall_s".into(), json!(total));
    r.json.insert("lanes".into(), json!(lanes));
    r.json.insert("seeds".into(), json!(seeds));
    r.json.insert("disks".into(), json!(format!("{disks:?}").to_lowercase()));
    r.json.insert("when".into(), json!(shakedown::clock::now_rfc3339()));

    let w0 = r.rows.iter().map(|x| x[0].chars().count()).max().unwrap_or(0);
    let w1 = r.rows.iter().map(|x| x[1].chars().count()).max().unwrap_or(0);
    let mut table = String::new();
    let _ = writeln!(table, "{:<w0$}  {:<w1$}  target", "measure", "result");
    for [a, b, c] in &r.rows {
        let _ = writeln!(table, "{a:<w0$}  {b:<w1$}  {c}");
    }
    println!("shakedown benchmark suite · {} · disks {:?}\n{table}", shakedown::clock::now_rfc3339(), disks);
    let mut md = "| measure | result | target |\n|---|---|---|\n".to_string();
    for [a, b, c] in &r.rows {
        let _ = writeln!(md, "| {a} | {b} | {c} |");
    }
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("suite.json"), serde_json::to_string_pretty(&Value::Object(r.json)).unwrap()).unwrap();
    std::fs::write(out.join("suite.md"), md).unwrap();
    println!("written: {} and suite.md", out.join("suite.json").display());
    drop(tmp);
}
