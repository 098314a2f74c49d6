//! One execution of a plan on a fresh target, and what it leaves behind on purpose: the run
//! directory (plan, profile, event log, workload samples, member logs), the reports (JUnit XML,
//! HTML), forensics and a seed record when it fails. Used by run, replay, shrink and soak.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::clock::now_rfc3339;
use crate::engine::{self, Engine, EngineError, Outcome};
use crate::events::{Event, EventLog, RunOutcome};
use crate::exit::{Exit, Fatal};
use crate::faults::{Plan, Profile};
use crate::invariants::InvariantId;
use crate::profiles;
use crate::record::{Expect, Failure, FailureKind, SeedRecord, FORMAT};
use crate::report::{self, Case, CaseOutcome};
use crate::targets::{self, Coverage, StartContext, TargetError, TargetSpec};
use serde_json::json;
use tokio::sync::watch;

use super::RunOpts;

/// Ctrl-C / SIGTERM, counted. The first asks the run to stop before its next step (the current
/// step finishes and is checked, then the stack is torn down); the second stops at once (the
/// stack is still torn down).
#[derive(Clone)]
pub struct Interrupt {
    rx: watch::Receiver<u32>,
}

impl Interrupt {
    /// Starts listening for SIGINT and SIGTERM. `quiet` keeps the notice off stderr (JSON logs).
    pub fn install(json_logs: bool) -> Interrupt {
        let (tx, rx) = watch::channel(0u32);
        tokio::spawn(async move {
            loop {
                shutdown_signal().await;
                tx.send_modify(|n| *n += 1);
                let msg = if *tx.borrow() == 1 {
                    "stopping after the current step (Ctrl-C again to stop at once; the stack is torn down either way)"
                } else {
                    "stopping now: tearing the stack down"
                };
                progress_line(json_logs, msg);
            }
        });
        Interrupt { rx }
    }

    /// This interrupt, plus one soft stop request at `deadline` (a soak's time being up).
    pub fn until(&self, deadline: tokio::time::Instant) -> Interrupt {
        let (tx, rx) = watch::channel(*self.rx.borrow());
        let mut src = self.rx.clone();
        tokio::spawn(async move {
            let mut due = true;
            loop {
                tokio::select! {
                    changed = src.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let n = *src.borrow();
                        tx.send_modify(|c| *c = (*c).max(n));
                    }
                    _ = tokio::time::sleep_until(deadline), if due => {
                        due = false;
                        tx.send_modify(|c| *c = (*c).max(1));
                    }
                    _ = tx.closed() => break,
                }
            }
        });
        Interrupt { rx }
    }

    pub fn requested(&self) -> bool {
        *self.rx.borrow() > 0
    }

    pub fn receiver(&self) -> watch::Receiver<u32> {
        self.rx.clone()
    }

    /// Resolves when `n` signals have arrived.
    pub async fn count(&self, n: u32) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|c| *c >= n).await;
        if *rx.borrow() < n {
            // The listener is gone (runtime shutting down): never resolve.
            std::future::pending::<()>().await;
        }
    }
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

pub fn progress_line(json_logs: bool, text: &str) {
    if json_logs {
        tracing::info!(progress = text);
    } else {
        eprintln!("{text}");
    }
}

/// What one execution produced.
pub struct RunResult {
    /// `Err` when interrupted before the run could start or stop cleanly at a step.
    pub outcome: Result<Outcome, Interrupted>,
    pub run_id: String,
    pub run_dir: PathBuf,
    pub started: String,
    pub elapsed: Duration,
    pub versions: BTreeMap<String, String>,
    pub profile: Profile,
    pub plan: Plan,
    /// The stack the plan ran on.
    pub spec: TargetSpec,
    /// The seed record written for a failure, or the record this run replays.
    pub record: Option<PathBuf>,
    /// The invariants the profile selects that the target cannot check here, with the reason.
    pub unchecked: Vec<(InvariantId, String)>,
    /// The known defects of the stack's releases the checks saw (each once), not failures.
    pub known: Vec<shakedown_invariants::KnownDefect>,
}

pub use crate::report::unchecked_text;

#[derive(Debug)]
pub struct Interrupted;

