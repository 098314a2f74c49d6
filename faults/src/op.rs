//! The op catalogue: each op has a precondition on the model ([`Model::check`]) and an
//! expected effect ([`Model::apply`]). Execution lives in the targets.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::{MemberId, MemberState, Model, Version};

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Op {
    /// `kill -9` the member's process.
    Crash { member: MemberId },
    /// Start a crashed member again on its own data.
    Restart { member: MemberId },
    /// SIGSTOP the member's process.
    Pause { member: MemberId },
    /// SIGCONT a paused member.
    Resume { member: MemberId },
    /// One member at a time: stop, start the `to` binary on the same data, wait until healthy
    /// and caught up, then the next.
    RollingUpgrade { to: Version },
    /// The KubeadmControlPlane way, one member at a time: add a new member on a fresh disk in
    /// the same site, wait until it caught up, remove the old member, stop it, release its disk.
    RollingReplace,
}

/// The family of an op: what profiles weigh and reports count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OpKind {
    Crash,
    Restart,
    Pause,
    Resume,
    RollingUpgrade,
    RollingReplace,
}

impl OpKind {
    /// Every registered op kind, in a fixed order (generation depends on it).
    pub const ALL: [OpKind; 6] = [
        OpKind::Crash,
        OpKind::Restart,
        OpKind::Pause,
        OpKind::Resume,
        OpKind::RollingUpgrade,
        OpKind::RollingReplace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Crash => "crash",
            OpKind::Restart => "restart",
            OpKind::Pause => "pause",
            OpKind::Resume => "resume",
            OpKind::RollingUpgrade => "rolling-upgrade",
            OpKind::RollingReplace => "rolling-replace",
        }
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OpKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OpKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let known: Vec<_> = OpKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown op {s:?}; known ops: {}", known.join(", "))
        })
    }
}

impl Op {
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Crash { .. } => OpKind::Crash,
            Op::Restart { .. } => OpKind::Restart,
            Op::Pause { .. } => OpKind::Pause,
            Op::Resume { .. } => OpKind::Resume,
            Op::RollingUpgrade { .. } => OpKind::RollingUpgrade,
            Op::RollingReplace => OpKind::RollingReplace,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Crash { member } | Op::Restart { member } | Op::Pause { member } | Op::Resume { member } => {
                write!(f, "{}({member})", self.kind())
            }
            Op::RollingUpgrade { to } => write!(f, "rolling-upgrade(to {to})"),
            Op::RollingReplace => f.write_str("rolling-replace"),
        }
    }
}

/// Why an op cannot run in a model state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreconditionError {
    #[error("no member {0} in the model")]
    NoSuchMember(MemberId),
    #[error("{member} is {actual:?}, the op needs it {needed}")]
    WrongState { member: MemberId, actual: MemberState, needed: &'static str },
    #[error("{down} members would be down at once, more than max_down = {max_down}")]
    TooManyDown { down: usize, max_down: usize },
    #[error("version {to} is not newer than the oldest running version {oldest}")]
    NotNewer { to: Version, oldest: Version },
    #[error("version {0} is not one of the profile's versions")]
    UnknownVersion(Version),
}

impl Model {
    /// The precondition of `op` in this state.
    pub fn check(&self, op: &Op) -> Result<(), PreconditionError> {
        let state_is = |member: MemberId, ok: &[MemberState], needed: &'static str| {
            let actual = self.member(member)?.state;
            if ok.contains(&actual) {
                Ok(())
            } else {
                Err(PreconditionError::WrongState { member, actual, needed })
            }
        };
        // Taking one more member down (or, for rolling ops, one at a time) must stay within max_down.
        let one_more_down = || {
            let down = self.down() + 1;
            if down > self.max_down {
                Err(PreconditionError::TooManyDown { down, max_down: self.max_down })
            } else {
                Ok(())
            }
        };
        match *op {
            Op::Crash { member } => {
                // Crashing a paused member does not add to the count of members down.
                state_is(member, &[MemberState::Running, MemberState::Paused], "running or paused")?;
                if self.member(member)?.state == MemberState::Running {
                    one_more_down()?;
                }
                Ok(())
            }
            Op::Pause { member } => {
                state_is(member, &[MemberState::Running], "running")?;
                one_more_down()
            }
            Op::Restart { member } => state_is(member, &[MemberState::Crashed], "crashed"),
            Op::Resume { member } => state_is(member, &[MemberState::Paused], "paused"),
            Op::RollingUpgrade { to } => {
                if !self.versions.contains(&to) {
                    return Err(PreconditionError::UnknownVersion(to));
                }
                let oldest = self.oldest_version();
                if to <= oldest {
                    return Err(PreconditionError::NotNewer { to, oldest });
                }
                self.all_running()?;
                one_more_down()
            }
            Op::RollingReplace => {
                self.all_running()?;
                one_more_down()
            }
        }
    }

    fn all_running(&self) -> Result<(), PreconditionError> {
        match self.members.values().find(|m| !m.is_up()) {
            Some(m) => Err(PreconditionError::WrongState { member: m.id, actual: m.state, needed: "running (rolling ops need every member up)" }),
            None => Ok(()),
        }
    }

    /// Every op whose precondition holds now, grouped by kind in [`OpKind::ALL`] order.
    pub fn candidates(&self, kind: OpKind) -> Vec<Op> {
        let per_member = |make: fn(MemberId) -> Op| -> Vec<Op> {
            self.members.keys().map(|&m| make(m)).filter(|op| self.check(op).is_ok()).collect()
        };
        match kind {
            OpKind::Crash => per_member(|member| Op::Crash { member }),
            OpKind::Restart => per_member(|member| Op::Restart { member }),
            OpKind::Pause => per_member(|member| Op::Pause { member }),
            OpKind::Resume => per_member(|member| Op::Resume { member }),
            OpKind::RollingUpgrade => self
                .versions
                .iter()
                .map(|&to| Op::RollingUpgrade { to })
                .filter(|op| self.check(op).is_ok())
                .collect(),
            OpKind::RollingReplace => {
                if self.check(&Op::RollingReplace).is_ok() {
                    vec![Op::RollingReplace]
                } else {
                    vec![]
                }
            }
        }
    }
}
