//! `shakedown shrink FILE`: minimise a failing record's plan by re-executing candidates on fresh
//! stacks ([`shakedown::faults::Shrinker`] proposes them), within a time and a run budget.

use std::path::Path;
use std::time::Duration;

use shakedown::exit::{Exit, Fatal};
use shakedown::faults::{Plan, Shrinker};
use shakedown::record::{now_rfc3339, Failure, FailureKind, Match, SeedRecord, Shrunk};
use shakedown::engine::Outcome;
use shakedown::targets::TargetSpec;
use tokio::time::Instant;

use super::session::{create_run_dir, describe, execute, new_run_id, Exec, Interrupted};
use super::RunOpts;

pub struct Limits {
    pub budget: Duration,
    pub max_runs: u32,
    pub confirm: u32,
}

/// What a budget must at least allow when the record does not say how long its run took:
/// bring-up, one check, teardown.
const MIN_CANDIDATE: Duration = Duration::from_secs(5);

/// Why shrinking stopped.
enum Stop {
    Minimal,
    Runs,
    Budget,
    Interrupted,
}

pub async fn shrink(file: &Path, limits: Limits, opts: &RunOpts, json_logs: bool, interrupt: &super::Interrupt) -> Result<Exit, Fatal> {
    let mut record = SeedRecord::load(file)?;
    let per_run = record.duration_ms.map(Duration::from_millis).unwrap_or(MIN_CANDIDATE);
    if limits.budget < per_run {
        return Err(Fatal::usage(format!(
            "--budget {} is too small to run a single candidate: the recorded run took {}; give at least that (e.g. --budget {})",
            humantime::format_duration(limits.budget),
            humantime::format_duration(Duration::from_secs(per_run.as_secs().max(1))),
            humantime::format_duration(Duration::from_secs((per_run.as_secs() * 20).max(60))),
        )));
    }
    // Shrink what `replay` would run: a shrunk plan from an earlier (partial) shrink goes on.
    let (start, target_failure) = record.to_replay(false);
    let target_failure = target_failure.clone();
    let spec = TargetSpec::from_options(record.target.kind(), &opts.target, Some(&record.target))?;
    let same = |f: &Failure| f.kind == target_failure.kind && f.invariant == target_failure.invariant;
    let group = create_run_dir(&opts.runs_dir, &format!("shrink-{}", new_run_id().trim_start_matches("sd-")))?;
    // A safety violation during the steps needs no healing phase to show.
    let skip_liveness = target_failure.kind == FailureKind::Violation && target_failure.step <= start.ops.len();
    let x = Exec { opts, json_logs, interrupt, runs_dir: &group, record: false, verbose: false, bar: None, skip_liveness, replaying: None };

    let initial = record.profile.initial_model();
    let mut shrinker = Shrinker::new(initial, &start.ops, target_failure.step);
    println!(
        "shrinking {} · seed {} · {} · {} ops · failing: {}",
        file.display(),
        record.seed,
        spec.describe(),
        start.ops.len(),
        describe(&target_failure)
    );
    println!(
        "{} ops ran up to the failure; budget {} or {} runs, confirm {}; candidate runs in {}",
        shrinker.best().len(),
        humantime::format_duration(limits.budget),
        limits.max_runs,
        limits.confirm,
        group.display()
    );
    let t0 = Instant::now();
    let deadline = t0 + limits.budget;
    let mut runs = 0u32;
    let mut best_failure = target_failure.clone();
    let mut reproductions = 0u32;
    let stop = 'shrink: loop {
        if interrupt.requested() {
            break Stop::Interrupted;
        }
        let Some(candidate) = shrinker.next_candidate() else { break Stop::Minimal };
        let plan = Plan { ops: candidate.clone(), ..start.clone() };
        let mut reproduced = None;
        let mut notes = Vec::new();
        for _ in 0..limits.confirm {
            if runs >= limits.max_runs {
                break 'shrink Stop::Runs;
            }
            if Instant::now() >= deadline {
                break 'shrink Stop::Budget;
            }
            runs += 1;
            // A candidate still running when the budget ends is dropped: its stack is torn down
            // by the target's Drop.
            let r = tokio::select! {
                r = execute(&x, &spec, &record.profile, &plan) => r?,
                _ = tokio::time::sleep_until(deadline) => break 'shrink Stop::Budget,
            };
            match r.outcome {
                Err(Interrupted) | Ok(Outcome::Stopped { .. }) => break 'shrink Stop::Interrupted,
                Ok(Outcome::Failed(f)) if same(&f) => {
                    reproduced = Some(f);
                    break;
                }
                Ok(Outcome::Failed(f)) => notes.push(format!("failed differently: {}", describe(&f))),
                Ok(Outcome::Pass { .. }) => notes.push("passed".to_string()),
            }
        }
        let verdict = match &reproduced {
            Some(f) => format!("reproduced at step {}", f.step),
            None => notes.join("; "),
        };
        println!(
            "run {runs:>3} · {:>6.1}s · {:>3} ops → {verdict}",
            t0.elapsed().as_secs_f64(),
            candidate.len(),
        );
        shrinker.report(&candidate, reproduced.as_ref().map(|f| f.step));
        if let Some(f) = reproduced {
            reproductions += 1;
            best_failure = f;
        }
    };

    let best = shrinker.best().to_vec();
    let complete = matches!(stop, Stop::Minimal);
    let why = match stop {
        Stop::Minimal => "1-minimal: removing any one op makes the failure go away".to_string(),
        Stop::Runs => format!("stopped at --max-runs {}", limits.max_runs),
        Stop::Budget => format!("stopped: the --budget of {} is spent", humantime::format_duration(limits.budget)),
        Stop::Interrupted => "interrupted".to_string(),
    };
    println!(
        "shrunk {} → {} ops in {runs} runs ({:.0}s); {why}",
        record.plan.ops.len(),
        best.len(),
        t0.elapsed().as_secs_f64()
    );
    if reproductions == 0 && runs > 0 {
        println!("no candidate reproduced the failure; if it does not reproduce every time, try --confirm 3 (see `shakedown replay {} --times 5`)", file.display());
    }
    // Worth writing: a shorter plan, or the proof that the plan is 1-minimal.
    if best.len() < start.ops.len() || complete {
        let previous_runs = record.shrunk.as_ref().map_or(0, |s| s.runs);
        record.shrunk = Some(Shrunk { runs: previous_runs + runs, complete, at: now_rfc3339(), failure: best_failure, ops: best.clone(), confirm: Some(limits.confirm), needs: Some(1), matched: Some(Match::Invariant) });
        // Atomic replace: an interrupted write leaves the original record as it was.
        record.rewrite(file).map_err(|e| Fatal::environment(format!("cannot rewrite {}: {e}", file.display())))?;
        println!("written into {} (the original plan stays; `--original` replays it)", file.display());
        for (i, op) in best.iter().enumerate() {
            println!("{:>4}  {op}", i + 1);
        }
        println!("shakedown replay {}", file.display());
    }
    Ok(if matches!(stop, Stop::Interrupted) { Exit::Interrupted } else { Exit::Pass })
}