/// How to execute and what to keep.
pub struct Exec<'a> {
    pub opts: &'a RunOpts,
    pub json_logs: bool,
    pub interrupt: &'a Interrupt,
    /// Where run directories go (`--runs-dir`, or a soak's / shrink's own directory).
    pub runs_dir: &'a Path,
    /// Write a seed record when the run fails.
    pub record: bool,
    /// Per-step progress lines on stderr (off for shrink candidates).
    pub verbose: bool,
    /// A soak's progress bar: step lines become its message instead of stderr lines.
    pub bar: Option<indicatif::ProgressBar>,
    pub skip_liveness: bool,
    /// The record being replayed: a failure's JUnit message ends with its replay command.
    pub replaying: Option<&'a Path>,
}

impl Exec<'_> {
    /// A progress line: on stderr, or as the soak bar's message, or nowhere (shrink candidates).
    /// A dry run's lines go to stdout: they are its output.
    pub fn say(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(text.lines().next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" ")),
            None if self.verbose && self.opts.target.kube.dry_run => println!("{text}"),
            None if self.verbose => progress_line(self.json_logs, text),
            None => {}
        }
    }
}

pub fn new_run_id() -> String {
    format!("sd-{:08x}", super::draw_seed() as u32)
}

pub fn create_run_dir(runs_dir: &Path, run_id: &str) -> Result<PathBuf, Fatal> {
    let dir = runs_dir.join(run_id);
    // 0700: it holds the run's keys and tokens (a stack's admin token while it runs).
    crate::private::dir(&dir).map_err(|e| Fatal::environment(format!("cannot create run directory {}: {e}", dir.display())))?;
    let dir = dir.canonicalize().map_err(|e| Fatal::environment(format!("cannot resolve {}: {e}", dir.display())))?;
    let owner =
        json!({"run_id": run_id, "pid": std::process::id(), "started": now_rfc3339(), "shakedown_version": env!("CARGO_PKG_VERSION")});
    std::fs::write(dir.join("run.json"), owner.to_string()).map_err(|e| Fatal::environment(format!("cannot write run.json: {e}")))?;
    Ok(dir)
}

/// A run whose target did not start and wrote nothing into its directory — a kubeconfig that
/// does not parse, an apiserver that does not answer, a Cluster that does not fit the profile —
/// leaves no directory behind: it held only what the session wrote before the start (plan,
/// profile, owner, an event log with `run-start`). A target that wrote anything (the local
/// stack's logs of an etcd that would not start) keeps it, for the diagnosis.
fn remove_if_unstarted(run_dir: &Path) -> bool {
    remove_if_holding_only(run_dir, &["plan.toml", "profile.toml", "run.json", "events.jsonl"])
}

/// Removes `dir` when every file in it is one of `names` (what was written before anything
/// started); whether it was removed.
pub fn remove_if_holding_only(dir: &Path, names: &[&str]) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    if entries.flatten().all(|e| e.file_name().to_str().is_some_and(|n| names.contains(&n))) {
        return std::fs::remove_dir_all(dir).is_ok();
    }
    false
}

/// The command that replays a run's seed record, with the flags its target needs again.
pub fn replay_command(r: &RunResult, opts: &RunOpts) -> Option<String> {
    r.record.as_ref().map(|p| format!("shakedown replay {}{}", p.display(), r.spec.replay_flags(&opts.target)))
}

pub fn weights_text(plan: &Plan) -> String {
    plan.weights.iter().map(|(k, w)| format!("{k}={w}")).collect::<Vec<_>>().join(" ")
}

/// etcd's flags a plan runs with under `profile` (pinned and drawn), as the first lines of a run
/// and `shakedown plan` print them beside the weights; empty when it sets none.
pub fn etcd_text(plan: &Plan, profile: &Profile) -> String {
    plan.etcd_flags(profile).summary()
}

