//! The op catalogue: each op has a precondition on the model ([`Model::check`]) and an
//! expected effect ([`Model::apply`]). Execution lives in the targets.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::failpoint::{Failpoint, FailpointAction, Trigger};
use crate::model::{BackupId, DiskState, MemberId, MemberState, Model, OutageMode, SiteId, Version};

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
    /// A whole site goes: cut off from everything (`isolate`) or every process killed
    /// (`power-loss`).
    SiteOutage { site: SiteId, mode: OutageMode },
    /// The site comes back: rules removed, or its members started again.
    SiteRecover { site: SiteId },
    /// The member's filesystem is shut down under it (every read and write fails with EIO), as
    /// when a cloud disk is detached from a running VM. What the member fsync'd before stays on
    /// the disk, as on a real detach: the local target freezes the filesystem before shutting it
    /// down (FS_IOC_SHUTDOWN, FS_GOING_FLAGS_DEFAULT), because the flavours without the freeze
    /// can drop acknowledged WAL blocks — an artifact of the fault (docs/findings.md, finding 2).
    DiskDetach { member: MemberId },
    /// What a kubelet and a CSI attacher do: the process is stopped if it still runs, the disk
    /// unmounted, checked and mounted again, and the member restarted on its own data, waited for
    /// until healthy and caught up. Only if the data is unusable (the remount fails, or etcd
    /// exits on it) is the member's data replaced as in [`Op::DiskReplace`] (a target note says so).
    DiskReattach { member: MemberId },
    /// A snapshot through etcd's maintenance API into the backup store, integrity verified.
    Backup,
    /// Stop the cluster, restore the backup into fresh data directories on every member as a
    /// new cluster (new member and cluster IDs), start, wait for health.
    Restore { backup: BackupId },
    /// The operator's recovery after a lost disk: the member's data is thrown away (a fresh,
    /// empty disk), the member removed from the cluster and added back empty as a learner,
    /// promoted once in sync, and waited for until caught up. A new etcd member id.
    DiskReplace { member: MemberId },
    /// Application target: the replica's pod deleted with grace period 0; its controller makes a
    /// new one (verified: a pod of that name with a new UID).
    PodKill { member: MemberId },
    /// Application target: the operator's Deployment scaled to zero (verified: its pods gone)
    /// and back to its replicas (verified: a new pod available).
    OperatorRestart,
    /// Application target: the replica's PersistentVolumeClaim and pod deleted; the StatefulSet
    /// makes a new, empty claim (verified: a claim of that name with a new UID, bound) and the
    /// operator must rebuild the replica on it.
    PvcLoss { member: MemberId },
    /// Application target: a NetworkPolicy cuts the replica's pod off (all ingress and egress),
    /// verified with the profile's connectivity probe from another replica; a network that does
    /// not enforce it makes the op fail as an environment error.
    Partition { member: MemberId },
    /// Application target: the partition's NetworkPolicy removed (verified: the probe connects).
    PartitionHeal { member: MemberId },
    /// Application target: the app profile's `[pod_kill_selected]` — `count` (or `percent`,
    /// rounded up) of the pods its label selector matches, deleted together with grace period 0.
    /// Which ones is the plan's: sorted by name, the run starts at `pick` modulo their number
    /// (so a replay kills the same pods of a StatefulSet). Verified: every killed pod gone or
    /// replaced (a new UID), and as many matching pods Ready as before.
    PodKillSelected { pick: u32 },
    /// Application target: node maintenance — the node that runs the replica's pod cordoned,
    /// every pod on it evicted through the eviction API (PodDisruptionBudgets respected: a
    /// refused eviction is retried until the op's bound, then the op fails naming it), verified
    /// drained, then uncordoned (verified schedulable). The node must have opted in
    /// (`shakedown.dev/allow-chaos: "true"`): a drain acts on every pod of the node.
    NodeDrain { member: MemberId },
    /// Application target: the replica's pod fails in place, as Chaos Mesh's `pod-failure` does
    /// it — every container's image replaced by the app profile's `[pod_failure]` image (one
    /// that does not run the application, the cluster's pause image say) for its `duration`,
    /// then put back. The pod keeps its name and UID: the operator sees a replica that is there
    /// but not Ready, not one that is gone. Verified: the same pod not Ready, then Ready again on
    /// its own images.
    PodFailure { member: MemberId },
    /// Application target: the app profile's `[[partition.groups]]` cut two label groups apart
    /// (the cut: `pick` modulo their number, so a replay cuts the same groups) — a NetworkPolicy
    /// on each side admitting every peer but the other side, so that traffic between them stops
    /// and other traffic flows on. Verified with the `[partition]` probe both ways between the
    /// groups (cut), and from a group to a replica outside both (still flowing, when there is one).
    PartitionGroups { pick: u32 },
    /// Application target: the group partition's NetworkPolicies removed (verified: the probe
    /// connects both ways between the groups again).
    PartitionGroupsHeal { pick: u32 },
    /// Defragment the member's backend through etcd's maintenance API, as an operator's
    /// etcd-defrag job does: etcd rewrites its bolt database into a new file and swaps it in,
    /// holding every read and write of that member meanwhile. Verified: etcd answers the call,
    /// and the member answers and is caught up after it (the database sizes before and after
    /// go into a `defrag` note in the event log).
    Defrag { member: MemberId },
    /// The member's peer traffic is cut (raft only: its clients still reach it, as in a split
    /// between the members' network and the clients'), and held while the others write until
    /// each has compacted its raft log past the member (after a snapshot every
    /// `[etcd] snapshot_count` entries, etcd keeps 5,000 behind it), so the leader's log no
    /// longer reaches back to it; then the cut is lifted.
    /// Verified: the member catches up through a snapshot the leader sends (its log says it
    /// received one) and is caught up.
    PartitionUntilSnapshot { member: MemberId },
    /// On a failpoint build of etcd (`[etcd] failpoints = true`): one of etcd's own failpoints
    /// armed on the member through gofail's endpoint, to `panic` or `sleep` once, and etcd driven
    /// there ([`Failpoint::trigger`]: writes through the member, leadership moved to or off it,
    /// a defrag, or a cut until the leader sends it a snapshot). Verified: a panic — the member's
    /// process exited at that failpoint (its log says so), after which it is down like a crashed
    /// member until a `restart` (or the heal) starts it again; a sleep — the op's own request to
    /// the member waited it out, and the member is caught up after it.
    Failpoint { member: MemberId, failpoint: Failpoint, action: FailpointAction },
    /// Application target: a planned failover to replica `member` through the operator's own
    /// interface (the app profile's `[switchover]` command, exec'd in the leader's pod; to the
    /// next replica when `member` leads already). Verified: the command succeeded and the
    /// `[leader]` selector's Ready pod is the candidate afterwards.
    Switchover { member: MemberId },
    /// Application target: a `NoExecute` taint (`shakedown.dev/taint`, the run id as its value)
    /// on the node of the replica's pod — the node must have opted in, as for a drain — held for
    /// the app profile's `[taint] duration`, then removed. Unlike a drain it asks nobody: no
    /// eviction API, no PodDisruptionBudget; every pod on the node that does not tolerate the
    /// taint is deleted by the node lifecycle controller, one that tolerates it stays (for its
    /// `tolerationSeconds`, if it names some). Verified: those pods gone, the tolerating ones
    /// still there at the removal, the taint gone after it.
    Taint { member: MemberId },
    /// Application target: a point-in-time restore through the app profile's `[restore_pitr]`
    /// command — the data restored from backup `backup` and recovered up to an instant the plan
    /// picks: `at` tenths and a half of the way from the later of the backup's end and the last
    /// restore's end to the op's start (`at` in 0..[`PITR_POINTS`]). Verified: the command
    /// succeeded; `app-durability` then expects exactly the writes acknowledged before that
    /// instant (those in flight across it may be either) and none sent after it.
    RestorePitr { backup: BackupId, at: u32 },
}

