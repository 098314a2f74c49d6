//! Shrinking a failing plan: delta debugging over the op list that only ever proposes valid plans.
//!
//! [`Shrinker`] is a pure state machine: it proposes a candidate op list, is told whether the
//! candidate reproduced the failure (and at which step), and proposes the next one, until the
//! best list is 1-minimal (removing any single op makes the failure go away). Executing the
//! candidates, budgets and flakiness are the caller's business (`shakedown shrink`).
//!
//! The strategy is the complement half of Zeller's ddmin, which suits plans whose failure needs
//! a few ops (a backup and its restore, an outage and its recovery): remove chunks of the list,
//! halving the chunk size whenever no chunk can go, down to single ops. Two more reductions come
//! free: a candidate that fails at step `s` is cut after `s` (later ops never ran), and removing
//! an op drops every later op whose precondition no longer holds ([`repair`]), so a candidate is
//! always a plan the model accepts. Candidates seen before are not proposed again.

use std::collections::HashSet;

use crate::model::{BackupId, Model};
use crate::op::Op;

/// `ops` with every op whose precondition does not hold (after the ops kept before it) dropped.
pub fn repair(initial: &Model, ops: &[Op]) -> Vec<Op> {
    let mut model = initial.clone();
    ops.iter().filter(|op| model.apply(op).is_ok()).cloned().collect()
}

/// `ops` without `ops[from..to]`, backups renumbered: a backup is named by its position among
/// the plan's backups, so a restore of a later backup follows it to its new name, and a restore
/// of a removed backup goes too.
pub fn without(ops: &[Op], from: usize, to: usize) -> Vec<Op> {
    let mut renamed: Vec<Option<u32>> = Vec::new();
    let mut kept = 0u32;
    let mut out = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let removed = (from..to).contains(&i);
        match op {
            Op::Backup => {
                renamed.push((!removed).then_some(kept));
                if !removed {
                    kept += 1;
                    out.push(Op::Backup);
                }
            }
            Op::Restore { backup } if !removed => {
                if let Some(Some(b)) = renamed.get(backup.0 as usize) {
                    out.push(Op::Restore { backup: BackupId(*b) });
                }
            }
            Op::RestorePitr { backup, at } if !removed => {
                if let Some(Some(b)) = renamed.get(backup.0 as usize) {
                    out.push(Op::RestorePitr { backup: BackupId(*b), at: *at });
                }
            }
            _ if !removed => out.push(op.clone()),
            _ => {}
        }
    }
    out
}

/// The ops that ran up to and including the failing `step` (1-based; 0 = at bring-up, so no op
/// was needed; past the end = after healing, so all of them).
pub fn ran_until(ops: &[Op], step: usize) -> &[Op] {
    &ops[..step.min(ops.len())]
}

#[derive(Debug, Clone)]
pub struct Shrinker {
    initial: Model,
    best: Vec<Op>,
    /// Size of the chunk removed by the candidates of the current pass.
    chunk: usize,
    /// Start of the next chunk to try removing in `best`.
    pos: usize,
    /// Whether this pass removed anything (a pass at chunk size 1 that removed something is
    /// repeated until it removes nothing: then `best` is 1-minimal).
    removed_in_pass: bool,
    tried: HashSet<Vec<Op>>,
    done: bool,
}

impl Shrinker {
    /// Starts from the ops of a failing plan, cut after the step that failed.
    pub fn new(initial: Model, ops: &[Op], failing_step: usize) -> Shrinker {
        let best = repair(&initial, ran_until(ops, failing_step));
        let chunk = best.len().div_ceil(2).max(1);
        let mut tried = HashSet::new();
        tried.insert(best.clone());
        Shrinker { initial, done: best.is_empty(), best, chunk, pos: 0, removed_in_pass: false, tried }
    }

    /// The smallest failing op list found so far.
    pub fn best(&self) -> &[Op] {
        &self.best
    }

    /// True once `best` is 1-minimal: no candidate is left.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The next candidate to execute, or `None` when `best` is 1-minimal.
    pub fn next_candidate(&mut self) -> Option<Vec<Op>> {
        while !self.done {
            if self.pos >= self.best.len() {
                // End of a pass.
                if self.chunk == 1 && !self.removed_in_pass {
                    self.done = true;
                    return None;
                }
                self.chunk = if self.chunk == 1 { 1 } else { self.chunk.div_ceil(2) };
                self.pos = 0;
                self.removed_in_pass = false;
                continue;
            }
            let end = (self.pos + self.chunk).min(self.best.len());
            let candidate = repair(&self.initial, &without(&self.best, self.pos, end));
            if self.tried.insert(candidate.clone()) {
                return Some(candidate);
            }
            // Already executed (or it is `best` itself): move on.
            self.pos += self.chunk;
        }
        None
    }