/// Runs `plan` on a fresh target of `spec` and tears it down whatever happens; then writes the
/// reports (and the seed record, when asked and the run failed). The one path every command
/// (run, replay, shrink, soak) takes on every target.
pub async fn execute(x: &Exec<'_>, spec: &TargetSpec, profile: &Profile, plan: &Plan) -> Result<RunResult, Fatal> {
    let wanted = profiles::invariants(profile)?;
    // The profile as this plan runs it: etcd's flags the plan carries (drawn per seed) in its
    // `[etcd]`, for the model, the target and the engine. The run directory and the seed record
    // keep `profile` itself, beside the plan.
    let used = plan.run_profile(profile);
    let prepared = targets::prepare(spec, &x.opts.target, &used)?;
    let run_id = new_run_id();
    // A runs directory this run creates goes again with an unstarted run's own.
    let runs_dir_existed = x.runs_dir.exists();
    let run_dir = create_run_dir(x.runs_dir, &run_id)?;
    // The plan is on disk before anything executes.
    std::fs::write(run_dir.join("plan.toml"), toml::to_string(plan).expect("plans serialize"))
        .and_then(|_| std::fs::write(run_dir.join("profile.toml"), profile.to_toml()))
        .map_err(|e| Fatal::environment(format!("cannot write the plan into {}: {e}", run_dir.display())))?;
    let started = now_rfc3339();
    let t0 = std::time::Instant::now();
    // etcd's flags matter only to the target that runs etcd of its own.
    let etcd = match (spec.kind(), etcd_text(plan, profile)) {
        (targets::TargetKind::Local, flags) if !flags.is_empty() => format!("\netcd {flags}"),
        _ => String::new(),
    };
    x.say(&format!(
        "seed {} · profile {} · {} · run {run_id} · {}\nweights {}{etcd}\nrun directory {}",
        plan.seed,
        profile.name,
        shakedown_faults::counted(plan.ops.len() as u64, "op"),
        spec.describe(),
        weights_text(plan),
        run_dir.display()
    ));
    let mut events = EventLog::create(&run_dir.join("events.jsonl"));
    events.emit(Event::RunStart {
        run_id: run_id.clone(),
        seed: plan.seed,
        profile: profile.name.clone(),
        weights: plan.weights.clone(),
        ops: plan.ops.len(),
        target: spec.clone(),
    });
    let model = used.initial_model();
    let mut result = RunResult {
        outcome: Err(Interrupted),
        run_id: run_id.clone(),
        run_dir: run_dir.clone(),
        started,
        elapsed: Duration::ZERO,
        versions: BTreeMap::new(),
        profile: profile.clone(),
        plan: plan.clone(),
        spec: spec.clone(),
        record: None,
        unchecked: Vec::new(),
        known: Vec::new(),
    };
    if x.interrupt.requested() {
        return Ok(result);
    }
    let ctx = StartContext { run_id: &run_id, run_dir: &run_dir, profile: &used, model: &model, options: &x.opts.target };
    let mut target = tokio::select! {
        t = targets::start(prepared, &ctx) => match t {
            Ok(t) => t,
            Err(e) => {
                if remove_if_unstarted(&run_dir) && !runs_dir_existed {
                    // Only when empty: another run may have started there meanwhile.
                    let _ = std::fs::remove_dir(x.runs_dir);
                }
                return Err(e);
            }
        },
        _ = x.interrupt.count(1) => return Ok(result),
    };
    let up_ms = t0.elapsed().as_millis() as u64;
    let up = target.started();
    result.versions = target.component_versions();
    events.emit(Event::BringUp { ms: up_ms, detail: up.fields, versions: result.versions.clone(), machine: crate::report::machine() });
    x.say(&format!("stack up in {up_ms}ms · {}", up.line));
    for note in up.notes {
        events.emit(Event::Target { kind: "note".into(), detail: json!({"note": note}) });
        x.say(&format!("note: {note}"));
    }
    let mut invariants = Vec::new();
    let mut unchecked = Vec::new();
    for id in wanted {
        match target.coverage(id) {
            Coverage::Checked => invariants.push(id),
            Coverage::Unchecked(why) => unchecked.push((id, why)),
        }
    }
    if !unchecked.is_empty() {
        events.emit(Event::Unchecked { target: target.name().into(), invariants: unchecked.clone() });
        // Said once, beside the verdict at the end (and in the report and JUnit), not here too.
    }
    result.unchecked = unchecked;

    // The plan on the started target: a first stop request ends it after the current step, a
    // second at once; the target is torn down whatever happens.
    let mut progress = |l: &str| x.say(l);
    let options = engine::Options {
        skip_liveness: x.skip_liveness,
        dry_run: x.opts.target.kube.dry_run,
        stop: Some(x.interrupt.receiver()),
        forensics: Some(result.run_dir.join("forensics")),
    };
    let outcome = {
        let mut engine = Engine::new(target.as_mut(), &used, &invariants, &mut events, &mut progress, &options);
        let outcome = tokio::select! {
            r = engine.execute(plan) => Some(r),
            _ = x.interrupt.count(2) => None,
        };
        result.known = engine.known().to_vec();
        outcome
    };
    let t_down = std::time::Instant::now();
    target.teardown().await;
    for n in target.take_notes() {
        events.emit(Event::from(n));
    }
    events.emit(Event::Teardown { ms: t_down.elapsed().as_millis() as u64, workload: target.workload_stats() });
    result.elapsed = t0.elapsed();
    result.outcome = match outcome {
        None => {
            x.say(target.interrupted());
            Err(Interrupted)
        }
        // The target lost its control API (the kube target's management cluster): what the
        // checks read cannot be trusted, whatever the outcome.
        Some(_) if target.lost().is_some() => return Err(Fatal::environment(target.lost().unwrap_or_default())),
        Some(Ok(o)) => Ok(o),
        Some(Err(EngineError::Target(TargetError::Unsupported(m)))) => return Err(Fatal::usage(m)),
        Some(Err(EngineError::Target(e))) => return Err(Fatal::environment(e.to_string())),
        Some(Err(e @ EngineError::Unobserved { .. })) => return Err(Fatal::internal(e.to_string())),
    };
    let (outcome, failure) = match &result.outcome {
        Ok(Outcome::Pass { .. }) => (RunOutcome::Pass, None),
        Ok(Outcome::Failed(f)) => (RunOutcome::Fail, Some(f.clone())),
        Ok(Outcome::Stopped { .. }) => (RunOutcome::Stopped, None),
        Err(Interrupted) => (RunOutcome::Interrupted, None),
    };
    events.emit(Event::RunEnd { outcome, ms: result.elapsed.as_millis() as u64, failure });
    drop(events);
    finish(x, result)
}