/// How many instants `restore-pitr` picks from (tenths of the way, each at its middle).
pub const PITR_POINTS: u32 = 10;

/// The share of the way (percent) a `restore-pitr` pick `at` stands for.
pub fn pitr_percent(at: u32) -> u32 {
    (at * 100 + 50) / PITR_POINTS
}

/// How many different picks `pod-kill-selected` and `partition-groups` draw from (divisible by 1–4 and 6, so that
/// every start is equally likely for groups of those sizes).
pub const SELECTED_PICKS: u32 = 12;

/// The most backups a plan keeps (each is a file in the run directory).
pub const MAX_BACKUPS: usize = 8;

crate::registry! {
    /// The family of an op: what profiles weigh and reports count. Declaration order is
    /// `ALL`'s order, which generation depends on: add new kinds at the end.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "kebab-case")]
    pub enum OpKind: "op" {
        /// SIGKILL one member (kube: pause the KubeadmControlPlane, delete the member's Machine).
        Crash => "crash",
        /// Start a crashed member again on its own data (kube: resume the KubeadmControlPlane, wait for the replacement Machine).
        Restart => "restart",
        /// SIGSTOP one member (kube: only through `[hooks.pause]`).
        Pause => "pause",
        /// SIGCONT a paused member (kube: only through `[hooks.resume]`).
        Resume => "resume",
        /// Move every member, one at a time, to a newer version of the profile (kube: KubeadmControlPlane `spec.version`).
        RollingUpgrade => "rolling-upgrade",
        /// Replace every member, one at a time, by a new one on a fresh disk (kube: KubeadmControlPlane `spec.rollout.after`).
        RollingReplace => "rolling-replace",
        /// Take a site down: `isolate` (its traffic dropped) or `power-loss` (its processes killed; kube: its Machines deleted).
        SiteOutage => "site-outage",
        /// Bring a site that is out back.
        SiteRecover => "site-recover",
        /// Make a member's disk fail every read and write (kube: delete the `[disk]` volume's VolumeAttachment).
        DiskDetach => "disk-detach",
        /// Attach a detached disk again and restart the member on its data (kube: wait for a new VolumeAttachment).
        DiskReattach => "disk-reattach",
        /// Take a snapshot (kube: a Velero Backup; app: the app profile's `[backup]` custom resource).
        Backup => "backup",
        /// Restore every member from a backup as a new cluster (kube: a Velero Restore; app: the app profile's `[restore]` custom resource).
        Restore => "restore",
        /// Replace a lost disk: the member removed and re-added empty, with a new member id (kube: only through `[hooks.disk-replace]`).
        DiskReplace => "disk-replace",
        /// Application target: delete a replica's pod with grace period 0 (verified: a new UID).
        PodKill => "pod-kill",
        /// Application target: scale the operator's Deployment to zero and back.
        OperatorRestart => "operator-restart",
        /// Application target: delete a replica's claim and pod (verified: a new, empty claim).
        PvcLoss => "pvc-loss",
        /// Application target: cut a replica's pod off with a NetworkPolicy (verified by a probe).
        Partition => "partition",
        /// Application target: remove a partition's NetworkPolicy (verified by a probe).
        PartitionHeal => "partition-heal",
        /// Application target: delete `count` or `percent` of the pods of the app profile's `[pod_kill_selected]` label selector at once, grace period 0 (verified: replaced, as many Ready as before).
        PodKillSelected => "pod-kill-selected",
        /// Application target: cordon the node of a replica's pod, evict its pods through the eviction API (PodDisruptionBudgets respected), verify it drained, uncordon it.
        NodeDrain => "node-drain",
        /// Application target: a replica's containers fail in place for the app profile's `[pod_failure]` duration (their image replaced, same pod), then recover (verified both ways).
        PodFailure => "pod-failure",
        /// Application target: cut two label groups of the app profile's `[[partition.groups]]` apart with NetworkPolicies, other traffic flowing on (verified by probes both ways, and from a replica in neither group).
        PartitionGroups => "partition-groups",
        /// Application target: remove a group partition's NetworkPolicies (verified: the probe connects both ways again).
        PartitionGroupsHeal => "partition-groups-heal",
        /// Defragment a member's backend through etcd's maintenance API (kube: only through `[hooks.defrag]`).
        Defrag => "defrag",
        /// Cut a member's peer traffic until the leader's log has moved past it, then let it back: it must catch up through a snapshot (local target: needs `[etcd] snapshot_count`; kube: only through `[hooks.partition-until-snapshot]`).
        PartitionUntilSnapshot => "partition-until-snapshot",
        /// Arm one of etcd's own failpoints (gofail) on a member to panic or sleep once, and drive etcd there (local target with `[etcd] failpoints = true`: a failpoint build of etcd 3.4.23).
        Failpoint => "failpoint",
        /// Application target: a planned failover to a replica through the app profile's `[switchover]` command (verified: the `[leader]` is the candidate afterwards).
        Switchover => "switchover",
        /// Application target: a `NoExecute` taint on the node of a replica's pod for the app profile's `[taint] duration` (verified: the pods without a toleration evicted, the taint removed after).
        Taint => "taint",
        /// Application target: a point-in-time restore of a backup to an instant the plan picks between the backup and now, through the app profile's `[restore_pitr]` command (`app-durability` expects exactly the writes acknowledged before that instant).
        RestorePitr => "restore-pitr",
    }
}