    /// The outcome of executing `candidate` (the last one proposed): `Some(step)` when it
    /// reproduced the failure at that step, `None` when it did not.
    pub fn report(&mut self, candidate: &[Op], reproduced_at: Option<usize>) {
        match reproduced_at {
            Some(step) => {
                self.best = ran_until(candidate, step).to_vec();
                self.tried.insert(self.best.clone());
                self.removed_in_pass = true;
                // `pos` stays: the chunk now there is the next one to try.
                if self.best.is_empty() {
                    self.done = true;
                }
            }
            None => self.pos += self.chunk,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{MemberId, SiteId, Version};
    use crate::op::Op;

    fn model() -> Model {
        Model::new(3, 3, vec![Version::new(3, 4), Version::new(3, 5)], 2)
    }

    /// Runs the shrinker against a pure oracle; returns (best, executions).
    fn shrink_with(ops: &[Op], step: usize, fails_at: impl Fn(&[Op]) -> Option<usize>) -> (Vec<Op>, usize) {
        let mut s = Shrinker::new(model(), ops, step);
        let mut runs = 0;
        while let Some(c) = s.next_candidate() {
            runs += 1;
            assert!(runs < 1000, "shrinker does not terminate");
            let r = fails_at(&c);
            s.report(&c, r);
        }
        (s.best().to_vec(), runs)
    }

    fn filler(n: usize) -> Vec<Op> {
        (0..n).flat_map(|i| [Op::Crash { member: MemberId(i as u32 % 3) }, Op::Restart { member: MemberId(i as u32 % 3) }]).collect()
    }

    #[test]
    fn repair_drops_ops_whose_precondition_no_longer_holds() {
        let ops = vec![Op::Crash { member: MemberId(0) }, Op::Restart { member: MemberId(0) }];
        assert_eq!(repair(&model(), &ops[1..]), Vec::<Op>::new(), "restart without a crash is dropped");
        assert_eq!(repair(&model(), &ops), ops);
    }

    #[test]
    fn a_single_needed_op_is_found_and_everything_else_goes() {
        let mut ops = filler(10);
        ops.insert(13, Op::Backup);
        let needs_backup = |c: &[Op]| c.iter().position(|o| *o == Op::Backup).map(|i| i + 1);
        let (best, runs) = shrink_with(&ops, ops.len(), needs_backup);
        assert_eq!(best, vec![Op::Backup]);
        assert!(runs <= 20, "{runs} executions");
    }

    #[test]
    fn a_pair_that_depends_on_each_other_survives_together() {
        // A failure needing an outage of site 1 and its recovery, in a 34-op plan.
        let mut ops = filler(16);
        ops.insert(5, Op::SiteOutage { site: SiteId(1), mode: crate::model::OutageMode::Isolate });
        ops.insert(27, Op::SiteRecover { site: SiteId(1) });
        let needs = |c: &[Op]| {
            let o = c.iter().position(|o| matches!(o, Op::SiteOutage { .. }))?;
            let r = c.iter().position(|o| matches!(o, Op::SiteRecover { .. }))?;
            (o < r).then_some(r + 1)
        };
        let (best, runs) = shrink_with(&ops, ops.len(), needs);
        assert_eq!(best.len(), 2, "{best:?}");
        assert!(runs <= 40, "{runs} executions");
        assert!(repair(&model(), &best) == best, "the shrunk plan is valid");
    }

    #[test]
    fn removing_backups_renames_the_restores_that_follow() {
        let ops: Vec<Op> = vec![Op::Backup, Op::Backup, Op::Restore { backup: BackupId(1) }, Op::Restore { backup: BackupId(0) }];
        assert_eq!(without(&ops, 0, 1), vec![Op::Backup, Op::Restore { backup: BackupId(0) }], "b1 became b0; b0's restore went with it");
        let pitr =
            vec![Op::Backup, Op::Backup, Op::RestorePitr { backup: BackupId(1), at: 7 }, Op::RestorePitr { backup: BackupId(0), at: 2 }];
        assert_eq!(without(&pitr, 0, 1), vec![Op::Backup, Op::RestorePitr { backup: BackupId(0), at: 7 }], "the pick goes with it");
        // A restore of the 7th backup shrinks to one backup and its restore.
        let mut ops: Vec<Op> = vec![Op::Backup; 7];
        ops.push(Op::Restore { backup: BackupId(6) });
        let restores_last = |c: &[Op]| matches!(c.last(), Some(Op::Restore { .. })).then_some(c.len());
        let (best, runs) = shrink_with(&ops, ops.len(), restores_last);
        assert_eq!(best, vec![Op::Backup, Op::Restore { backup: BackupId(0) }]);
        assert!(runs <= 12, "{runs}");
    }

    #[test]
    fn ops_after_the_failing_step_are_cut_without_running() {
        let ops = filler(10);
        let s = Shrinker::new(model(), &ops, 4);
        assert_eq!(s.best(), &ops[..4]);
        let s = Shrinker::new(model(), &ops, 0);
        assert!(s.is_done() && s.best().is_empty(), "a bring-up failure needs no op");
    }

    #[test]
    fn a_failure_that_needs_everything_stays_whole_and_terminates() {
        let ops = filler(3);
        let all = ops.clone();
        let (best, _) = shrink_with(&ops, ops.len(), |c| (c == all.as_slice()).then_some(c.len()));
        assert_eq!(best, ops);
    }

    #[test]
    fn a_candidate_failing_early_is_cut_at_its_failing_step() {
        let ops = filler(8);
        // Fails at the first crash of member 2, wherever it is.
        let first_crash_2 = |c: &[Op]| c.iter().position(|o| *o == Op::Crash { member: MemberId(2) }).map(|i| i + 1);
        let (best, _) = shrink_with(&ops, ops.len(), first_crash_2);
        assert_eq!(best, vec![Op::Crash { member: MemberId(2) }]);
    }
}
