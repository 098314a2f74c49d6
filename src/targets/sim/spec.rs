//! What a seed record says about a simulated stack (its bugs), and the `--sim-bug` flag.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use shakedown_faults::OpKind;

use crate::exit::Fatal;

shakedown_faults::registry! {
    /// A misbehaviour of the simulated stack.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum SimBugKind: "sim bug" {
        /// The store drops the last write it acknowledged in the step (`durability`, definite).
        LoseWrite => "lose-write",
        /// From this op on, the workload's reads of the key last written answer the value it
        /// held before that write, at the current revision: a stale read only the history shows
        /// (`linearizability`, definite; the store and the read-back are right).
        StaleRead => "stale-read",
        /// A member serves the store as it was before the step's writes while reporting the same
        /// applied index as the others (`consistency`, definite).
        StaleMember => "stale-member",
        /// A member answers only from the step's fourth observation on (`members` fails, then the
        /// checks converge).
        SlowConverge => "slow-converge",
        /// A member stops answering for good (`members` until the converge bound: a violation).
        NeverConverge => "never-converge",
        /// Reads through the endpoint fail from this op on (`reachability` until the converge
        /// bound: a violation).
        DeadEndpoint => "dead-endpoint",
        /// From the step's fourth observation on, no member sees a leader (`members` fails late
        /// in the check: an election at the end of a check that something else failed all along).
        LateLeaderless => "late-leaderless",
        /// The op fails (a stack error: liveness, unless an invariant names it first).
        OpFails => "op-fails",
        /// The op fails for an environment reason (exit 4).
        EnvError => "env-error",
        /// The target panics while executing the op (exit 5; teardown still runs).
        Panic => "panic",
        /// From this op on, observations leave out the data read-back although the target checks
        /// `durability` (exit 5: shakedown's own bug).
        Unobserved => "unobserved",
        /// The target refuses ops of this kind (`supports`): the engine skips them and what
        /// depended on them.
        Unsupported => "unsupported",
        /// Not a bug of the stack: the workload acknowledges no write at this op (a paused client, a
        /// stack that served nothing), so marks around it fall on the same acknowledgement count.
        Quiet => "quiet",
        /// Not a bug either: the op takes [`super::SLOW_OP`] (the simulated stack's one use of time,
        /// so that a test's signal lands in the middle of a run).
        SlowOp => "slow-op",
        /// Not a bug of the stack: the step's first observation sees a member down (as at its
        /// start, a member restarting) and then takes [`super::SLOW_OBSERVATION`] (a long history
        /// to judge), past a shorter converge bound; the member answers from the second on.
        SlowObservation => "slow-observation",
    }
}

/// When a bug fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// At the N-th op the target executes (1-based; heal ops count, skipped ops do not).
    Op(usize),
    /// At every op of this kind.
    Kind(OpKind),
}

impl Trigger {
    pub fn fires(self, executed: usize, kind: Option<OpKind>) -> bool {
        match self {
            Trigger::Op(n) => n == executed,
            Trigger::Kind(k) => kind == Some(k),
        }
    }

    /// Whether ops of `kind` are meant (an `@N` trigger names no kind).
    pub fn matches_kind(self, kind: OpKind) -> bool {
        matches!(self, Trigger::Kind(k) if k == kind)
    }
}

/// A bug and when it fires: `lose-write@crash`, `op-fails@3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimBug {
    pub kind: SimBugKind,
    pub at: Trigger,
}

impl fmt::Display for SimBug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Trigger::Op(n) => write!(f, "{}@{n}", self.kind),
            Trigger::Kind(k) => write!(f, "{}@{k}", self.kind),
        }
    }
}

/// Why a `--sim-bug` value (or a recorded one) is not a sim bug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimBugError {
    #[error("{text:?}: expected BUG@N or BUG@OP-KIND, e.g. lose-write@crash")]
    Syntax { text: String },
    /// Not a sim bug's name (the registry's message lists the known ones).
    #[error("{0}")]
    Kind(shakedown_faults::UnknownName),
    #[error("{text:?}: ops are counted from 1")]
    ZeroOp { text: String },
    /// The trigger is neither an op number nor an op kind.
    #[error("{text:?}: {source}")]
    OpKind { text: String, source: shakedown_faults::UnknownName },
}

impl FromStr for SimBug {
    type Err = SimBugError;
    fn from_str(s: &str) -> Result<SimBug, SimBugError> {
        let (kind, at) = s.split_once('@').ok_or_else(|| SimBugError::Syntax { text: s.to_string() })?;
        let kind: SimBugKind = kind.parse().map_err(SimBugError::Kind)?;
        let at = match at.parse::<usize>() {
            Ok(0) => return Err(SimBugError::ZeroOp { text: s.to_string() }),
            Ok(n) => Trigger::Op(n),
            Err(_) => Trigger::Kind(at.parse::<OpKind>().map_err(|source| SimBugError::OpKind { text: s.to_string(), source })?),
        };
        Ok(SimBug { kind, at })
    }
}

impl Serialize for SimBug {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SimBug {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SimBug, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A simulated stack as a seed record names it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bugs: Vec<SimBug>,
}

impl SimSpec {
    /// A new run's spec from the flags, or the recorded one (flags given replace its bugs).
    pub fn from_options(opts: &SimOptions, recorded: Option<&SimSpec>) -> SimSpec {
        match (opts.sim_bug.is_empty(), recorded) {
            (true, Some(r)) => r.clone(),
            _ => SimSpec { bugs: opts.sim_bug.clone() },
        }
    }

    pub fn describe(&self) -> String {
        match self.bugs.is_empty() {
            true => "sim".into(),
            false => format!("sim · bugs {}", self.bugs.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ")),
        }
    }
}

/// The simulated target's command-line options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SimOptions {
    /// sim target (shakedown's own tests): switch on a misbehaviour of the simulated stack,
    /// BUG@N (the N-th op executed) or BUG@OP-KIND (every op of that kind); BUG is one of
    /// lose-write, stale-read, stale-member, slow-converge, never-converge, dead-endpoint, late-leaderless,
    /// op-fails, env-error, panic, unobserved, unsupported, quiet, slow-op, slow-observation (repeatable).
    #[arg(long = "sim-bug", value_name = "BUG@WHEN")]
    pub sim_bug: Vec<SimBug>,
}

impl SimOptions {
    pub fn refuse_for(&self, target: &str) -> Result<(), Fatal> {
        let given: Vec<&str> = if self.sim_bug.is_empty() { vec![] } else { vec!["--sim-bug"] };
        crate::targets::refuse_options(&given, "sim", target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--sim-bug`'s help names every simulated misbehaviour.
    #[test]
    fn the_sim_bug_help_names_every_sim_bug() {
        let cmd = <SimOptions as clap::Args>::augment_args(clap::Command::new("run"));
        let arg = cmd.get_arguments().find(|a| a.get_id() == "sim_bug").expect("--sim-bug");
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        for bug in SimBugKind::ALL {
            assert!(help.contains(bug.name()), "--sim-bug's help lacks {bug}: {help}");
        }
    }
}