/// After the teardown: the seed record (when asked and the run failed), then the reports.
pub fn finish(x: &Exec<'_>, mut result: RunResult) -> Result<RunResult, Fatal> {
    if x.record {
        if let Ok(Outcome::Failed(f)) = &result.outcome {
            result.record = Some(write_record(x.opts, &result, f)?);
        }
    }
    if result.record.is_none() {
        result.record = x.replaying.map(Path::to_path_buf);
    }
    write_reports(&result, x.opts);
    Ok(result)
}

/// JUnit XML and the HTML report of one run, into its run directory. Best effort: a report that
/// cannot be written is a warning, never a lost run.
fn write_reports(r: &RunResult, opts: &RunOpts) {
    let case = case_of(r);
    let junit = report::junit(&format!("shakedown {}", r.profile.name), std::slice::from_ref(&case));
    if let Err(e) = std::fs::write(r.run_dir.join("junit.xml"), junit) {
        tracing::warn!("cannot write {}/junit.xml: {e}", r.run_dir.display());
    }
    let command = replay_command(r, opts);
    let replay = r.record.as_deref().zip(command.as_deref()).map(|(record, command)| report::html::Replay { record, command });
    match report::html::run_report(&r.run_dir, replay) {
        Ok(html) => {
            if let Err(e) = std::fs::write(r.run_dir.join("report.html"), html) {
                tracing::warn!("cannot write {}/report.html: {e}", r.run_dir.display());
            }
        }
        Err(e) => tracing::warn!("cannot build the HTML report of {}: {e}", r.run_dir.display()),
    }
}

/// The JUnit test case of a run.
pub fn case_of(r: &RunResult) -> Case {
    let outcome = match &r.outcome {
        Err(Interrupted) => CaseOutcome::Skipped("interrupted before the run finished".into()),
        Ok(Outcome::Stopped { steps }) => CaseOutcome::Skipped(format!("stopped on request after {steps} checked steps")),
        Ok(Outcome::Pass { .. }) => CaseOutcome::Pass,
        Ok(Outcome::Failed(f)) => CaseOutcome::Fail {
            kind: format!("{:?}", f.kind).to_lowercase(),
            invariant: f.invariant.map(|i| i.to_string()),
            message: describe(f),
            replay: r.record.as_ref().map(|p| format!("shakedown replay {}", p.display())),
        },
    };
    Case {
        name: format!("seed {}", r.plan.seed),
        classname: format!("shakedown.{}.{}", r.profile.name, r.spec.junit_class()),
        seconds: r.elapsed.as_secs_f64(),
        steps: r.plan.ops.len(),
        run_dir: r.run_dir.clone(),
        unchecked: r.unchecked.iter().map(|(id, why)| format!("{id} ({why})")).collect(),
        outcome,
    }
}

