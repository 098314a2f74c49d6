//! The run engine: executes a plan on a target, checking every invariant after every step with a
//! bounded wait for convergence; then heals and requires convergence (liveness).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use shakedown_faults::{Model, Op, Plan, Profile};
use shakedown_invariants::{check_all, unreachable_members, InvariantId, Observation, Verdict};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::events::EventLog;
use crate::record::{now_rfc3339, Failure, FailureKind};
use crate::target::{Target, TargetError};

/// How a plan execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass { steps: usize },
    Failed(Failure),
    /// Asked to stop (Ctrl-C): the run ended after `steps` completed steps, every one checked.
    Stopped { steps: usize },
}

/// How to execute a plan, beyond the plan itself.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Skip healing and the liveness check at the end (shrinking a safety violation only needs
    /// the steps).
    pub skip_liveness: bool,
    /// Counts stop requests: from 1 on, the run stops before its next step.
    pub stop: Option<watch::Receiver<u32>>,
    /// Where to write forensics when the run fails.
    pub forensics: Option<PathBuf>,
}

impl Options {
    fn stop_requested(&self) -> bool {
        self.stop.as_ref().is_some_and(|s| *s.borrow() > 0)
    }
}

/// Where progress lines go (stderr for people, nowhere for tests).
pub trait Progress {
    fn line(&mut self, text: &str);
}

impl<F: FnMut(&str)> Progress for F {
    fn line(&mut self, text: &str) {
        self(text)
    }
}

/// Result of checking all invariants until they pass or the bound runs out.
enum Checked {
    /// `last_ms`: the last attempt (observe + judge), the check that confirmed convergence.
    Pass { attempts: u32, samples: Vec<(u64, usize, usize)>, verdicts: Vec<Judged>, last_ms: u64 },
    Fail { invariant: InvariantId, message: String, obs: Box<Observation>, verdicts: Vec<Judged> },
}

/// One invariant's verdict on the last observation of a check, and how long judging it took.
#[derive(Debug, Clone, serde::Serialize)]
struct Judged {
    invariant: InvariantId,
    verdict: &'static str,
    us: u64,
}

/// Judges every invariant on `obs`, timing each; returns the failures and every verdict.
fn judge(invariants: &[InvariantId], model: &Model, obs: &Observation) -> (Vec<(InvariantId, Verdict)>, Vec<Judged>) {
    let mut failures = Vec::new();
    let mut verdicts = Vec::with_capacity(invariants.len());
    for &id in invariants {
        let t = std::time::Instant::now();
        let v = check_all(&[id], model, obs).pop().map(|(_, v)| v).unwrap_or(Verdict::Pass);
        let us = t.elapsed().as_micros() as u64;
        let verdict = match v {
            Verdict::Pass => "pass",
            Verdict::Fail(_) => "fail",
            Verdict::Definite(_) => "definite",
        };
        verdicts.push(Judged { invariant: id, verdict, us });
        if !v.is_pass() {
            failures.push((id, v));
        }
    }
    (failures, verdicts)
}

