//! shakedown's invariants: pure checks of an [`Observation`] against the [`Model`].
//!
//! Architecture invariant: this crate never does IO. The targets observe; this crate judges.

mod consistency;
mod durability;
mod leaks;
mod members;
mod membership;
pub mod observation;
mod quorum;
mod reachability;

use std::fmt;

use serde::{Deserialize, Serialize};
use shakedown_faults::{MemberId, Model};

pub use durability::{expect_write, Expect};
pub use observation::{Acked, Durability, Inventory, KubeInventory, Leader, LocalInventory, ListedMember, Marks, MemberStatus, Observation, Probe, ServingSample};

/// The shortest quorum loss during a step that counts as a violation (milliseconds).
pub const MIN_LOSS_WINDOW_MS: u64 = 25;

/// How far (in revisions) a reachable member's store may trail the most advanced member's
/// before `consistency` calls it stalled. Followers trail by a few revisions under load; a store
/// that stopped applying falls further behind with every write.
pub const MAX_REVISION_LAG: i64 = 1000;

/// How long (seconds) an object may stay in deletion before the kube target's `leaks` calls it
/// stuck (finalizers that never finish).
pub const STUCK_DELETION_SECS: u64 = 120;

shakedown_faults::registry! {
    /// The registered invariants. Declaration order is checking order: structure first (who is
    /// in the cluster, who answers), so the first failure reported is the most direct one.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum InvariantId: "invariant" {
        /// The etcd member list equals the model's members: nothing stale, nothing missing.
        Membership => "membership",
        /// Nothing of the run is on the machine that the model does not expect (processes, mounts,
        /// loop devices, data directories, partition rules, backup files), and the disks, data
        /// directories, rules and backups it expects are there.
        Leaks => "leaks",
        /// Every member answers as the model expects: running members answer and see a leader,
        /// paused, crashed and cut-off members do not answer.
        Members => "members",
        /// Exactly one leader among reachable members; members serving ≥ quorum whenever the model
        /// says quorum holds, at the end of a step and at every instant during it.
        Quorum => "quorum",
        /// Members agree on the KV hash at a common revision, and no member's store falls more than
        /// [`MAX_REVISION_LAG`] revisions behind the most advanced one.
        Consistency => "consistency",
        /// A linearizable read through the endpoint succeeds within the deadline whenever the model
        /// says the service is up.
        Reachability => "reachability",
        /// Every acknowledged write is readable with its value (after a restore: the writes before
        /// the backup; writes after the backup and before the restore are gone).
        Durability => "durability",
    }
}

impl InvariantId {
    /// Checks this invariant. [`Verdict::Fail`] may still go away as the stack converges;
    /// [`Verdict::Definite`] cannot.
    pub fn check(self, model: &Model, obs: &Observation) -> Verdict {
        match self {
            InvariantId::Quorum => quorum::quorum(model, obs),
            InvariantId::Members => members::members(model, obs),
            InvariantId::Membership => membership::membership(model, obs),
            InvariantId::Consistency => consistency::consistency(obs),
            InvariantId::Reachability => reachability::reachability(model, obs),
            InvariantId::Durability => durability::durability(model, obs),
            InvariantId::Leaks => leaks::leaks(model, obs),
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Broken now; may still converge.
    Fail(String),
    /// Broken for good: a sample taken during the step, or an acknowledged write missing from a
    /// successful linearizable read. Waiting cannot fix it.
    Definite(String),
}

impl Verdict {
    pub fn is_pass(&self) -> bool {
        matches!(self, Verdict::Pass)
    }
    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Pass => None,
            Verdict::Fail(m) | Verdict::Definite(m) => Some(m),
        }
    }
}

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub invariant: InvariantId,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.invariant, self.message)
    }
}

/// Checks `ids` in order; returns every failure.
pub fn check_all(ids: &[InvariantId], model: &Model, obs: &Observation) -> Vec<(InvariantId, Verdict)> {
    ids.iter().map(|&id| (id, id.check(model, obs))).filter(|(_, v)| !v.is_pass()).collect()
}

pub(crate) fn names(ids: &[String]) -> String {
    if ids.is_empty() {
        "none".into()
    } else {
        ids.join(", ")
    }
}


/// Members of the model the observation says are not serving: for progress lines and forensics.
pub fn unreachable_members(model: &Model, obs: &Observation) -> Vec<MemberId> {
    model
        .members
        .keys()
        .filter(|id| !obs.members.iter().any(|m| m.member == Some(**id) && m.reachable))
        .copied()
        .collect()
}