pub fn exit_for(f: &Failure) -> Exit {
    match f.kind {
        FailureKind::Violation => Exit::Violation,
        FailureKind::Liveness => Exit::Liveness,
    }
}

pub fn describe(f: &Failure) -> String {
    let what = match (f.kind, f.invariant) {
        (FailureKind::Violation, Some(i)) => format!("invariant {i} violated"),
        (FailureKind::Liveness, _) => "liveness failure".into(),
        (FailureKind::Violation, None) => "violation".into(),
    };
    format!("{what} at step {} ({}): {}", f.step, f.op, f.message)
}

pub fn record_of(r: &RunResult, failure: &Failure) -> SeedRecord {
    SeedRecord {
        format: FORMAT,
        shakedown_version: env!("CARGO_PKG_VERSION").into(),
        seed: r.plan.seed,
        target: r.spec.clone(),
        run_id: r.run_id.clone(),
        started: r.started.clone(),
        duration_ms: Some(r.elapsed.as_millis() as u64),
        expect: Expect::Fail,
        versions: r.versions.clone(),
        failure: failure.clone(),
        profile: r.profile.clone(),
        plan: r.plan.clone(),
        shrunk: None,
        matching: None,
        reproduction: Vec::new(),
    }
}

/// Writes the seed record of a failed run into the seeds directory (the run directory when that
/// cannot be written: the sequence is never lost).
fn write_record(opts: &RunOpts, r: &RunResult, f: &Failure) -> Result<PathBuf, Fatal> {
    let record = record_of(r, f);
    match record.write(&opts.seeds_dir) {
        Ok(p) => Ok(p),
        Err(e) => {
            eprintln!("warning: cannot write the seed record into {}: {e}; writing it into the run directory", opts.seeds_dir.display());
            record.write(&r.run_dir).map_err(|e| Fatal::environment(format!("cannot write the seed record: {e}")))
        }
    }
}

/// The known defects the run saw, by name and count (each is in the event log as it was seen).
fn say_known(r: &RunResult) {
    if r.known.is_empty() {
        return;
    }
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for k in &r.known {
        *by.entry(k.defect.as_str()).or_default() += 1;
    }
    let seen: Vec<String> = by.iter().map(|(d, n)| format!("{d} ×{n}")).collect();
    println!(
        "known defects of the stack's etcd releases seen (each reported, none counted as a failure): {} — `known-defect` lines of events.jsonl",
        seen.join(", ")
    );
}

/// What `run` prints at the end, and its exit code.
pub fn report_run(r: &RunResult, opts: &RunOpts) -> Exit {
    match &r.outcome {
        Err(Interrupted) | Ok(Outcome::Stopped { .. }) => {
            println!("interrupted; plan, logs and report are in {}", r.run_dir.display());
            Exit::Interrupted
        }
        Ok(Outcome::Pass { steps }) if opts.target.kube.dry_run => {
            println!("dry run: seed {} · {} · nothing was checked", r.plan.seed, shakedown_faults::counted(*steps as u64, "op"));
            Exit::Pass
        }
        Ok(Outcome::Pass { steps }) => {
            println!(
                "PASS: seed {} · {} · every invariant held after every step, and the healed stack converged",
                r.plan.seed,
                shakedown_faults::counted(*steps as u64, "step")
            );
            say_known(r);
            if !r.unchecked.is_empty() {
                println!("not checked: {}", unchecked_text(&r.unchecked));
            }
            println!("run directory: {}", r.run_dir.display());
            println!("report: {}", r.run_dir.join("report.html").display());
            Exit::Pass
        }
        Ok(Outcome::Failed(f)) => {
            println!("FAIL: seed {} · {}", r.plan.seed, describe(f));
            say_known(r);
            println!("run directory: {}", r.run_dir.display());
            println!("report: {} (forensics in {})", r.run_dir.join("report.html").display(), r.run_dir.join("forensics").display());
            if let (Some(path), Some(command)) = (&r.record, replay_command(r, opts)) {
                println!("seed record: {}", path.display());
                println!("{command}");
            }
            exit_for(f)
        }
    }
}
