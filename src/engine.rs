//! The run engine: executes a plan on a target, checking every invariant after every step with a
//! bounded wait for convergence; then heals and requires convergence (liveness).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shakedown_faults::{Model, Op, Plan, Profile};
use shakedown_invariants::{all_serving, InvariantId, KnownDefect, Observation, Verdict};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::now_rfc3339;
use crate::events::{Check, CheckVerdict, Event, EventLog, Judged, JudgedVerdict};
use crate::record::{Failure, FailureKind};
use crate::targets::{Target, TargetError};

/// Why a plan execution could not end in an [`Outcome`].
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The target could not do what was asked (the machine, an op it does not support).
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The target claims to check `invariant` and observed nothing for it: a bug in shakedown
    /// (exit 5), never a pass.
    #[error("the {target} target checks {invariant} but observed nothing for it at step {step} ({what}): a bug in shakedown")]
    Unobserved { target: &'static str, invariant: InvariantId, step: usize, what: String },
}

/// How a plan execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass {
        steps: usize,
    },
    Failed(Failure),
    /// Asked to stop (Ctrl-C): the run ended after `steps` completed steps, every one checked.
    Stopped {
        steps: usize,
    },
}

/// How to execute a plan, beyond the plan itself.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Skip healing and the liveness check at the end (shrinking a safety violation only needs
    /// the steps).
    pub skip_liveness: bool,
    /// Execute the ops and check nothing (a kube dry run, whose writes are printed, not sent).
    pub dry_run: bool,
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

/// How long checks wait between two observations of a stack that has not converged yet.
pub const CHECK_RETRY: Duration = Duration::from_millis(50);

/// Result of checking all invariants until they pass or the bound runs out.
enum Checked {
    /// A checked invariant had no input in the observation.
    Unobserved { invariant: InvariantId, what: String },
    /// `last_ms`: the last attempt (observe + judge), the check that confirmed convergence.
    Pass { attempts: u32, samples: Vec<(u64, usize, usize)>, verdicts: Vec<Judged>, last_ms: u64 },
    /// `also`: the other invariants that failed in the same check; `attempts`: the observations
    /// it made; `last_ms`: the last one's (observe + judge).
    Fail {
        invariant: InvariantId,
        also: Vec<InvariantId>,
        message: String,
        obs: Box<Observation>,
        verdicts: Vec<Judged>,
        attempts: u32,
        last_ms: u64,
    },
}

/// Judges every invariant on `obs`, timing each; returns the failures, every verdict, and the
/// known defects the judgement found.
fn judge(invariants: &[InvariantId], model: &Model, obs: &Observation) -> (Vec<(InvariantId, Verdict)>, Vec<Judged>, Vec<KnownDefect>) {
    let mut failures = Vec::new();
    let mut verdicts = Vec::with_capacity(invariants.len());
    let mut known = Vec::new();
    for &id in invariants {
        let t = std::time::Instant::now();
        let (v, k) = id.check_with_known(model, obs);
        known.extend(k);
        let us = t.elapsed().as_micros() as u64;
        verdicts.push(Judged { invariant: id, verdict: JudgedVerdict::of(&v), us });
        if !v.is_pass() {
            failures.push((id, v));
        }
    }
    (failures, verdicts, known)
}

fn failure(kind: FailureKind, step: usize, op: &str, invariant: Option<InvariantId>, message: String) -> Failure {
    Failure { kind, step, op: op.to_string(), invariant, also: vec![], message, at: now_rfc3339() }
}

fn check_event(step: usize, checked: &Checked, ms: u64) -> Check {
    match checked {
        Checked::Unobserved { invariant, what } => Check {
            step,
            verdict: CheckVerdict::Fail,
            attempts: None,
            ms: Some(ms),
            last_ms: None,
            invariant: Some(*invariant),
            message: Some(format!("unobserved: {what}")),
            invariants: vec![],
            serving_samples: None,
            workload: None,
            observation: None,
        },
        Checked::Pass { attempts, samples, verdicts, last_ms } => Check {
            step,
            verdict: CheckVerdict::Pass,
            attempts: Some(*attempts),
            ms: Some(ms),
            last_ms: Some(*last_ms),
            invariant: None,
            message: None,
            invariants: verdicts.clone(),
            serving_samples: (!samples.is_empty()).then(|| samples.clone()),
            workload: None,
            observation: None,
        },
        Checked::Fail { invariant, message, obs, verdicts, attempts, last_ms, .. } => Check {
            step,
            verdict: CheckVerdict::Fail,
            attempts: Some(*attempts),
            ms: Some(ms),
            last_ms: Some(*last_ms),
            invariant: Some(*invariant),
            message: Some(message.clone()),
            invariants: verdicts.clone(),
            serving_samples: None,
            workload: None,
            observation: Some(obs.clone()),
        },
    }
}

