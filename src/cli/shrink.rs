//! `shakedown shrink FILE`: minimise a failing record's plan by re-executing candidates on fresh
//! stacks ([`crate::faults::Shrinker`] proposes them), within a time and a run budget.

use std::path::Path;
use std::time::Duration;

use crate::clock::now_rfc3339;
use crate::engine::Outcome;
use crate::exit::{Exit, Fatal};
use crate::faults::{Op, Plan, Shrinker};
use crate::record::{Failure, FailureKind, Match, SeedRecord, Shrunk};
use crate::targets::TargetSpec;
use tokio::time::Instant;

use super::session::{create_run_dir, describe, execute, new_run_id, Exec, Interrupted};
use super::RunOpts;

pub struct Limits {
    pub budget: Duration,
    pub max_runs: u32,
    /// Runs a candidate gets at most.
    pub confirm: u32,
    /// Runs of those that must fail the same way for the candidate to count as failing
    /// (`needs <= confirm`, checked by the command line).
    pub needs: u32,
    /// What "the same way" is: the same kind and invariant, at any step or at the step the
    /// recorded failure maps to.
    pub matching: Match,
}

/// Whether a candidate failed the same way: for [`Match::Defect`], naming the same known defect;
/// otherwise the same kind and invariant as `target`, and for
/// [`Match::Step`] at the step the recorded failure maps to in `candidate`: bring-up stays
/// bring-up, healing stays healing (past the candidate's last op), and a failure at an op is
/// at the candidate's last op (every candidate is cut after the failing step), which must be an
/// op of the same kind as the recorded failing op.
pub fn same_way(matching: Match, target: &Failure, recorded_ops: &[Op], candidate: &[Op], f: &Failure) -> bool {
    // A candidate whose failure names the recorded defect fails the same way, whichever check
    // saw it first.
    if matching == Match::Defect {
        return Match::Defect.matches(target, f);
    }
    if !Match::Invariant.matches(target, f) {
        return false;
    }
    match matching {
        Match::Invariant | Match::Defect => true,
        Match::Step if target.step == 0 => f.step == 0,
        Match::Step if target.step > recorded_ops.len() => f.step == candidate.len() + 1,
        Match::Step => f.step == candidate.len() && f.step > 0 && candidate[f.step - 1].kind() == recorded_ops[target.step - 1].kind(),
    }
}

/// How the runs of one candidate went.
#[derive(Debug, Default, PartialEq)]
pub struct Confirm {
    pub runs: u32,
    pub hits: u32,
}

impl Confirm {
    /// Whether to run the candidate again: fewer than `needs` hits so far, and still reachable
    /// within `confirm` runs.
    pub fn goes_on(&self, confirm: u32, needs: u32) -> bool {
        self.hits < needs && self.runs < confirm && self.hits + (confirm - self.runs) >= needs
    }
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
    let group = create_run_dir(&opts.runs_dir, &format!("shrink-{}", new_run_id().trim_start_matches("sd-")))?;
    // A safety violation during the steps needs no healing phase to show.
    let skip_liveness = target_failure.kind == FailureKind::Violation && target_failure.step <= start.ops.len();
    let x = Exec { opts, json_logs, interrupt, runs_dir: &group, record: false, verbose: false, bar: None, skip_liveness, replaying: None };

