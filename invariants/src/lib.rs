//! shakedown's invariants: pure checks of an [`Observation`] against the [`Model`].
//!
//! Architecture invariant: this crate never does IO. The targets observe; this crate judges.

mod app;
mod consistency;
mod durability;
mod known;
mod leaks;
mod leases;
pub mod linearizability;
mod members;
mod membership;
pub mod observation;
mod quorum;
mod reachability;
mod watch;

use std::fmt;

use serde::{Deserialize, Serialize};
use shakedown_faults::{MemberId, Model};

pub use durability::{expect_write, Expect};
pub use observation::{
    Ack, Acked, ApiObservation, ApiServerReady, AppData, AppInventory, AppObservation, AppWorkload, Chunked, ChunkedLog, CompactedGap,
    Durability, HistoryView, Inventory, KubeInventory, Leader, LeaseRecord, Leases, ListedMember, LocalInventory, Marks, MemberStatus,
    Observation, Probe, Revoke, ServingSample, Unknown, WatchEvent, WatchProgress, WatchSession, WatchStream,
};

/// The shortest quorum loss during a step that counts as a violation (milliseconds).
pub const MIN_LOSS_WINDOW_MS: u64 = 25;

/// How long (seconds) an object may stay in deletion before the kube target's `leaks` calls it
/// stuck (finalizers that never finish).
pub const STUCK_DELETION_SECS: u64 = 120;

shakedown_faults::registry! {
    /// The registered invariants. Declaration order is checking order: structure first (who is
    /// in the cluster, who answers), so the first failure reported is the most direct one; the
    /// Kubernetes API's after etcd's (a broken store shows first as what it is).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
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
        /// Replicas that applied the same log hold the same store: a member that applied at least
        /// as much of the raft log as another is not more than one revision below it (one entry
        /// adds at most one revision); read at quiet points (two status answers in a row agreeing)
        /// with no tolerance at all — the same applied index, the same revision; and members agree
        /// on the KV hash at a common revision.
        Consistency => "consistency",
        /// A linearizable read through the endpoint succeeds within the deadline whenever the model
        /// says the service is up.
        Reachability => "reachability",
        /// Every acknowledged write is readable with its value (after a restore: the writes before
        /// the backup; writes after the backup and before the restore are gone).
        Durability => "durability",
        /// Every long-lived watch keeps etcd's watch guarantees across resumptions: only events of
        /// its range, each revision once, in order, in one response; the acknowledged value, and
        /// the `prev_kv`, create revision and version the key's earlier events imply; nothing no
        /// client wrote; every acknowledged write up to how far it got — or compaction reported
        /// explicitly; and no progress notification ahead of the events it vouches for.
        Watch => "watch",
        /// A key whose lease expired or was revoked is gone; a key whose lease is alive is not.
        Leases => "leases",
        /// Every answer the workload's clients got is explained by one order of their requests
        /// consistent with real time: per key, etcd's semantics (values, mod and create
        /// revisions, versions, guarded transactions with both branches, requests of unknown
        /// outcome applied or not); across keys, no request sent after another was answered is
        /// answered at a lower revision (a stale read); a serializable read (or a read at a
        /// revision) returns exactly the key's state at the revision it claims, and claims no
        /// lower revision than the same member claimed for the same client's earlier one (a
        /// member's store never goes back). A search that
        /// runs out of its bound is a failure, never a pass.
        Linearizability => "linearizability",
        /// Every request through the API load balancer succeeds whenever the model says the
        /// control plane is up; every apiserver of a machine that answers is ready (`/readyz`), and
        /// one whose machine is down answers nothing. Only where an API is under test.
        ApiReachability => "api-reachability",
        /// Every create, update and delete the Kubernetes API acknowledged is reflected by a quorum
        /// LIST (after a restore of the API's etcd: what came before the backup is there, what came
        /// after is not). Only where an API is under test.
        ApiDurability => "api-durability",
        /// Every watch of the API workload's objects delivers each acknowledged change in order,
        /// once, across resumptions from its last resourceVersion — or an explicit "too old" that
        /// it recovers from by relisting (a new session), never a silent gap.
        ApiWatch => "api-watch",
        /// Every answer the API workload's writers got, and every quorum LIST of the checks, is
        /// explained by one order of the requests consistent with real time, with etcd's
        /// semantics over resourceVersions: a create succeeds only on an absent object, an update
        /// or delete only at the resourceVersion it names, a LIST shows exactly each object's
        /// state at its resourceVersion. A delete's revision is not in its answer: it counts as
        /// of unknown outcome. Only where an API is under test.
        ApiLinearizability => "api-linearizability",
        /// The application converges: every workload the app profile names has all its replicas
        /// Ready, and every probe of the profile passes. Only on the application target.
        AppReady => "app-ready",
        /// Every write of the application's data-integrity workload that its write command
        /// acknowledged is returned by its read command with its value; nothing is returned that
        /// was never written. Only on the application target.
        AppDurability => "app-durability",
        /// Every answer of the application's data workload — each write its write command
        /// acknowledged or left unknown, and each key its read command returned or did not — is
        /// explained by one order of the requests consistent with real time, each key a register
        /// written once: a key read is never gone from a later read, nothing is read before it
        /// was written, a value is the one written. After a restore each key holds what its first
        /// read says. Only on the application target.
        AppLinearizability => "app-linearizability",
    }
}