/// One plan execution on a started target: the target, the profile's bounds, the invariants
/// checked, where events and progress go, and the model as the plan moves it.
/// The op column's least width in a run's step lines (`rolling-upgrade(to 3.5)` and the like fit).
const OP_COLUMN: usize = 32;

pub struct Engine<'a> {
    pub target: &'a mut dyn Target,
    pub profile: &'a Profile,
    pub invariants: &'a [InvariantId],
    pub events: &'a mut EventLog,
    pub progress: &'a mut dyn Progress,
    pub options: &'a Options,
    model: Model,
    width: usize,
    total: usize,
    /// The op column's width: the plan's longest op, at least 32 characters.
    op_width: usize,
    /// The known defects seen so far, each once.
    known: Vec<KnownDefect>,
}

impl<'a> Engine<'a> {
    pub fn new(
        target: &'a mut dyn Target,
        profile: &'a Profile,
        invariants: &'a [InvariantId],
        events: &'a mut EventLog,
        progress: &'a mut dyn Progress,
        options: &'a Options,
    ) -> Engine<'a> {
        Engine {
            target,
            profile,
            invariants,
            events,
            progress,
            options,
            model: profile.initial_model(),
            width: 1,
            total: 0,
            op_width: OP_COLUMN,
            known: Vec::new(),
        }
    }

    /// The known defects of the stack's releases the checks have seen, each once.
    pub fn known(&self) -> &[KnownDefect] {
        &self.known
    }

    /// Reports the known defects a judgement found that were not reported yet: on the console and
    /// in the event log, by name.
    fn report_known(&mut self, found: Vec<KnownDefect>) {
        for k in found {
            if self.known.iter().any(|s| s.key == k.key) {
                continue;
            }
            self.progress.line(&format!("      known defect (reported, not a failure): {}", k.message));
            self.events.emit(Event::KnownDefect {
                invariant: k.invariant,
                defect: k.defect.clone(),
                message: k.message.clone(),
                seen: k.seen.clone(),
                about: k.about.clone(),
            });
            self.known.push(k);
        }
    }

    /// Executes `plan` from the freshly started stack the profile describes.
    /// Errors are environment problems (the machine, not the stack); findings are `Outcome::Failed`.
    pub async fn execute(&mut self, plan: &Plan) -> Result<Outcome, EngineError> {
        self.model = self.profile.initial_model();
        self.total = plan.ops.len();
        self.op_width = plan.ops.iter().map(|o| o.to_string().chars().count()).max().unwrap_or(0).max(OP_COLUMN);
        self.width = self.total.to_string().len();
        let outcome = self.steps(plan).await?;
        if let (Outcome::Failed(_), Some(dir)) = (&outcome, self.options.forensics.clone()) {
            self.write_forensics(&dir).await;
        }
        Ok(outcome)
    }

    fn say(&mut self, step: &dyn std::fmt::Display, text: &str) {
        let (width, total) = (self.width, self.total);
        self.progress.line(&format!("[{step:>width$}/{total}] {text}"));
    }

    /// Observes and checks until every invariant passes, a definite failure is seen, or `limit`
    /// runs out. Retries are spaced [`CHECK_RETRY`] apart.
    async fn check_until(&mut self, quorum_throughout: bool, require_all_up: bool, limit: Duration) -> Checked {
        let deadline = Instant::now() + limit;
        let mut attempts = 0;
        // How many observations in a row, up to the latest, each invariant has failed: at the
        // bound the verdict leads with the one that failed longest, not with whichever of the
        // last observation's failures comes first (a leader election in the last observation, on
        // a loaded machine, once headed a verdict whose cause had failed for 30 s).
        let mut streaks: BTreeMap<InvariantId, u32> = BTreeMap::new();
        loop {
            attempts += 1;
            let t_attempt = Instant::now();
            let mut obs = self.target.observe(&self.model, self.invariants).await;
            obs.quorum_throughout = quorum_throughout;
            let (mut failures, verdicts, known) = judge(self.invariants, &self.model, &obs);
            self.report_known(known);
            if let Some((invariant, v)) = failures.iter().find(|(_, v)| matches!(v, Verdict::Unobserved(_))) {
                return Checked::Unobserved { invariant: *invariant, what: v.message().unwrap_or_default().to_string() };
            }
            // At bring-up and after healing every member serves (judged by the invariants crate,
            // attributed to quorum).
            if require_all_up && failures.is_empty() {
                let v = all_serving(&self.model, &obs);
                if !v.is_pass() {
                    failures.push((InvariantId::Quorum, v));
                }
            }
            streaks.retain(|i, _| failures.iter().any(|(f, _)| f == i));
            for (i, _) in &failures {
                *streaks.entry(*i).or_default() += 1;
            }
            if failures.is_empty() {
                let samples = obs.serving_samples.iter().map(|s| (s.at_ms, s.serving.len(), s.cluster_size)).collect();
                return Checked::Pass { attempts, samples, verdicts, last_ms: t_attempt.elapsed().as_millis() as u64 };
            }
            let definite = failures.iter().find(|(_, v)| matches!(v, Verdict::Definite(_)));
            // At the bound, the stack is judged by an observation begun after it: one begun
            // before and ended after (a slow one: a long history to check) saw the stack before
            // its time was up (seen: a member restarted 0.2 s before it served, observed then,
            // and reported "still failing after 15s" when that one observation ended 20 s later).
            if definite.is_some() || t_attempt >= deadline {
                let streak = |i: &InvariantId| streaks.get(i).copied().unwrap_or(0);
                let longest = failures.iter().fold(&failures[0], |best, f| if streak(&f.0) > streak(&best.0) { f } else { best });
                let (invariant, verdict) = definite.unwrap_or(longest).clone();
                // Of the observations of this check, how many in a row up to the last one saw it fail.
                let lately = |i: &InvariantId| {
                    let n = streak(i);
                    (definite.is_none() && n < attempts).then(|| format!("failing in the last {n} of {attempts} observations"))
                };
                let message = verdict.message().unwrap_or_default().to_string();
                let secs = limit.as_secs_f32();
                let message = match lately(&invariant) {
                    _ if definite.is_some() || limit.is_zero() => message,
                    Some(lately) => format!("{message} ({lately} in {secs}s)"),
                    None => format!("{message} (still failing after {secs}s)"),
                };
                // What else broke in the same check, so a consequence is reported with its cause
                // (the write a diverged replica lost, with the hashes that show the divergence).
                let also: Vec<String> = failures
                    .iter()
                    .filter(|(i, _)| *i != invariant)
                    .map(|(i, v)| match lately(i) {
                        Some(lately) => format!("{i} ({lately}): {}", v.message().unwrap_or_default()),
                        None => format!("{i}: {}", v.message().unwrap_or_default()),
                    })
                    .collect();
                let message = if also.is_empty() { message } else { format!("{message}; in the same check {}", also.join("; ")) };
                let also = failures.iter().map(|(i, _)| *i).filter(|i| *i != invariant).collect();
                let last_ms = t_attempt.elapsed().as_millis() as u64;
                return Checked::Fail { invariant, also, message, obs: Box::new(obs), verdicts, attempts, last_ms };
            }
            tokio::time::sleep(CHECK_RETRY).await;
        }
    }

    /// Runs the step's checks, records them, ends the step: `Some(failure)` when one broke.
    /// `op` is `None` for step 0, the bring-up.
    async fn checked_step(
        &mut self,
        step: usize,
        op: Option<&Op>,
        op_ms: Option<u128>,
        quorum_throughout: bool,
    ) -> Result<Option<Failure>, EngineError> {
        let t_check = Instant::now();
        let checked = self.check_until(quorum_throughout, step == 0, self.profile.timeouts.converge).await;
        self.target.end_step().await;
        let check_ms = t_check.elapsed().as_millis();
        let mut event = check_event(step, &checked, check_ms as u64);
        let text = op.map_or_else(|| "bring-up".to_string(), Op::to_string);
        let op_col = op_ms.map(|ms| format!("{:<w$} {ms:>6}ms  ", text, w = self.op_width)).unwrap_or_else(|| format!("{text} "));
        match checked {
            Checked::Pass { .. } => {
                if step > 0 {
                    event.workload = Some(self.target.workload_stats());
                }
                self.events.emit(Event::Check(event));
                self.say(&step, &format!("{op_col}checks ok in {check_ms}ms"));
                Ok(None)
            }
            Checked::Fail { invariant, also, message, .. } => {
                self.events.emit(Event::Check(event));
                self.say(&step, &format!("{op_col}VIOLATION {invariant}: {message}"));
                Ok(Some(Failure { also, ..failure(FailureKind::Violation, step, &text, Some(invariant), message) }))
            }
            Checked::Unobserved { invariant, what } => {
                self.events.emit(Event::Check(event));
                Err(self.unobserved(invariant, step, what))
            }
        }
    }

    fn unobserved(&self, invariant: InvariantId, step: usize, what: String) -> EngineError {
        EngineError::Unobserved { target: self.target.name(), invariant, step, what }
    }

    async fn steps(&mut self, plan: &Plan) -> Result<Outcome, EngineError> {
        let total = self.total;
        // Step 0: the freshly started stack must satisfy every invariant.
        if !self.options.dry_run {
            if let Some(f) = self.checked_step(0, None, None, true).await? {
                return Ok(Outcome::Failed(f));
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
            if self.options.stop_requested() {
                self.events.emit(Event::Stopped { after_step: i });
                self.say(&i, &format!("stopped on request after {i} checked steps"));
                return Ok(Outcome::Stopped { steps: i });
            }
            let step = i + 1;
            // An op the target cannot run here is skipped and said so; later ops that depended on
            // it no longer satisfy their precondition and are skipped too. The rest still runs.
            if let Err(reason) = self.target.supports(op) {
                self.say(
                    &step,
                    &format!(
                        "{:<w$} skipped: unavailable on the {} target here: {reason}",
                        op.to_string(),
                        self.target.name(),
                        w = self.op_width
                    ),
                );
                self.events.emit(Event::OpSkipped { step, op: op.clone(), reason: reason.0 });
                skipped += 1;
                continue;
            }
            let before = self.model.clone();
            if let Err(e) = self.model.apply(op) {
                if skipped == 0 {
                    // Plans are validated before they run; reaching this is a bug.
                    panic!("step {step} ({op}) breaks its precondition after validation: {e}");
                }
                self.say(&step, &format!("{:<w$} skipped: {e} (an earlier op was skipped)", op.to_string(), w = self.op_width));
                self.events.emit(Event::OpSkipped { step, op: op.clone(), reason: e.to_string() });
                continue;
            }
            self.events.emit(Event::OpStart { step, op: op.clone(), text: op.to_string(), family: op.kind() });
            if self.options.dry_run {
                self.say(&step, &op.to_string());
            }
            let t_op = Instant::now();
            let executed = self.target.execute(op, &before, &self.model).await;
            for n in self.target.take_notes() {
                self.events.emit(Event::from(n));
            }
            let op_ms = t_op.elapsed().as_millis();
            match executed {
                Ok(()) => self.events.emit(Event::OpEnd { step, ms: op_ms as u64, error: None }),
                Err(TargetError::Stack(msg)) => {
                    self.events.emit(Event::OpEnd { step, ms: op_ms as u64, error: Some(msg.clone()) });
                    return Ok(Outcome::Failed(self.op_failed(step, op, &before, msg).await?));
                }
                Err(e) => return Err(e.into()),
            }
            if self.options.dry_run {
                continue;
            }
            if let Some(f) = self.checked_step(step, Some(op), Some(op_ms), before.quorum_throughout(op)).await? {
                return Ok(Outcome::Failed(f));
            }
        }
        if self.options.skip_liveness || self.options.dry_run {
            return Ok(Outcome::Pass { steps: total });
        }
        self.liveness().await
    }

    /// The op's own wait ran out. If an invariant already says what is wrong, that is the more
    /// precise finding; otherwise it is a liveness failure.
    async fn op_failed(&mut self, step: usize, op: &Op, before: &Model, msg: String) -> Result<Failure, EngineError> {
        let checked = self.check_until(before.quorum_throughout(op), false, Duration::ZERO).await;
        self.target.end_step().await;
        if let Checked::Unobserved { invariant, what } = checked {
            return Err(self.unobserved(invariant, step, what));
        }
        if let Checked::Fail { invariant, also, message, .. } = &checked {
            let mut event = check_event(step, &checked, 0);
            event.ms = None;
            self.events.emit(Event::Check(event));
            let message = format!("{message} (and the op failed: {msg})");
            self.say(&step, &format!("{:<w$} VIOLATION {invariant}: {message}", op.to_string(), w = self.op_width));
            return Ok(Failure { also: also.clone(), ..failure(FailureKind::Violation, step, &op.to_string(), Some(*invariant), message) });
        }
        self.events.emit(Event::Liveness(Check::failed(step, &msg)));
        self.say(&step, &format!("{:<w$} LIVENESS: {msg}", op.to_string(), w = self.op_width));
        Ok(failure(FailureKind::Liveness, step, &op.to_string(), None, msg))
    }

    /// Liveness: heal every fault, then require convergence with every member serving.
    async fn liveness(&mut self) -> Result<Outcome, EngineError> {
        let total = self.total;
        let heal: Vec<Op> = self.model.heal_ops();
        let step = total + 1;
        let t_heal = Instant::now();
        for op in &heal {
            let before = self.model.clone();
            self.model.apply(op).expect("heal ops satisfy their preconditions");
            self.events.emit(Event::Heal { op: op.clone(), text: op.to_string() });
            match self.target.execute(op, &before, &self.model).await {
                Ok(_) => {}
                Err(TargetError::Stack(msg)) => {
                    self.events.emit(Event::Liveness(Check::failed(step, &msg)));
                    return Ok(Outcome::Failed(failure(FailureKind::Liveness, step, &format!("heal: {op}"), None, msg)));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let heal_text = if heal.is_empty() {
            "heal (nothing to heal)".to_string()
        } else {
            format!("heal ({})", heal.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(", "))
        };
        let checked = self.check_until(false, true, self.profile.timeouts.liveness).await;
        self.target.end_step().await;
        let ms = t_heal.elapsed().as_millis() as u64;
        let mut event = check_event(step, &checked, ms);
        match checked {
            Checked::Pass { .. } => {
                event.workload = Some(self.target.workload_stats());
                event.serving_samples = None;
                self.events.emit(Event::Liveness(event));
                self.say(&"✓", &format!("{heal_text}: converged in {ms}ms"));
                Ok(Outcome::Pass { steps: total })
            }
            Checked::Fail { invariant, message, .. } => {
                self.events.emit(Event::Liveness(event));
                let message = format!(
                    "after healing, the stack did not converge within {}s: {invariant}: {message}",
                    self.profile.timeouts.liveness.as_secs()
                );
                self.say(&"✗", &format!("{heal_text}: LIVENESS {message}"));
                Ok(Outcome::Failed(failure(FailureKind::Liveness, step, &heal_text, Some(invariant), message)))
            }
            Checked::Unobserved { invariant, what } => {
                self.events.emit(Event::Liveness(event));
                Err(self.unobserved(invariant, step, what))
            }
        }
    }

    /// On failure, before teardown: what the stack looks like now (every invariant's observation:
    /// member status, member list, inventory) and the last lines of each component's log.
    /// Best effort: a forensics problem is logged, never turns into the run's outcome.
    async fn write_forensics(&mut self, dir: &Path) {
        let obs = self.target.observe(&self.model, &InvariantId::ALL).await;
        let logs = self.target.log_files();
        let extras = self.target.forensic_extras().await;
        let res = (|| -> std::io::Result<Vec<String>> {
            std::fs::create_dir_all(dir)?;
            let mut written = vec!["observation.json".to_string()];
            std::fs::write(dir.join("observation.json"), serde_json::to_string_pretty(&obs).unwrap_or_default())?;
            for (name, path) in logs {
                let tail = crate::procs::tail_lines(&path, crate::targets::FORENSIC_LOG_LINES);
                let file = format!("{name}.log.tail");
                std::fs::write(dir.join(&file), tail)?;
                written.push(file);
            }
            for (file, contents) in extras {
                std::fs::write(dir.join(&file), contents)?;
                written.push(file);
            }
            Ok(written)
        })();
        match res {
            Ok(files) => self.events.emit(Event::Forensics { dir: dir.to_path_buf(), files }),
            Err(e) => tracing::warn!("cannot write forensics into {}: {e}", dir.display()),
        }
    }
}