/// Observes and checks until every invariant passes, a definite failure is seen, or `limit`
/// runs out. Retries are spaced 50 ms apart.
async fn check_until<T: Target>(
    target: &mut T,
    model: &Model,
    invariants: &[InvariantId],
    quorum_throughout: bool,
    require_all_up: bool,
    limit: Duration,
) -> Checked {
    let deadline = Instant::now() + limit;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let t_attempt = Instant::now();
        let mut obs = target.observe(model, invariants).await;
        obs.quorum_throughout = quorum_throughout;
        let (mut failures, verdicts) = judge(invariants, model, &obs);
        if require_all_up && failures.is_empty() {
            let down = unreachable_members(model, &obs);
            if !down.is_empty() {
                let names: Vec<String> = down.iter().map(|m| m.to_string()).collect();
                failures.push((InvariantId::Quorum, Verdict::Fail(format!("member(s) {} not serving after healing", names.join(", ")))));
            }
        }
        if failures.is_empty() {
            let samples = obs.serving_samples.iter().map(|s| (s.at_ms, s.serving.len(), s.cluster_size)).collect();
            return Checked::Pass { attempts, samples, verdicts, last_ms: t_attempt.elapsed().as_millis() as u64 };
        }
        let definite = failures.iter().find(|(_, v)| matches!(v, Verdict::Definite(_)));
        if definite.is_some() || Instant::now() >= deadline {
            let (invariant, verdict) = definite.unwrap_or(&failures[0]).clone();
            let message = verdict.message().unwrap_or_default().to_string();
            let message = if definite.is_none() && !limit.is_zero() { format!("{message} (still failing after {}s)", limit.as_secs_f32()) } else { message };
            return Checked::Fail { invariant, message, obs: Box::new(obs), verdicts };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn failure(kind: FailureKind, step: usize, op: &str, invariant: Option<InvariantId>, message: String) -> Failure {
    Failure { kind, step, op: op.to_string(), invariant, message, at: now_rfc3339() }
}

/// Executes `plan` from the freshly started stack `profile` describes.
/// Errors are environment problems (the machine, not the stack); findings are `Outcome::Failed`.
pub async fn execute<T: Target>(
    target: &mut T,
    plan: &Plan,
    profile: &Profile,
    invariants: &[InvariantId],
    events: &mut EventLog,
    progress: &mut dyn Progress,
    options: &Options,
) -> Result<Outcome, TargetError> {
    let mut model = profile.initial_model();
    let outcome = steps(target, plan, profile, invariants, events, progress, options, &mut model).await?;
    if let (Outcome::Failed(_), Some(dir)) = (&outcome, &options.forensics) {
        write_forensics(target, &model, dir, events).await;
    }
    Ok(outcome)
}

#[allow(clippy::too_many_arguments)]
async fn steps<T: Target>(
    target: &mut T,
    plan: &Plan,
    profile: &Profile,
    invariants: &[InvariantId],
    events: &mut EventLog,
    progress: &mut dyn Progress,
    options: &Options,
    model: &mut Model,
) -> Result<Outcome, TargetError> {
    let total = plan.ops.len();
    let width = total.to_string().len();
    let converge = profile.timeouts.converge;

    // Step 0: the freshly started stack must satisfy every invariant.
    let t0 = Instant::now();
    match check_until(target, model, invariants, true, true, converge).await {
        Checked::Pass { attempts, verdicts, .. } => {
            events.emit("check", json!({"step": 0, "verdict": "pass", "attempts": attempts, "ms": t0.elapsed().as_millis() as u64, "invariants": verdicts}));
            progress.line(&format!("[{:>width$}/{total}] bring-up checks ok in {}ms", 0, t0.elapsed().as_millis()));
        }
        Checked::Fail { invariant, message, obs, verdicts } => {
            events.emit("check", json!({"step": 0, "verdict": "fail", "invariant": invariant, "message": message, "ms": t0.elapsed().as_millis() as u64, "invariants": verdicts, "observation": *obs}));
            progress.line(&format!("[{:>width$}/{total}] bring-up VIOLATION {invariant}: {message}", 0));
            return Ok(Outcome::Failed(failure(FailureKind::Violation, 0, "bring-up", Some(invariant), message)));
        }
    }

    // Testing hook: `SHAKEDOWN_PANIC_AFTER_STEP=N` panics after step N, to show that a panic
    // still tears the stack down (tests/local_target.rs).
    let panic_after: Option<usize> = std::env::var("SHAKEDOWN_PANIC_AFTER_STEP").ok().and_then(|v| v.parse().ok());
    let mut skipped = 0usize;
    for (i, op) in plan.ops.iter().enumerate() {
        if panic_after == Some(i) {
            panic!("SHAKEDOWN_PANIC_AFTER_STEP={i}: panicking on purpose");
        }
        if options.stop_requested() {
            events.emit("stopped", json!({"after_step": i}));
            progress.line(&format!("[{i:>width$}/{total}] stopped on request after {i} checked steps"));
            return Ok(Outcome::Stopped { steps: i });
        }
        let step = i + 1;
        // An op the target cannot run here is skipped and said so; later ops that depended on
        // it no longer satisfy their precondition and are skipped too. The rest still runs.
        if let Err(reason) = target.supports(op) {
            events.emit("op-skipped", json!({"step": step, "op": op, "reason": reason}));
            progress.line(&format!("[{step:>width$}/{total}] {:<32} skipped: unavailable on the {} target here: {reason}", op.to_string(), target.name()));
            skipped += 1;
            continue;
        }
        let before = model.clone();
        if let Err(e) = model.apply(op) {
            if skipped == 0 {
                // Plans are validated before they run; reaching this is a bug.
                panic!("step {step} ({op}) breaks its precondition after validation: {e}");
            }
            events.emit("op-skipped", json!({"step": step, "op": op, "reason": e.to_string()}));
            progress.line(&format!("[{step:>width$}/{total}] {:<32} skipped: {e} (an earlier op was skipped)", op.to_string()));
            continue;
        }
        events.emit("op-start", json!({"step": step, "op": op, "text": op.to_string(), "family": op.kind().to_string()}));
        let t_op = Instant::now();
        let executed = target.execute(op, &before, model).await;
        for (kind, fields) in target.take_events() {
            events.emit(&kind, fields);
        }
        match executed {
            Ok(()) => {}
            Err(TargetError::Stack(msg)) => {
                events.emit("op-end", json!({"step": step, "ms": t_op.elapsed().as_millis() as u64, "error": msg}));
                // The op's own wait ran out. If an invariant already says what is wrong, that is
                // the more precise finding; otherwise it is a liveness failure.
                let checked = check_until(target, model, invariants, before.quorum_throughout(op), false, Duration::ZERO).await;
                target.end_step().await;
                if let Checked::Fail { invariant, message, obs, verdicts } = checked {
                    events.emit("check", json!({"step": step, "verdict": "fail", "invariant": invariant, "message": message, "invariants": verdicts, "observation": *obs}));
                    let message = format!("{message} (and the op failed: {msg})");
                    progress.line(&format!("[{step:>width$}/{total}] {:<32} VIOLATION {invariant}: {message}", op.to_string()));
                    return Ok(Outcome::Failed(failure(FailureKind::Violation, step, &op.to_string(), Some(invariant), message)));
                }
                events.emit("liveness", json!({"step": step, "verdict": "fail", "message": msg}));
                progress.line(&format!("[{step:>width$}/{total}] {:<32} LIVENESS: {msg}", op.to_string()));
                return Ok(Outcome::Failed(failure(FailureKind::Liveness, step, &op.to_string(), None, msg)));
            }
            Err(e) => return Err(e),
        }
        let op_ms = t_op.elapsed().as_millis();
        events.emit("op-end", json!({"step": step, "ms": op_ms as u64}));
        let t_check = Instant::now();
        let checked = check_until(target, model, invariants, before.quorum_throughout(op), false, converge).await;
        target.end_step().await;
        let check_ms = t_check.elapsed().as_millis();
        match checked {
            Checked::Pass { attempts, samples, verdicts, last_ms } => {
                events.emit("check", json!({"step": step, "verdict": "pass", "attempts": attempts, "last_ms": last_ms, "serving_samples": samples, "ms": check_ms as u64, "invariants": verdicts, "workload": target.workload_stats()}));
                progress.line(&format!("[{step:>width$}/{total}] {:<32} {:>6}ms  checks ok in {check_ms}ms", op.to_string(), op_ms));
            }
            Checked::Fail { invariant, message, obs, verdicts } => {
                events.emit("check", json!({"step": step, "verdict": "fail", "invariant": invariant, "message": message, "ms": check_ms as u64, "invariants": verdicts, "observation": *obs}));
                progress.line(&format!("[{step:>width$}/{total}] {:<32} {:>6}ms  VIOLATION {invariant}: {message}", op.to_string(), op_ms));
                return Ok(Outcome::Failed(failure(FailureKind::Violation, step, &op.to_string(), Some(invariant), message)));
            }
        }
    }
    if options.skip_liveness {
        return Ok(Outcome::Pass { steps: total });
    }

    // Liveness: heal every fault, then require convergence with every member serving.
    let heal: Vec<Op> = model.heal_ops();
    let step = total + 1;
    let t_heal = Instant::now();
    for op in &heal {
        let before = model.clone();
        model.apply(op).expect("heal ops satisfy their preconditions");
        events.emit("heal", json!({"op": op, "text": op.to_string()}));
        match target.execute(op, &before, model).await {
            Ok(_) => {}
            Err(TargetError::Stack(msg)) => {
                events.emit("liveness", json!({"verdict": "fail", "message": msg}));
                return Ok(Outcome::Failed(failure(FailureKind::Liveness, step, &format!("heal: {op}"), None, msg)));
            }
            Err(e) => return Err(e),
        }
    }
    let heal_text = if heal.is_empty() { "heal (nothing to heal)".to_string() } else { format!("heal ({})", heal.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(", ")) };
    let checked = check_until(target, model, invariants, false, true, profile.timeouts.liveness).await;
    target.end_step().await;
    match checked {
        Checked::Pass { attempts, verdicts, .. } => {
            events.emit("liveness", json!({"verdict": "pass", "attempts": attempts, "ms": t_heal.elapsed().as_millis() as u64, "invariants": verdicts, "workload": target.workload_stats()}));
            progress.line(&format!("[{:>width$}/{total}] {heal_text}: converged in {}ms", "✓", t_heal.elapsed().as_millis()));
            Ok(Outcome::Pass { steps: total })
        }
        Checked::Fail { invariant, message, obs, verdicts } => {
            events.emit("liveness", json!({"verdict": "fail", "invariant": invariant, "message": message, "invariants": verdicts, "observation": *obs}));
            let message = format!("after healing, the stack did not converge within {}s: {invariant}: {message}", profile.timeouts.liveness.as_secs());
            progress.line(&format!("[{:>width$}/{total}] {heal_text}: LIVENESS {message}", "✗"));
            Ok(Outcome::Failed(failure(FailureKind::Liveness, step, &heal_text, Some(invariant), message)))
        }
    }
}

/// On failure, before teardown: what the stack looks like now (every invariant's observation:
/// member status, member list, inventory) and the last lines of each component's log.
/// Best effort: a forensics problem is logged, never turns into the run's outcome.
async fn write_forensics<T: Target>(target: &mut T, model: &Model, dir: &Path, events: &mut EventLog) {
    let obs = target.observe(model, &InvariantId::ALL).await;
    let res = (|| -> std::io::Result<Vec<String>> {
        std::fs::create_dir_all(dir)?;
        let mut written = vec!["observation.json".to_string()];
        std::fs::write(dir.join("observation.json"), serde_json::to_string_pretty(&obs).unwrap_or_default())?;
        for (name, path) in target.log_files() {
            let tail = tail_lines(&path, FORENSIC_LOG_LINES);
            let file = format!("{name}.log.tail");
            std::fs::write(dir.join(&file), tail)?;
            written.push(file);
        }
        Ok(written)
    })();
    match res {
        Ok(files) => events.emit("forensics", json!({"dir": dir, "files": files})),
        Err(e) => tracing::warn!("cannot write forensics into {}: {e}", dir.display()),
    }
}

/// How many lines of each component log the forensics keep.
pub const FORENSIC_LOG_LINES: usize = 200;

/// The last `n` lines of a file (reads at most the last 1 MiB).
pub fn tail_lines(path: &Path, n: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return format!("(cannot open {})\n", path.display()) };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(1 << 20)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    let mut out = lines[lines.len().saturating_sub(n)..].join("\n");
    out.push('\n');
    out
}
