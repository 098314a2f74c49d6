//! Commands: plan, run, replay, testbed, reap, profiles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::json;
use shakedown::binaries::{self, BinaryOverrides};
use shakedown::events::EventLog;
use shakedown::exit::{Exit, Fatal};
use shakedown::faults::{generate, Plan, Profile, Version};
use shakedown::profiles;
use shakedown::record::{now_rfc3339, Expect, Failure, FailureKind, KubeRecord, SeedRecord, FORMAT};
use shakedown::run::{self, Outcome};
use shakedown::target::kube::profile::KubeProfile;
use shakedown::target::kube::{KubeConfig, KubeError, KubeTarget};
use shakedown::target::local::{reap, DiskMode, LocalTarget, PlantedBug, Testbed, TestbedConfig};
use shakedown::target::{Target, TargetError};

#[derive(Parser, Debug)]
#[command(name = "shakedown", version, about = "Seeded fault plans against a real etcd stack: invariants after every step, failing seeds recorded and replayable.", after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

const EXIT_CODES: &str = "Exit codes:\n  0    every invariant held\n  1    an invariant was violated (a seed record was written)\n  2    usage error or bad input (unknown profile, malformed seed record; kube: bad kubeconfig, unknown context, no such Cluster)\n  3    liveness failure: the stack did not converge within a bound\n  4    environment or set-up failure (binary missing, no loop device, port taken; kube: Cluster not opted in, apiserver unreachable, RBAC denied)\n  5    internal error (a bug in shakedown)\n  130  interrupted (Ctrl-C / SIGTERM); the stack was torn down";

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the plan for a seed without running it.
    Plan {
        #[arg(long)]
        seed: u64,
        /// A shipped profile name or a profile .toml file.
        #[arg(long, default_value = "default")]
        profile: String,
        /// Override the profile's plan length.
        #[arg(long)]
        steps: Option<usize>,
        #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
        format: PlanFormat,
    },
    /// Generate a plan from a seed and run it against a target.
    Run {
        /// The stack under test: `local` is the built-in real testbed on this machine.
        #[arg(long, value_enum, default_value_t = TargetKind::Local)]
        target: TargetKind,
        /// The seed (drawn and printed when omitted).
        #[arg(long)]
        seed: Option<u64>,
        /// Override the profile's plan length.
        #[arg(long)]
        steps: Option<usize>,
        /// A shipped profile name (see `shakedown profiles`) or a profile .toml file.
        #[arg(long, default_value = "default")]
        profile: String,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Re-execute the op list of a seed record exactly, and report whether it fails the same way.
    /// Given a directory, replay every record in it against its `expect` ("fail": the failure
    /// still reproduces; "pass": the plan passes) and exit 1 on any mismatch.
    Replay {
        /// A seed record, or a directory of them (a regression corpus).
        file: PathBuf,
        /// Replay N times and report the reproduction rate.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        times: u32,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Run the local stack by hand.
    Testbed {
        #[command(subcommand)]
        action: TestbedAction,
    },
    /// Remove what killed runs left behind (processes, mounts, loop devices, nftables tables) under the runs directory.
    /// With --kube: the objects of killed kube runs (their ConfigMaps; KubeadmControlPlanes they paused).
    Reap {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
        /// Reap on the management cluster of the kubeconfig instead of this machine.
        #[arg(long)]
        kube: bool,
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        #[arg(long)]
        context: Option<String>,
        /// Only this namespace (default: all namespaces).
        #[arg(long)]
        namespace: Option<String>,
        /// Also runs that look alive or ran on another host.
        #[arg(long)]
        all: bool,
    },
    /// List the shipped profiles.
    Profiles,
}

#[derive(Subcommand, Debug)]
pub enum TestbedAction {
    /// Start the stack and leave it running; prints the endpoint.
    Up {
        #[command(flatten)]
        opts: RunOpts,
        /// The profile whose members, sites and versions the stack has.
        #[arg(long, default_value = "default")]
        profile: String,
    },
    /// Tear down the testbed started by `testbed up`.
    Down {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
    },
    /// Show the members and the endpoint of the running testbed.
    Status {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PlanFormat {
    Text,
    Toml,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TargetKind {
    Local,
    /// A Cluster API Cluster on a management cluster (--cluster NS/NAME, kubeconfig).
    Kube,
}

/// The kube target's options.
#[derive(Args, Debug, Clone, Default)]
pub struct KubeOpts {
    /// kube target: the kubeconfig (default: KUBECONFIG, else ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// kube target: the kubeconfig context (default: its current context).
    #[arg(long)]
    context: Option<String>,
    /// kube target: the Cluster API Cluster under test, NAMESPACE/NAME. It must carry the
    /// annotation shakedown.dev/allow-chaos: "true".
    #[arg(long, value_name = "NAMESPACE/NAME")]
    cluster: Option<String>,
    /// kube target: versions, failure domains, hooks, probes and checks (TOML; see the README).
    #[arg(long, value_name = "FILE")]
    kube_profile: Option<PathBuf>,
    /// kube target: print every write request the plan would make, and make none.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args, Debug, Clone)]
pub struct RunOpts {
    /// Where seed records of failing runs are written.
    #[arg(long, env = "SHAKEDOWN_SEEDS_DIR", default_value = "seeds")]
    seeds_dir: PathBuf,
    /// Where run directories (plan, event log, member logs) are created.
    #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
    runs_dir: PathBuf,
    /// Switch on a planted bug in the local target: upgrade-no-wait, replace-keeps-old-member,
    /// endpoint-no-health-check, ack-before-write, recover-leaves-rule,
    /// reattach-on-shutdown-disk, restore-partial (see the README).
    #[arg(long, value_parser = parse_bug)]
    testbed_bug: Option<PlantedBug>,
    /// An etcd binary for a version, e.g. --etcd 3.5=/opt/etcd-3.5/etcd (repeatable).
    #[arg(long = "etcd", value_name = "VERSION=PATH", value_parser = parse_etcd)]
    etcd: Vec<(Version, PathBuf)>,
    /// The haproxy binary.
    #[arg(long, env = "SHAKEDOWN_HAPROXY")]
    haproxy: Option<PathBuf>,
    /// Member disks: loop-mounted ext4 images (root) or plain directories; auto picks.
    #[arg(long, value_enum, default_value_t = DiskArg::Auto)]
    disks: DiskArg,
    #[command(flatten)]
    kube: KubeOpts,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DiskArg {
    Auto,
    Loop,
    Plain,
}

fn parse_bug(s: &str) -> Result<PlantedBug, String> {
    s.parse()
}

fn parse_etcd(s: &str) -> Result<(Version, PathBuf), String> {
    let (v, p) = s.split_once('=').ok_or("expected VERSION=PATH, e.g. 3.5=/usr/local/bin/etcd")?;
    Ok((v.parse()?, PathBuf::from(p)))
}

pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,shakedown=info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => b.with_target(false).init(),
        LogFormat::Json => b.json().init(),
    }
}

pub async fn dispatch(cli: Cli) -> Result<Exit, Fatal> {
    let json_logs = matches!(cli.log_format, LogFormat::Json);
    match cli.command {
        Command::Plan { seed, profile, steps, format } => {
            let profile = with_steps(profiles::load(&profile)?, steps)?;
            let plan = generate(seed, &profile);
            match format {
                PlanFormat::Toml => print!("{}", toml::to_string(&plan).expect("plans serialize")),
                PlanFormat::Text => {
                    println!("seed {} · profile {} · {} ops · weights {}", plan.seed, plan.profile, plan.ops.len(), weights_text(&plan));
                    for (i, op) in plan.ops.iter().enumerate() {
                        println!("{:>4}  {op}", i + 1);
                    }
                }
            }
            Ok(Exit::Pass)
        }
        Command::Run { target: TargetKind::Local, seed, steps, profile, opts } => {
            let profile = with_steps(profiles::load(&profile)?, steps)?;
            let seed = seed.unwrap_or_else(draw_seed);
            let plan = generate(seed, &profile);
            let res = execute_local(&opts, &profile, &plan, opts.testbed_bug, json_logs).await?;
            report_run(&opts, res)
        }
        Command::Run { target: TargetKind::Kube, seed, steps, profile, opts } => {
            let profile = with_steps(profiles::load(&profile)?, steps)?;
            let seed = seed.unwrap_or_else(draw_seed);
            let plan = generate(seed, &profile);
            let kube = kube_record(&opts.kube, None)?;
            if opts.kube.dry_run {
                return dry_run_kube(&opts, &kube, &profile, &plan).await;
            }
            let res = execute_kube(&opts, &kube, &profile, &plan, json_logs).await?;
            report_run(&opts, res)
        }
        Command::Replay { file, times, opts } if file.is_dir() => replay_corpus(&file, times, &opts, json_logs).await,
        Command::Replay { file, times, opts } => replay(&file, times, &opts, json_logs).await.map(|(exit, _)| exit),
        Command::Testbed { action } => testbed(action).await,
        Command::Reap { kube: true, kubeconfig, context, namespace, all, .. } => {
            let r = shakedown::target::kube::reap::reap(kubeconfig.as_deref(), context.as_deref(), namespace.as_deref(), all).await.map_err(kube_fatal)?;
            for c in &r.configmaps {
                println!("deleted run ConfigMap {c}");
            }
            for k in &r.resumed {
                println!("resumed KubeadmControlPlane {k}");
            }
            println!("reaped {} kube run(s)", r.configmaps.len());
            Ok(Exit::Pass)
        }
        Command::Reap { runs_dir, .. } => {
            let n = reap_runs(&runs_dir)?;
            println!("reaped {n} run director{}", if n == 1 { "y" } else { "ies" });
            Ok(Exit::Pass)
        }
        Command::Profiles => {
            for (name, text) in profiles::BUILTIN {
                let p = profiles::parse(text)?;
                println!("{name:<10} {}", p.description);
            }
            Ok(Exit::Pass)
        }
    }
}

fn with_steps(mut p: Profile, steps: Option<usize>) -> Result<Profile, Fatal> {
    if let Some(s) = steps {
        if s == 0 {
            return Err(Fatal::usage("--steps must be at least 1"));
        }
        p.steps = s;
    }
    Ok(p)
}

fn weights_text(plan: &Plan) -> String {
    plan.weights.iter().map(|(k, w)| format!("{k}={w}")).collect::<Vec<_>>().join(" ")
}

/// A seed for runs that were not given one. It is printed before anything runs.
fn draw_seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0) as u64;
    let mut x = nanos ^ ((std::process::id() as u64) << 32);
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

fn new_run_id() -> String {
    format!("sd-{:08x}", draw_seed() as u32)
}

/// What one execution produced.
struct RunResult {
    outcome: Result<Outcome, Interrupted>,
    run_id: String,
    run_dir: PathBuf,
    started: String,
    versions: BTreeMap<String, String>,
    profile: Profile,
    plan: Plan,
    bug: Option<PlantedBug>,
    kube: Option<KubeRecord>,
}

#[derive(Debug)]
struct Interrupted;

fn create_run_dir(runs_dir: &Path, run_id: &str) -> Result<PathBuf, Fatal> {
    let dir = runs_dir.join(run_id);
    std::fs::create_dir_all(&dir).map_err(|e| Fatal::environment(format!("cannot create run directory {}: {e}", dir.display())))?;
    let dir = dir.canonicalize().map_err(|e| Fatal::environment(format!("cannot resolve {}: {e}", dir.display())))?;
    let owner = json!({"run_id": run_id, "pid": std::process::id(), "started": now_rfc3339(), "shakedown_version": env!("CARGO_PKG_VERSION")});
    std::fs::write(dir.join("run.json"), owner.to_string()).map_err(|e| Fatal::environment(format!("cannot write run.json: {e}")))?;
    Ok(dir)
}

/// Checks the machine can run the stack (binaries, disks) before anything is created.
fn environment(opts: &RunOpts, profile: &Profile) -> Result<(binaries::Binaries, DiskMode), Fatal> {
    let overrides = BinaryOverrides { etcd: opts.etcd.iter().cloned().collect(), haproxy: opts.haproxy.clone() };
    let binaries = binaries::discover(&profile.versions, &overrides)?;
    let (detected, why) = DiskMode::detect();
    let disks = match opts.disks {
        DiskArg::Auto => {
            if let Some(why) = why {
                tracing::warn!("{why}");
            }
            detected
        }
        DiskArg::Loop if detected != DiskMode::Loop => {
            return Err(Fatal::environment(format!("--disks loop is not possible here: {}", why.unwrap_or_default())))
        }
        DiskArg::Loop => DiskMode::Loop,
        DiskArg::Plain => DiskMode::Plain,
    };
    Ok((binaries, disks))
}

fn testbed_config(env: (binaries::Binaries, DiskMode), run_id: &str, run_dir: &Path, bug: Option<PlantedBug>) -> TestbedConfig {
    let (binaries, disks) = env;
    TestbedConfig { run_id: run_id.into(), run_dir: run_dir.into(), binaries, disks, bug, heartbeat_ms: 50, election_ms: 500 }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// Runs `plan` on a fresh local stack; tears it down whatever happens.
async fn execute_local(opts: &RunOpts, profile: &Profile, plan: &Plan, bug: Option<PlantedBug>, json_logs: bool) -> Result<RunResult, Fatal> {
    let invariants = profiles::invariants(profile)?;
    let env = environment(opts, profile)?;
    let run_id = new_run_id();
    let run_dir = create_run_dir(&opts.runs_dir, &run_id)?;
    // The plan is on disk before anything executes.
    std::fs::write(run_dir.join("plan.toml"), toml::to_string(plan).expect("plans serialize"))
        .and_then(|_| std::fs::write(run_dir.join("profile.toml"), profile.to_toml()))
        .map_err(|e| Fatal::environment(format!("cannot write the plan into {}: {e}", run_dir.display())))?;
    let started = now_rfc3339();
    let bug_text = bug.map(|b| format!(" · planted bug {b}")).unwrap_or_default();
    progress_line(
        json_logs,
        &format!("seed {} · profile {} · {} ops · run {run_id}{bug_text}\nweights {}\nrun directory {}", plan.seed, profile.name, plan.ops.len(), weights_text(plan), run_dir.display()),
    );
    let cfg = testbed_config(env, &run_id, &run_dir, bug);
    let mut events = EventLog::create(&run_dir.join("events.jsonl"));
    events.emit("run-start", json!({"run_id": run_id, "seed": plan.seed, "profile": profile.name, "weights": plan.weights, "ops": plan.ops.len(), "testbed_bug": bug}));
    let model = profile.initial_model();
    let t0 = std::time::Instant::now();
    let mut target = tokio::select! {
        t = LocalTarget::start(cfg, profile, &model, Duration::from_secs(30)) => t.map_err(|e| Fatal::environment(format!("cannot bring the local stack up: {e}")))?,
        _ = shutdown_signal() => {
            return Ok(RunResult { outcome: Err(Interrupted), run_id, run_dir, started, versions: BTreeMap::new(), profile: profile.clone(), plan: plan.clone(), bug, kube: None });
        }
    };
    let bring_up_ms = t0.elapsed().as_millis();
    events.emit("bring-up", json!({"ms": bring_up_ms as u64, "endpoint": target.testbed.endpoint_url()}));
    progress_line(json_logs, &format!("stack up in {bring_up_ms}ms · endpoint {}", target.testbed.endpoint_url()));
    let versions = target.component_versions();
    let mut progress = |l: &str| progress_line(json_logs, l);
    let outcome = tokio::select! {
        r = run::execute(&mut target, plan, profile, &invariants, &mut events, &mut progress) => Some(r),
        _ = shutdown_signal() => None,
    };
    let t_down = std::time::Instant::now();
    target.teardown().await;
    events.emit("teardown", json!({"ms": t_down.elapsed().as_millis() as u64, "workload": target.workload_stats()}));
    let outcome = match outcome {
        None => {
            progress_line(json_logs, "interrupted: the stack was torn down");
            Err(Interrupted)
        }
        Some(Ok(o)) => Ok(o),
        Some(Err(TargetError::Unsupported(m))) => return Err(Fatal::usage(m)),
        Some(Err(e)) => return Err(Fatal::environment(e.to_string())),
    };
    events.emit("run-end", json!({"outcome": format!("{outcome:?}")}));
    Ok(RunResult { outcome, run_id, run_dir, started, versions, profile: profile.clone(), plan: plan.clone(), bug, kube: None })
}

fn progress_line(json_logs: bool, text: &str) {
    if json_logs {
        tracing::info!(progress = text);
    } else {
        eprintln!("{text}");
    }
}

fn exit_for(f: &Failure) -> Exit {
    match f.kind {
        FailureKind::Violation => Exit::Violation,
        FailureKind::Liveness => Exit::Liveness,
    }
}

fn describe(f: &Failure) -> String {
    let what = match (f.kind, f.invariant) {
        (FailureKind::Violation, Some(i)) => format!("invariant {i} violated"),
        (FailureKind::Liveness, _) => "liveness failure".into(),
        (FailureKind::Violation, None) => "violation".into(),
    };
    format!("{what} at step {} ({}): {}", f.step, f.op, f.message)
}

fn record_of(r: &RunResult, failure: &Failure) -> SeedRecord {
    SeedRecord {
        format: FORMAT,
        shakedown_version: env!("CARGO_PKG_VERSION").into(),
        seed: r.plan.seed,
        target: if r.kube.is_some() { "kube".into() } else { "local".into() },
        run_id: r.run_id.clone(),
        started: r.started.clone(),
        testbed_bug: r.bug,
        expect: Expect::Fail,
        versions: r.versions.clone(),
        failure: failure.clone(),
        profile: r.profile.clone(),
        plan: r.plan.clone(),
        kube: r.kube.clone(),
    }
}

fn report_run(opts: &RunOpts, r: RunResult) -> Result<Exit, Fatal> {
    match &r.outcome {
        Err(Interrupted) => {
            println!("interrupted; plan and logs are in {}", r.run_dir.display());
            Ok(Exit::Interrupted)
        }
        Ok(Outcome::Pass { steps }) => {
            println!("PASS: seed {} · {steps} steps · every invariant held after every step, and the healed stack converged", r.plan.seed);
            println!("run directory: {}", r.run_dir.display());
            Ok(Exit::Pass)
        }
        Ok(Outcome::Failed(f)) => {
            println!("FAIL: seed {} · {}", r.plan.seed, describe(f));
            println!("run directory: {}", r.run_dir.display());
            let record = record_of(&r, f);
            let path = match record.write(&opts.seeds_dir) {
                Ok(p) => p,
                Err(e) => {
                    // Never lose the sequence: fall back to the run directory.
                    eprintln!("warning: cannot write the seed record into {}: {e}; writing it into the run directory", opts.seeds_dir.display());
                    record.write(&r.run_dir).map_err(|e| Fatal::environment(format!("cannot write the seed record: {e}")))?
                }
            };
            println!("seed record: {}", path.display());
            println!("shakedown replay {}{}", path.display(), kube_replay_flags(&opts.kube, r.kube.as_ref()));
            Ok(exit_for(f))
        }
    }
}

/// Replays one record `times` times; returns the exit code of the outcome and how many runs
/// reproduced the recorded failure (`None` when interrupted).
async fn replay(file: &Path, times: u32, opts: &RunOpts, json_logs: bool) -> Result<(Exit, Option<u32>), Fatal> {
    let record = SeedRecord::load(file)?;
    replay_record(file, &record, times, opts, json_logs).await
}

async fn replay_record(file: &Path, record: &SeedRecord, times: u32, opts: &RunOpts, json_logs: bool) -> Result<(Exit, Option<u32>), Fatal> {
    let bug = opts.testbed_bug.or(record.testbed_bug);
    let expected = &record.failure;
    println!("replaying {} · seed {} · {} ops · recorded: {}", file.display(), record.seed, record.plan.ops.len(), describe(expected));
    let mut reproduced = 0;
    let mut exit = Exit::Pass;
    let kube = match (&record.kube, record.target.as_str()) {
        (Some(k), _) => Some(kube_record(&opts.kube, Some(k))?),
        (None, "kube") => return Err(Fatal::usage(format!("{}: a kube record without its [kube] table", file.display()))),
        (None, _) => None,
    };
    for i in 1..=times {
        let r = match &kube {
            Some(k) => execute_kube(opts, k, &record.profile, &record.plan, json_logs).await?,
            None => execute_local(opts, &record.profile, &record.plan, bug, json_logs).await?,
        };
        let verdict = match &r.outcome {
            Err(Interrupted) => {
                println!("interrupted after {} of {times} replays", i - 1);
                return Ok((Exit::Interrupted, None));
            }
            Ok(Outcome::Pass { .. }) => "did not reproduce: every invariant held".to_string(),
            Ok(Outcome::Failed(f)) => {
                exit = exit_for(f);
                if f.kind == expected.kind && f.step == expected.step && f.invariant == expected.invariant {
                    reproduced += 1;
                    format!("reproduced: {}", describe(f))
                } else {
                    format!("failed differently: {}", describe(f))
                }
            }
        };
        println!("replay {i}/{times}: {verdict} (run directory {})", r.run_dir.display());
    }
    println!("reproduced {reproduced} of {times} ({:.0}%)", 100.0 * reproduced as f64 / times as f64);
    Ok((exit, Some(reproduced)))
}

/// Replays every record of a corpus directory against its expectation. Every record is checked
/// before anything runs.
async fn replay_corpus(dir: &Path, times: u32, opts: &RunOpts, json_logs: bool) -> Result<Exit, Fatal> {
    let records = SeedRecord::load_dir(dir)?;
    let mut mismatched = Vec::new();
    for (path, record) in &records {
        let (exit, reproduced) = replay_record(path, record, times, opts, json_logs).await?;
        let Some(reproduced) = reproduced else { return Ok(Exit::Interrupted) };
        let as_expected = match record.expect {
            Expect::Fail => reproduced > 0,
            Expect::Pass => exit == Exit::Pass,
        };
        let expect = format!("{:?}", record.expect).to_lowercase();
        println!("{}: expect {expect}: {}", path.display(), if as_expected { "as expected" } else { "MISMATCH" });
        if !as_expected {
            mismatched.push(path.display().to_string());
        }
    }
    println!("corpus {}: {} records, {} as expected, {} mismatched", dir.display(), records.len(), records.len() - mismatched.len(), mismatched.len());
    for m in &mismatched {
        println!("mismatch: {m}");
    }
    Ok(if mismatched.is_empty() { Exit::Pass } else { Exit::Violation })
}

fn current_testbed(runs_dir: &Path) -> Result<PathBuf, Fatal> {
    let ptr = runs_dir.join("current-testbed");
    let dir = std::fs::read_to_string(&ptr).map_err(|_| Fatal::usage(format!("no testbed is up (no {}): start one with `shakedown testbed up`", ptr.display())))?;
    Ok(PathBuf::from(dir.trim()))
}

async fn testbed(action: TestbedAction) -> Result<Exit, Fatal> {
    match action {
        TestbedAction::Up { opts, profile } => {
            let profile = profiles::load(&profile)?;
            if let Ok(dir) = current_testbed(&opts.runs_dir) {
                if dir.exists() {
                    return Err(Fatal::usage(format!("a testbed is already up in {}: `shakedown testbed down` first", dir.display())));
                }
            }
            let env = environment(&opts, &profile)?;
            let run_id = new_run_id();
            let run_dir = create_run_dir(&opts.runs_dir, &run_id)?;
            let cfg = testbed_config(env, &run_id, &run_dir, opts.testbed_bug);
            let tb = Testbed::up(cfg, &profile.initial_model(), Duration::from_secs(30)).await.map_err(|e| Fatal::environment(format!("cannot bring the local stack up: {e}")))?;
            std::fs::write(opts.runs_dir.join("current-testbed"), run_dir.to_string_lossy().as_bytes()).map_err(|e| Fatal::environment(e.to_string()))?;
            println!("testbed {run_id} up in {}", run_dir.display());
            println!("endpoint  {}", tb.endpoint_url());
            for m in tb.members.values() {
                println!("{:<9} {} (site {}, etcd {}, data {})", m.name(), m.client_url(), m.site.0, m.version, m.disk.data_dir().display());
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
            println!("testbed down: {} processes, {} mounts, {} loop devices removed", swept.processes.len(), swept.mounts.len(), swept.loops.len());
            Ok(Exit::Pass)
        }
        TestbedAction::Status { runs_dir } => {
            let dir = current_testbed(&runs_dir)?;
            let cfg = std::fs::read_to_string(dir.join("haproxy.cfg")).map_err(|e| Fatal::usage(format!("testbed in {} has no haproxy.cfg: {e}", dir.display())))?;
            let mut all_ok = true;
            for line in cfg.lines().map(str::trim) {
                let parts: Vec<&str> = line.split_whitespace().collect();
                let (name, addr) = match parts.as_slice() {
                    ["bind", addr] => ("endpoint", *addr),
                    ["server", name, addr, ..] => (*name, *addr),
                    _ => continue,
                };
                let url = format!("http://{addr}");
                match shakedown::target::local::etcd::status(&url, Duration::from_secs(1)).await {
                    Ok(s) => println!("{name:<9} {url:<28} ok   etcd {} leader {:x} revision {}", s.version(), s.leader(), s.header().map(|h| h.revision()).unwrap_or(0)),
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

/// Sweeps every run directory whose owner process is gone.
fn reap_runs(runs_dir: &Path) -> Result<usize, Fatal> {
    let Ok(entries) = std::fs::read_dir(runs_dir) else { return Ok(0) };
    let mut n = 0;
    for e in entries.filter_map(|e| e.ok()) {
        let dir = e.path();
        let Ok(owner) = std::fs::read_to_string(dir.join("run.json")) else { continue };
        let owner: serde_json::Value = serde_json::from_str(&owner).unwrap_or_default();
        let pid = owner.get("pid").and_then(|p| p.as_u64()).unwrap_or(0);
        let alive = pid != 0
            && pid != std::process::id() as u64
            && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("shakedown"));
        if alive {
            continue;
        }
        let dir = dir.canonicalize().unwrap_or(dir);
        let swept = reap::sweep(&dir);
        let had_disks = dir.join("disks").exists() || dir.join("members").exists();
        let _ = std::fs::remove_dir_all(dir.join("disks"));
        let _ = std::fs::remove_dir_all(dir.join("members"));
        if !swept.is_empty() || had_disks {
            println!("{}: {} processes, {} mounts, {} loop devices", dir.display(), swept.processes.len(), swept.mounts.len(), swept.loops.len());
            n += 1;
        }
    }
    Ok(n)
}

fn kube_fatal(e: KubeError) -> Fatal {
    match e {
        KubeError::Usage(m) => Fatal::usage(m),
        KubeError::Refused(m) | KubeError::Environment(m) => Fatal::environment(m),
    }
}

/// The Cluster and kube profile of a kube run: from the flags, else from the record replayed.
fn kube_record(opts: &KubeOpts, recorded: Option<&KubeRecord>) -> Result<KubeRecord, Fatal> {
    let cluster = match (&opts.cluster, recorded) {
        (Some(c), _) => c.clone(),
        (None, Some(r)) => r.cluster.clone(),
        (None, None) => return Err(Fatal::usage("--target kube needs --cluster NAMESPACE/NAME (the Cluster API Cluster under test)")),
    };
    match cluster.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {}
        _ => return Err(Fatal::usage(format!("--cluster {cluster:?}: expected NAMESPACE/NAME"))),
    }
    let kube_profile = match (&opts.kube_profile, recorded) {
        (Some(p), _) => KubeProfile::load(p).map_err(Fatal::usage)?,
        (None, Some(r)) => r.kube_profile.clone(),
        (None, None) => KubeProfile::default(),
    };
    let context = opts.context.clone().or_else(|| recorded.and_then(|r| r.context.clone()));
    Ok(KubeRecord { cluster, context, kube_profile })
}

fn kube_replay_flags(opts: &KubeOpts, kube: Option<&KubeRecord>) -> String {
    if kube.is_none() {
        return String::new();
    }
    opts.kubeconfig.as_ref().map(|k| format!(" --kubeconfig {}", k.display())).unwrap_or_default()
}

fn kube_config(opts: &RunOpts, kube: &KubeRecord, run_id: &str) -> KubeConfig {
    let (ns, name) = kube.cluster.split_once('/').expect("checked by kube_record");
    KubeConfig {
        kubeconfig: opts.kube.kubeconfig.clone(),
        context: kube.context.clone(),
        namespace: ns.into(),
        name: name.into(),
        dry_run: opts.kube.dry_run,
        profile: kube.kube_profile.clone(),
        run_id: run_id.into(),
    }
}

/// The invariants the kube target can observe: consistency and durability need etcd itself (not
/// reached by the kube target), reachability needs a probe or check in the kube profile.
fn kube_invariants(profile: &Profile, kube: &KubeRecord) -> Result<(Vec<shakedown::invariants::InvariantId>, Vec<String>), Fatal> {
    use shakedown::invariants::InvariantId;
    let p = &kube.kube_profile;
    let mut dropped = Vec::new();
    let ids = profiles::invariants(profile)?
        .into_iter()
        .filter(|id| {
            let keep = match id {
                InvariantId::Consistency | InvariantId::Durability => false,
                InvariantId::Reachability => !(p.probes.is_empty() && p.commands.is_empty() && p.conditions.is_empty()),
                _ => true,
            };
            if !keep {
                dropped.push(id.to_string());
            }
            keep
        })
        .collect();
    Ok((ids, dropped))
}

/// `--dry-run`: reads the Cluster, then prints every write each op would make, and makes none.
async fn dry_run_kube(opts: &RunOpts, kube: &KubeRecord, profile: &Profile, plan: &Plan) -> Result<Exit, Fatal> {
    let run_id = new_run_id();
    let model = profile.initial_model();
    let mut target = KubeTarget::connect(kube_config(opts, kube, &run_id), profile, &model).await.map_err(kube_fatal)?;
    println!("dry run: seed {} · profile {} · {} ops · Cluster {} · no request below is sent", plan.seed, profile.name, plan.ops.len(), kube.cluster);
    for (m, machine) in target.bindings() {
        println!("member {m} = Machine {machine}");
    }
    let mut model = model;
    for (i, op) in plan.ops.iter().enumerate() {
        println!("step {}: {op}", i + 1);
        if let Err(reason) = target.supports(op) {
            println!("  skipped: {reason}");
            continue;
        }
        let before = model.clone();
        if model.apply(op).is_err() {
            println!("  skipped: an earlier op was skipped");
            continue;
        }
        target.execute(op, &before, &model).await.map_err(|e| Fatal::environment(e.to_string()))?;
    }
    target.teardown().await;
    println!("dry run: {} write request(s) printed, none sent", target.dry_run_writes.len());
    Ok(Exit::Pass)
}

/// Runs `plan` against the Cluster; resumes what it paused and removes its objects whatever happens.
async fn execute_kube(opts: &RunOpts, kube: &KubeRecord, profile: &Profile, plan: &Plan, json_logs: bool) -> Result<RunResult, Fatal> {
    let (invariants, dropped) = kube_invariants(profile, kube)?;
    let run_id = new_run_id();
    let run_dir = create_run_dir(&opts.runs_dir, &run_id)?;
    std::fs::write(run_dir.join("plan.toml"), toml::to_string(plan).expect("plans serialize"))
        .and_then(|_| std::fs::write(run_dir.join("profile.toml"), profile.to_toml()))
        .map_err(|e| Fatal::environment(format!("cannot write the plan into {}: {e}", run_dir.display())))?;
    let started = now_rfc3339();
    progress_line(
        json_logs,
        &format!("seed {} · profile {} · {} ops · run {run_id} · Cluster {}\nweights {}\nrun directory {}", plan.seed, profile.name, plan.ops.len(), kube.cluster, weights_text(plan), run_dir.display()),
    );
    if !dropped.is_empty() {
        progress_line(json_logs, &format!("not checked on the kube target: {} (consistency and durability need etcd access; reachability needs probes or checks in the kube profile)", dropped.join(", ")));
    }
    let mut events = EventLog::create(&run_dir.join("events.jsonl"));
    events.emit("run-start", json!({"run_id": run_id, "seed": plan.seed, "profile": profile.name, "weights": plan.weights, "ops": plan.ops.len(), "target": "kube", "cluster": kube.cluster}));
    let model = profile.initial_model();
    let t0 = std::time::Instant::now();
    let mut target = tokio::select! {
        t = KubeTarget::connect(kube_config(opts, kube, &run_id), profile, &model) => t.map_err(kube_fatal)?,
        _ = shutdown_signal() => {
            return Ok(RunResult { outcome: Err(Interrupted), run_id, run_dir, started, versions: BTreeMap::new(), profile: profile.clone(), plan: plan.clone(), bug: None, kube: Some(kube.clone()) });
        }
    };
    let bindings: Vec<String> = target.bindings().iter().map(|(m, n)| format!("{m}={n}")).collect();
    events.emit("bring-up", json!({"ms": t0.elapsed().as_millis() as u64, "bindings": bindings}));
    progress_line(json_logs, &format!("connected in {}ms · members {}", t0.elapsed().as_millis(), bindings.join(" ")));
    let versions = target.component_versions();
    let mut progress = |l: &str| progress_line(json_logs, l);
    let outcome = tokio::select! {
        r = run::execute(&mut target, plan, profile, &invariants, &mut events, &mut progress) => Some(r),
        _ = shutdown_signal() => None,
    };
    let t_down = std::time::Instant::now();
    target.teardown().await;
    for (kind, fields) in target.take_events() {
        events.emit(&kind, fields);
    }
    events.emit("teardown", json!({"ms": t_down.elapsed().as_millis() as u64, "requests": target.counter.snapshot()}));
    let outcome = match outcome {
        None => {
            progress_line(json_logs, "interrupted: shakedown's objects were removed and the control plane resumed");
            Err(Interrupted)
        }
        Some(Ok(o)) => Ok(o),
        Some(Err(TargetError::Unsupported(m))) => return Err(Fatal::usage(m)),
        Some(Err(e)) => return Err(Fatal::environment(e.to_string())),
    };
    events.emit("run-end", json!({"outcome": format!("{outcome:?}")}));
    Ok(RunResult { outcome, run_id, run_dir, started, versions, profile: profile.clone(), plan: plan.clone(), bug: None, kube: Some(kube.clone()) })
}