impl OpKind {
    /// The kinds only the application target runs (`stack = "app"`): a profile of another
    /// stack never draws them ([`OpKind::drawn_for`]).
    #[deny(clippy::wildcard_enum_match_arm)]
    pub fn app_only(self) -> bool {
        match self {
            OpKind::PodKill
            | OpKind::OperatorRestart
            | OpKind::PvcLoss
            | OpKind::Partition
            | OpKind::PartitionHeal
            | OpKind::PodKillSelected
            | OpKind::NodeDrain
            | OpKind::PodFailure
            | OpKind::PartitionGroups
            | OpKind::PartitionGroupsHeal
            | OpKind::Switchover
            | OpKind::Taint
            | OpKind::RestorePitr => true,
            OpKind::Crash
            | OpKind::Restart
            | OpKind::Pause
            | OpKind::Resume
            | OpKind::RollingUpgrade
            | OpKind::RollingReplace
            | OpKind::SiteOutage
            | OpKind::SiteRecover
            | OpKind::DiskDetach
            | OpKind::DiskReattach
            | OpKind::Backup
            | OpKind::Restore
            | OpKind::DiskReplace
            | OpKind::Defrag
            | OpKind::PartitionUntilSnapshot
            | OpKind::Failpoint => false,
        }
    }

    /// Whether a profile of `stack` draws this kind: on `app`, the application ops and
    /// `backup` / `restore` (through the operator's own custom resources); elsewhere, everything
    /// but the application ops.
    pub fn drawn_for(self, stack: crate::profile::Stack) -> bool {
        match stack {
            crate::profile::Stack::App => self.app_only() || matches!(self, OpKind::Backup | OpKind::Restore),
            crate::profile::Stack::Etcd | crate::profile::Stack::ControlPlane => !self.app_only(),
        }
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
            Op::SiteOutage { .. } => OpKind::SiteOutage,
            Op::SiteRecover { .. } => OpKind::SiteRecover,
            Op::DiskDetach { .. } => OpKind::DiskDetach,
            Op::DiskReattach { .. } => OpKind::DiskReattach,
            Op::Backup => OpKind::Backup,
            Op::Restore { .. } => OpKind::Restore,
            Op::DiskReplace { .. } => OpKind::DiskReplace,
            Op::PodKill { .. } => OpKind::PodKill,
            Op::OperatorRestart => OpKind::OperatorRestart,
            Op::PvcLoss { .. } => OpKind::PvcLoss,
            Op::Partition { .. } => OpKind::Partition,
            Op::PartitionHeal { .. } => OpKind::PartitionHeal,
            Op::PodKillSelected { .. } => OpKind::PodKillSelected,
            Op::NodeDrain { .. } => OpKind::NodeDrain,
            Op::PodFailure { .. } => OpKind::PodFailure,
            Op::PartitionGroups { .. } => OpKind::PartitionGroups,
            Op::PartitionGroupsHeal { .. } => OpKind::PartitionGroupsHeal,
            Op::Defrag { .. } => OpKind::Defrag,
            Op::PartitionUntilSnapshot { .. } => OpKind::PartitionUntilSnapshot,
            Op::Failpoint { .. } => OpKind::Failpoint,
            Op::Switchover { .. } => OpKind::Switchover,
            Op::Taint { .. } => OpKind::Taint,
            Op::RestorePitr { .. } => OpKind::RestorePitr,
        }
    }

    /// The member the op acts on, for ops on one member.
    pub fn member(&self) -> Option<MemberId> {
        match *self {
            Op::Crash { member }
            | Op::Restart { member }
            | Op::Pause { member }
            | Op::Resume { member }
            | Op::DiskDetach { member }
            | Op::DiskReattach { member }
            | Op::DiskReplace { member }
            | Op::PodKill { member }
            | Op::PvcLoss { member }
            | Op::Partition { member }
            | Op::PartitionHeal { member }
            | Op::PodFailure { member }
            | Op::Defrag { member }
            | Op::PartitionUntilSnapshot { member }
            | Op::Failpoint { member, .. }
            | Op::Switchover { member }
            | Op::Taint { member }
            | Op::NodeDrain { member } => Some(member),
            Op::RollingUpgrade { .. }
            | Op::RollingReplace
            | Op::SiteOutage { .. }
            | Op::SiteRecover { .. }
            | Op::Backup
            | Op::Restore { .. }
            | Op::RestorePitr { .. }
            | Op::OperatorRestart
            | Op::PodKillSelected { .. }
            | Op::PartitionGroups { .. }
            | Op::PartitionGroupsHeal { .. } => None,
        }
    }

    /// The site the op acts on, for ops on one site.
    pub fn site(&self) -> Option<SiteId> {
        match *self {
            Op::SiteOutage { site, .. } | Op::SiteRecover { site } => Some(site),
            Op::Crash { .. }
            | Op::Restart { .. }
            | Op::Pause { .. }
            | Op::Resume { .. }
            | Op::DiskDetach { .. }
            | Op::DiskReattach { .. }
            | Op::DiskReplace { .. }
            | Op::RollingUpgrade { .. }
            | Op::RollingReplace
            | Op::Backup
            | Op::Restore { .. }
            | Op::RestorePitr { .. }
            | Op::PodKill { .. }
            | Op::OperatorRestart
            | Op::PvcLoss { .. }
            | Op::Partition { .. }
            | Op::PartitionHeal { .. }
            | Op::PodKillSelected { .. }
            | Op::PodFailure { .. }
            | Op::Switchover { .. }
            | Op::Taint { .. }
            | Op::PartitionGroups { .. }
            | Op::PartitionGroupsHeal { .. }
            | Op::Defrag { .. }
            | Op::PartitionUntilSnapshot { .. }
            | Op::Failpoint { .. }
            | Op::NodeDrain { .. } => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Op::Failpoint { member, failpoint, action } = self {
            return write!(f, "failpoint({member}, {failpoint}, {action})");
        }
        if let Some(member) = self.member() {
            return write!(f, "{}({member})", self.kind());
        }
        match self {
            Op::Crash { .. }
            | Op::Restart { .. }
            | Op::Pause { .. }
            | Op::Resume { .. }
            | Op::DiskDetach { .. }
            | Op::DiskReattach { .. }
            | Op::DiskReplace { .. }
            | Op::PodKill { .. }
            | Op::PvcLoss { .. }
            | Op::Partition { .. }
            | Op::PartitionHeal { .. }
            | Op::PodFailure { .. }
            | Op::Switchover { .. }
            | Op::Taint { .. }
            | Op::Defrag { .. }
            | Op::PartitionUntilSnapshot { .. }
            | Op::Failpoint { .. } => unreachable!("ops on one member are written above"),
            Op::OperatorRestart => f.write_str("operator-restart"),
            Op::PodKillSelected { pick } => write!(f, "pod-kill-selected(pick {pick})"),
            Op::PartitionGroups { pick } => write!(f, "partition-groups(pick {pick})"),
            Op::PartitionGroupsHeal { pick } => write!(f, "partition-groups-heal(pick {pick})"),
            Op::NodeDrain { member } => write!(f, "node-drain({member})"),
            Op::RollingUpgrade { to } => write!(f, "rolling-upgrade(to {to})"),
            Op::RollingReplace => f.write_str("rolling-replace"),
            Op::SiteOutage { site, mode } => write!(f, "site-outage({site}, {mode})"),
            Op::SiteRecover { site } => write!(f, "site-recover({site})"),
            Op::Backup => f.write_str("backup"),
            Op::Restore { backup } => write!(f, "restore({backup})"),
            Op::RestorePitr { backup, at } => write!(f, "restore-pitr({backup}, at {}%)", pitr_percent(*at)),
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
    #[error("{0} is not a site of this stack")]
    NoSuchSite(SiteId),
    #[error("{site} is {}", if *.out { "already out" } else { "not out" })]
    SiteState { site: SiteId, out: bool },
    #[error("{member}'s disk is {}", if *.detached { "already detached" } else { "attached" })]
    DiskState { member: MemberId, detached: bool },
    #[error("no backup {0} has been taken")]
    NoSuchBackup(BackupId),
    #[error("no point-in-time pick {0}: the picks are 0 to 9")]
    NoSuchPitrPoint(u32),
    #[error("{0} was taken before the last restore: a point-in-time restore recovers from a backup taken since")]
    BackupBeforeRestore(BackupId),
    #[error("the service is not expected up, so nothing can be backed up")]
    ServiceDown,
    #[error("already {0} backups, the most a plan keeps")]
    TooManyBackups(usize),
    #[error("{0} is out: ops on its members wait for it to recover")]
    SiteOut(SiteId),
    #[error("{0}")]
    NeedsQuorum(&'static str),
    #[error("{0} is partitioned")]
    Partitioned(MemberId),
    #[error("{0} is not partitioned")]
    NotPartitioned(MemberId),
    #[error("a partition is in place already ({0}): one at a time")]
    PartitionInPlace(String),
    #[error("no group partition (pick {0}) is in place")]
    GroupsNotPartitioned(u32),
    #[error("failpoint {0} is not one this stack can reach (a profile with [etcd] failpoints = true; the snapshot ones also need [etcd] snapshot_count)")]
    NoSuchFailpoint(Failpoint),
    #[error("failpoint {0} is reached only on a snapshot path: a sleep there cannot be verified, only a panic")]
    CannotSleep(Failpoint),
    #[error("failpoint {failpoint} is not in etcd {version}'s source (it came with {since})")]
    FailpointNotIn { failpoint: Failpoint, version: Version, since: Version },
}

impl Model {
    /// The precondition of `op` in this state.
    pub fn check(&self, op: &Op) -> Result<(), PreconditionError> {
        let state_is = |member: MemberId, ok: &[MemberState], needed: &'static str| {
            let m = self.member(member)?;
            if self.outages.contains_key(&m.site) {
                return Err(PreconditionError::SiteOut(m.site));
            }
            if m.disk == DiskState::Detached {
                return Err(PreconditionError::DiskState { member, detached: true });
            }
            if ok.contains(&m.state) {
                Ok(())
            } else {
                Err(PreconditionError::WrongState { member, actual: m.state, needed })
            }
        };
        // Taking `n` more members down (rolling ops: one at a time) must stay within max_down.
        let more_down = |n: usize| {
            let down = self.down() + n;
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
                    more_down(1)?;
                }
                Ok(())
            }
            Op::Pause { member } => {
                state_is(member, &[MemberState::Running], "running")?;
                more_down(1)
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
                self.all_up()?;
                more_down(1)
            }
            Op::RollingReplace => {
                self.all_up()?;
                more_down(1)
            }
            Op::SiteOutage { site, .. } => {
                if site.0 >= self.sites {
                    return Err(PreconditionError::NoSuchSite(site));
                }
                if self.outages.contains_key(&site) {
                    return Err(PreconditionError::SiteState { site, out: true });
                }
                // Every member of the site must be up (a fault on top of a fault is not a site outage).
                if let Some(m) = self.site_members(site).find(|m| !self.is_up(m)) {
                    return Err(PreconditionError::WrongState {
                        member: m.id,
                        actual: m.state,
                        needed: "up (a site outage takes up members down)",
                    });
                }
                more_down(self.site_members(site).count())
            }
            Op::SiteRecover { site } => match self.outages.contains_key(&site) {
                true => Ok(()),
                false => Err(PreconditionError::SiteState { site, out: false }),
            },
            Op::DiskDetach { member } => {
                state_is(member, &[MemberState::Running], "running")?;
                // A majority of lost disks is a disaster recovery (restore), not a reattach.
                let detached = self.members.values().filter(|m| m.disk == DiskState::Detached).count() + 1;
                if self.size() - detached < self.quorum() {
                    return Err(PreconditionError::NeedsQuorum(
                        "a majority of members would have lost their disk: only a restore brings that back",
                    ));
                }
                more_down(1)
            }
            Op::DiskReattach { member } | Op::DiskReplace { member } => {
                let m = self.member(member)?;
                if self.outages.contains_key(&m.site) {
                    return Err(PreconditionError::SiteOut(m.site));
                }
                if m.disk == DiskState::Attached {
                    return Err(PreconditionError::DiskState { member, detached: false });
                }
                // A reattached member catches up from a leader among the others; a replaced one
                // (and a reattached one whose data is unusable) is removed and added again, a
                // reconfiguration. Both need the others to have quorum.
                if !self.quorum_expected() {
                    return Err(PreconditionError::NeedsQuorum(
                        "bringing a member back on its disk needs quorum among the others (to catch up from, or to re-add it)",
                    ));
                }
                Ok(())
            }
            Op::Backup => {
                if !self.service_expected_up() {
                    return Err(PreconditionError::ServiceDown);
                }
                if self.backups.len() >= MAX_BACKUPS {
                    return Err(PreconditionError::TooManyBackups(self.backups.len()));
                }
                Ok(())
            }
            Op::Restore { backup } => {
                if !self.backups.contains(&backup) {
                    return Err(PreconditionError::NoSuchBackup(backup));
                }
                self.all_up()
            }
            // Recovered to an instant after the backup and after the last restore: the WAL from
            // the backup on must lead there on one line of history.
            Op::RestorePitr { backup, at } => {
                if !self.backups.contains(&backup) {
                    return Err(PreconditionError::NoSuchBackup(backup));
                }
                if at >= PITR_POINTS {
                    return Err(PreconditionError::NoSuchPitrPoint(at));
                }
                if self.backups_after_restore.is_some_and(|first| backup.0 < first) {
                    return Err(PreconditionError::BackupBeforeRestore(backup));
                }
                self.all_up()?;
                self.no_partition()
            }
            // The application ops take a replica away for a moment; its controller (and for a
            // lost claim, the operator) brings it back, and the checks wait for that. One fault
            // at a time on a partitioned replica: only its heal.
            Op::PodKill { member } | Op::PvcLoss { member } | Op::PodFailure { member } => {
                state_is(member, &[MemberState::Running], "running")?;
                self.no_partition()
            }
            Op::OperatorRestart => Ok(()),
            // Several replicas at once (a switchover: the leader and its candidate): every one up
            // before, no partition in place.
            Op::PodKillSelected { .. } | Op::NodeDrain { .. } | Op::Switchover { .. } | Op::Taint { .. } => {
                self.all_up()?;
                self.no_partition()
            }
            Op::Partition { member } => {
                state_is(member, &[MemberState::Running], "running")?;
                self.no_partition()
            }
            Op::PartitionHeal { member } => match self.partitioned.contains(&member) {
                true => Ok(()),
                false => Err(PreconditionError::NotPartitioned(member)),
            },
            // Groups of replicas on either side: every one up before, no other partition.
            Op::PartitionGroups { .. } => {
                self.all_up()?;
                self.no_partition()
            }
            Op::PartitionGroupsHeal { pick } => match self.groups_partitioned == Some(pick) {
                true => Ok(()),
                false => Err(PreconditionError::GroupsNotPartitioned(pick)),
            },
            // Only a member that answers can be asked; it stays a member throughout (a defrag
            // holds its requests, it does not take it down).
            Op::Defrag { member } => state_is(member, &[MemberState::Running], "running"),
            // The member is cut off for the op's length: one member down, as a pause; and the
            // others must commit without it, or the leader's log never moves past it.
            Op::PartitionUntilSnapshot { member } => {
                state_is(member, &[MemberState::Running], "running")?;
                more_down(1)?;
                if self.up() - 1 < self.quorum() {
                    return Err(PreconditionError::NeedsQuorum(
                        "the others must keep quorum while the member is cut off: only they can move the leader's log past it",
                    ));
                }
                Ok(())
            }
            // The member stalls (sleep) or dies (panic) at the failpoint: one member down while
            // it runs, and the others must commit the writes that drive etcd there.
            Op::Failpoint { member, failpoint, action } => {
                if !self.failpoints.contains(&failpoint) {
                    return Err(PreconditionError::NoSuchFailpoint(failpoint));
                }
                if matches!(action, FailpointAction::Sleep { .. }) && !failpoint.can_sleep() {
                    return Err(PreconditionError::CannotSleep(failpoint));
                }
                state_is(member, &[MemberState::Running], "running")?;
                let version = self.member(member)?.version;
                if version < failpoint.since() {
                    return Err(PreconditionError::FailpointNotIn { failpoint, version, since: failpoint.since() });
                }
                more_down(1)?;
                if self.up() - 1 < self.quorum() {
                    return Err(PreconditionError::NeedsQuorum(
                        "the others must keep quorum while the member stalls or dies at the failpoint: they commit the writes that drive etcd there",
                    ));
                }
                if failpoint.trigger() == Trigger::Following && self.up() < 2 {
                    return Err(PreconditionError::NeedsQuorum("a follower needs a leader among the others"));
                }
                Ok(())
            }
        }
    }

    /// One partition at a time, of a replica or between groups.
    fn no_partition(&self) -> Result<(), PreconditionError> {
        if let Some(&m) = self.partitioned.iter().next() {
            return Err(PreconditionError::PartitionInPlace(format!("partition({m})")));
        }
        match self.groups_partitioned {
            Some(pick) => Err(PreconditionError::PartitionInPlace(format!("partition-groups(pick {pick})"))),
            None => Ok(()),
        }
    }

    fn all_up(&self) -> Result<(), PreconditionError> {
        if let Some(&site) = self.outages.keys().next() {
            return Err(PreconditionError::SiteOut(site));
        }
        match self.members.values().find(|m| !self.is_up(m)) {
            Some(m) if m.disk == DiskState::Detached => Err(PreconditionError::DiskState { member: m.id, detached: true }),
            Some(m) => {
                Err(PreconditionError::WrongState { member: m.id, actual: m.state, needed: "running (this op needs every member up)" })
            }
            None => Ok(()),
        }
    }

    /// Every op whose precondition holds now, grouped by kind in [`OpKind::ALL`] order.
    pub fn candidates(&self, kind: OpKind) -> Vec<Op> {
        let per_member =
            |make: fn(MemberId) -> Op| -> Vec<Op> { self.members.keys().map(|&m| make(m)).filter(|op| self.check(op).is_ok()).collect() };
        match kind {
            OpKind::Crash => per_member(|member| Op::Crash { member }),
            OpKind::Restart => per_member(|member| Op::Restart { member }),
            OpKind::Pause => per_member(|member| Op::Pause { member }),
            OpKind::Resume => per_member(|member| Op::Resume { member }),
            OpKind::RollingUpgrade => {
                self.versions.iter().map(|&to| Op::RollingUpgrade { to }).filter(|op| self.check(op).is_ok()).collect()
            }
            OpKind::RollingReplace => vec![Op::RollingReplace].into_iter().filter(|op| self.check(op).is_ok()).collect(),
            OpKind::SiteOutage => (0..self.sites)
                .flat_map(|s| [OutageMode::Isolate, OutageMode::PowerLoss].map(|mode| Op::SiteOutage { site: SiteId(s), mode }))
                .filter(|op| self.check(op).is_ok())
                .collect(),
            OpKind::SiteRecover => self.outages.keys().map(|&site| Op::SiteRecover { site }).collect(),
            OpKind::DiskDetach => per_member(|member| Op::DiskDetach { member }),
            OpKind::DiskReattach => per_member(|member| Op::DiskReattach { member }),
            OpKind::Backup => vec![Op::Backup].into_iter().filter(|op| self.check(op).is_ok()).collect(),
            OpKind::Restore => self.backups.iter().map(|&backup| Op::Restore { backup }).filter(|op| self.check(op).is_ok()).collect(),
            OpKind::RestorePitr => self
                .backups
                .iter()
                .flat_map(|&backup| (0..PITR_POINTS).map(move |at| Op::RestorePitr { backup, at }))
                .filter(|op| self.check(op).is_ok())
                .collect(),
            OpKind::DiskReplace => per_member(|member| Op::DiskReplace { member }),
            OpKind::PodKill => per_member(|member| Op::PodKill { member }),
            OpKind::OperatorRestart => vec![Op::OperatorRestart],
            OpKind::PvcLoss => per_member(|member| Op::PvcLoss { member }),
            OpKind::Partition => per_member(|member| Op::Partition { member }),
            OpKind::PartitionHeal => per_member(|member| Op::PartitionHeal { member }),
            OpKind::NodeDrain => per_member(|member| Op::NodeDrain { member }),
            OpKind::PodFailure => per_member(|member| Op::PodFailure { member }),
            OpKind::Switchover => per_member(|member| Op::Switchover { member }),
            OpKind::Taint => per_member(|member| Op::Taint { member }),
            OpKind::PodKillSelected => {
                (0..SELECTED_PICKS).map(|pick| Op::PodKillSelected { pick }).filter(|op| self.check(op).is_ok()).collect()
            }
            OpKind::PartitionGroups => {
                (0..SELECTED_PICKS).map(|pick| Op::PartitionGroups { pick }).filter(|op| self.check(op).is_ok()).collect()
            }
            OpKind::PartitionGroupsHeal => self.groups_partitioned.map(|pick| Op::PartitionGroupsHeal { pick }).into_iter().collect(),
            OpKind::Defrag => per_member(|member| Op::Defrag { member }),
            OpKind::PartitionUntilSnapshot => per_member(|member| Op::PartitionUntilSnapshot { member }),
            OpKind::Failpoint => {
                let actions = std::iter::once(FailpointAction::Panic)
                    .chain(crate::failpoint::SLEEPS_MS.map(|ms| FailpointAction::Sleep { ms }))
                    .collect::<Vec<_>>();
                let mut ops = vec![];
                for &member in self.members.keys() {
                    for &failpoint in &self.failpoints {
                        ops.extend(actions.iter().map(|&action| Op::Failpoint { member, failpoint, action }));
                    }
                }
                ops.retain(|op| self.check(op).is_ok());
                ops
            }
        }
    }
}