impl InvariantId {
    /// The invariants of a Kubernetes API under test.
    pub const API: [InvariantId; 4] =
        [InvariantId::ApiReachability, InvariantId::ApiDurability, InvariantId::ApiWatch, InvariantId::ApiLinearizability];

    /// Checks this invariant. [`Verdict::Fail`] may still go away as the stack converges;
    /// [`Verdict::Definite`] cannot.
    pub fn check(self, model: &Model, obs: &Observation) -> Verdict {
        self.check_with_known(model, obs).0
    }

    /// [`InvariantId::check`], with the known defects of the stack's releases the same judgement
    /// found (see [`KnownDefect`]): one pass over the observation for both.
    pub fn check_with_known(self, model: &Model, obs: &Observation) -> (Verdict, Vec<KnownDefect>) {
        let verdict = match self {
            InvariantId::Quorum => quorum::quorum(model, obs),
            InvariantId::Members => members::members(model, obs),
            InvariantId::Membership => membership::membership(model, obs),
            InvariantId::Consistency => consistency::consistency(obs),
            InvariantId::Reachability => reachability::reachability(model, obs),
            InvariantId::Durability => durability::durability(model, obs),
            InvariantId::Leaks => leaks::leaks(model, obs),
            InvariantId::Watch => return watch::watch(obs),
            InvariantId::Leases => leases::leases(model, obs),
            InvariantId::Linearizability => linearizability::linearizability(obs),
            InvariantId::ApiReachability => reachability::api_reachability(model, obs),
            InvariantId::ApiDurability => durability::api_durability(model, obs),
            InvariantId::ApiWatch => watch::api_watch(obs),
            InvariantId::ApiLinearizability => linearizability::api_linearizability(obs),
            InvariantId::AppReady => app::app_ready(model, obs),
            InvariantId::AppDurability => app::app_durability(obs),
            InvariantId::AppLinearizability => linearizability::app_linearizability(obs),
        };
        (verdict, Vec::new())
    }
}

/// A violation that is a known defect of the release the stack runs, seen in an observation:
/// reported by name at every occurrence (the event log, the run's summary), not a failure of the
/// run. The invariant's other rules, and this rule on releases without the defect, still fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KnownDefect {
    pub invariant: InvariantId,
    /// The upstream issue (`etcd-io/etcd#15220`).
    pub defect: String,
    /// Identifies the occurrence across observations (the same one is seen again at every
    /// later check): report it once.
    pub key: String,
    /// What was seen, where, on which release, and what the defect is (`seen`: `about`).
    pub message: String,
    /// What was seen, where, on which release.
    pub seen: String,
    /// What the defect is, and where it is fixed.
    pub about: String,
}

/// The known defects `obs` shows for the invariants `ids` (see [`KnownDefect`]).
pub fn known_defects(ids: &[InvariantId], obs: &Observation) -> Vec<KnownDefect> {
    // Only `watch` knows of one so far.
    if ids.contains(&InvariantId::Watch) {
        watch::watch(obs).1
    } else {
        Vec::new()
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
    /// The observation holds nothing for this invariant (the message names what is missing):
    /// never a pass. A target that claims to check the invariant and did not observe it has a
    /// bug; the engine ends the run as shakedown's internal error.
    Unobserved(String),
}

impl Verdict {
    pub fn is_pass(&self) -> bool {
        matches!(self, Verdict::Pass)
    }
    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Pass => None,
            Verdict::Fail(m) | Verdict::Definite(m) | Verdict::Unobserved(m) => Some(m),
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

/// At bring-up and after healing every member of the model must serve, beyond what `quorum`
/// asks of a step (the engine asks this at step 0 and at the liveness check, attributed to
/// `quorum`).
pub fn all_serving(model: &Model, obs: &Observation) -> Verdict {
    let down = unreachable_members(model, obs);
    if down.is_empty() {
        return Verdict::Pass;
    }
    let names: Vec<String> = down.iter().map(|m| m.to_string()).collect();
    Verdict::Fail(format!("member(s) {} not serving after healing", names.join(", ")))
}

/// Members of the model the observation says are not serving: for progress lines and forensics.
pub fn unreachable_members(model: &Model, obs: &Observation) -> Vec<MemberId> {
    model.members.keys().filter(|id| !obs.members.iter().any(|m| m.member == Some(**id) && m.reachable)).copied().collect()
}