    let initial = start.run_profile(&record.profile).initial_model();
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
        "{} ops ran up to the failure; budget {} or {} runs, confirm {}{}, match {}; candidate runs in {}",
        shrinker.best().len(),
        humantime::format_duration(limits.budget),
        limits.max_runs,
        limits.confirm,
        if limits.needs > 1 { format!(" (needs {})", limits.needs) } else { String::new() },
        limits.matching.name(),
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
        // The matching failure at the latest step: the candidate is cut after it, so it keeps
        // the ops every reproducing run needed.
        let mut reproduced: Option<Failure> = None;
        let mut notes = Vec::new();
        let mut tally = Confirm::default();
        while tally.goes_on(limits.confirm, limits.needs) {
            if runs >= limits.max_runs {
                break 'shrink Stop::Runs;
            }
            if Instant::now() >= deadline {
                break 'shrink Stop::Budget;
            }
            runs += 1;
            tally.runs += 1;
            // A candidate still running when the budget ends is dropped: its stack is torn down
            // by the target's Drop.
            let r = tokio::select! {
                r = execute(&x, &spec, &record.profile, &plan) => r?,
                _ = tokio::time::sleep_until(deadline) => break 'shrink Stop::Budget,
            };
            match r.outcome {
                Err(Interrupted) | Ok(Outcome::Stopped { .. }) => break 'shrink Stop::Interrupted,
                Ok(Outcome::Failed(f)) if same_way(limits.matching, &target_failure, &start.ops, &candidate, &f) => {
                    tally.hits += 1;
                    if reproduced.as_ref().is_none_or(|r| f.step > r.step) {
                        reproduced = Some(f);
                    }
                }
                Ok(Outcome::Failed(f)) => notes.push(format!("failed differently: {}", describe(&f))),
                Ok(Outcome::Pass { .. }) => notes.push("passed".to_string()),
            }
        }
        let fails = tally.hits >= limits.needs;
        let of_runs = if limits.confirm > 1 {
            format!(" ({} of {} runs reproduced, needs {})", tally.hits, tally.runs, limits.needs)
        } else {
            String::new()
        };
        let verdict = match &reproduced {
            Some(f) if fails => format!("reproduced at step {}{of_runs}", f.step),
            Some(_) => format!("{}; not enough{of_runs}", notes.join("; ")),
            None => notes.join("; "),
        };
        let reproduced = reproduced.filter(|_| fails);
        println!("run {runs:>3} · {:>6.1}s · {:>3} ops → {verdict}", t0.elapsed().as_secs_f64(), candidate.len(),);
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
    println!("shrunk {} → {} ops in {runs} runs ({:.0}s); {why}", record.plan.ops.len(), best.len(), t0.elapsed().as_secs_f64());
    if reproductions == 0 && runs > 0 {
        println!(
            "no candidate reproduced the failure; if it does not reproduce every time, try --confirm 3 (see `shakedown replay {} --times 5`){}",
            file.display(),
            if limits.matching == Match::Step { ", or --match invariant if its step moves" } else { "" }
        );
    }
    // Worth writing: a shorter plan, or the proof that the plan is 1-minimal.
    if best.len() < start.ops.len() || complete {
        let previous_runs = record.shrunk.as_ref().map_or(0, |s| s.runs);
        record.shrunk = Some(Shrunk {
            runs: previous_runs + runs,
            complete,
            at: now_rfc3339(),
            failure: best_failure,
            ops: best.clone(),
            confirm: Some(limits.confirm),
            needs: Some(limits.needs),
            matched: Some(limits.matching),
        });
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

#[cfg(test)]
mod tests {
    use crate::faults::MemberId;
    use crate::invariants::InvariantId;

    use super::*;

    /// `--needs J` of `--confirm K`: stop as soon as J runs reproduced, or as soon as the runs
    /// left cannot make J.
    #[test]
    fn a_candidate_runs_until_needs_is_reached_or_out_of_reach() {
        let after = |outcomes: &[bool], confirm: u32, needs: u32| {
            let mut t = Confirm::default();
            let mut it = outcomes.iter();
            while t.goes_on(confirm, needs) {
                t.runs += 1;
                t.hits += u32::from(*it.next().expect("ran past the outcomes given"));
            }
            (t.runs, t.hits >= needs)
        };
        // needs 1: today's --confirm, stops at the first reproduction.
        assert_eq!(after(&[true], 3, 1), (1, true));
        assert_eq!(after(&[false, false, true], 3, 1), (3, true));
        assert_eq!(after(&[false, false, false], 3, 1), (3, false));
        // needs 2 of 3.
        assert_eq!(after(&[true, true], 3, 2), (2, true));
        assert_eq!(after(&[true, false, true], 3, 2), (3, true));
        assert_eq!(after(&[false, false], 3, 2), (2, false), "out of reach after two misses");
        assert_eq!(after(&[true, false, false], 3, 2), (3, false));
        // needs all.
        assert_eq!(after(&[false], 4, 4), (1, false));
        assert_eq!(after(&[true, true, true, true], 4, 4), (4, true));
    }

    #[test]
    fn the_same_way_by_invariant_or_by_step() {
        let recorded = vec![Op::Crash { member: MemberId(0) }, Op::Backup, Op::Restart { member: MemberId(0) }];
        let at = |step: usize| Failure {
            kind: FailureKind::Violation,
            step,
            op: String::new(),
            invariant: Some(InvariantId::Durability),
            also: vec![],
            message: String::new(),
            at: String::new(),
        };
        let target = at(3);
        // The candidate without the backup: the restart is its step 2.
        let candidate = vec![recorded[0].clone(), recorded[2].clone()];
        assert!(same_way(Match::Step, &target, &recorded, &candidate, &at(2)));
        assert!(!same_way(Match::Step, &target, &recorded, &candidate, &at(1)), "an earlier step");
        assert!(same_way(Match::Invariant, &target, &recorded, &candidate, &at(1)));
        // The failing op itself removed: its last op is another kind.
        assert!(!same_way(Match::Step, &target, &recorded, &recorded[..2], &at(2)));
        assert!(same_way(Match::Invariant, &target, &recorded, &recorded[..2], &at(2)));
        let other = Failure { invariant: Some(InvariantId::Membership), ..at(2) };
        assert!(!same_way(Match::Invariant, &target, &recorded, &candidate, &other));
        // Bring-up stays bring-up; healing stays healing.
        assert!(same_way(Match::Step, &at(0), &recorded, &[], &at(0)));
        assert!(!same_way(Match::Step, &at(0), &recorded, &candidate, &at(1)));
        let healing = Failure { kind: FailureKind::Liveness, invariant: None, ..at(4) };
        let healed_late = Failure { step: 3, ..healing.clone() };
        assert!(same_way(Match::Step, &healing, &recorded, &candidate, &healed_late));
        assert!(!same_way(Match::Step, &healing, &recorded, &candidate, &Failure { step: 2, ..healing.clone() }));
    }
}
