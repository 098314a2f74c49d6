//! Planted bugs: documented ways to make one of the local target's own operations wrong, to
//! show that the invariants catch a real class of provider bug.

use shakedown_faults::{Op, OutageMode, Stack};
use shakedown_invariants::InvariantId;

shakedown_faults::registry! {
    /// A documented way to make one of the local target's own operations wrong, to show that the
    /// invariants catch a real class of provider bug.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "kebab-case")]
    pub enum PlantedBug: "planted bug" {
        /// The rolling upgrade does not wait for the upgraded member to be healthy before taking the
        /// next one down. Caught by `quorum`.
        UpgradeNoWait => "upgrade-no-wait",
        /// The rolling replace forgets to remove the old member from the etcd cluster. Caught by
        /// `membership`.
        ReplaceKeepsOldMember => "replace-keeps-old-member",
        /// The endpoint (HAProxy) has no health checks, so it keeps routing to a member that cannot
        /// answer. Caught by `reachability`.
        EndpointNoHealthCheck => "endpoint-no-health-check",
        /// The write path acknowledges a write before etcd does (write-behind: acknowledged when
        /// queued, sent 100 ms later). Caught by `durability` at the first check.
        AckBeforeWrite => "ack-before-write",
        /// Site recovery removes the inbound partition rule but leaves the outbound one. Caught by
        /// `leaks`.
        RecoverLeavesRule => "recover-leaves-rule",
        /// Disk reattach restarts the member on the disk that is still shut down (no remount), and
        /// does not replace it when it fails. Caught by `members`.
        ReattachOnShutdownDisk => "reattach-on-shutdown-disk",
        /// Restore brings back only some members: the last keeps its old data and old cluster, so
        /// the new cluster never hears from it. Caught by `membership`.
        RestorePartial => "restore-partial",
        /// The workload's write path counts a transaction whose `ModRevision` compare failed as a
        /// successful write (it does not look at `succeeded`). Needs concurrent clients writing
        /// the same keys. Caught by `durability`, or first by `watch` (the false acknowledgement
        /// names a revision at which the watches deliver another write) or `linearizability`
        /// (no order makes the compare hold).
        TxnIgnoresConflict => "txn-ignores-conflict",
        /// The object clients send their paginated lists to a member of their own (as
        /// kube-apiserver talks to its local etcd) as serializable reads, which that member
        /// answers from its own store, and take them for linearizable: a follower that has not
        /// applied a write acknowledged before the list was sent answers without it. Needs only
        /// the workload's load (followers apply after the leader acknowledges). Caught by
        /// `linearizability` (a stale read) alone.
        SerializableReads => "serializable-reads",
        /// A broken watch resumes from the current revision instead of its last revision + 1
        /// (an informer that skips what happened while its stream was down). Needs a fault that
        /// breaks the stream of a watch (its member crashes, pauses, is cut off or restarted)
        /// while writes go on. Caught by `watch`.
        WatchResumeFromNow => "watch-resume-from-now",
        /// The lease client puts its keys without attaching the lease (Events written without a
        /// TTL). Caught by `leases`.
        LeaseKeysUnattached => "lease-keys-unattached",
        /// Restore brings the last member back from the backup before the one asked for (a tool
        /// that restores "each member's latest local backup"): the members share a raft log but
        /// not a store. Needs two backups with writes between them and a restore of the later.
        /// Caught by `consistency`.
        RestoreMixedBackups => "restore-mixed-backups",
        /// Restore does not restart the clients' watches (kubeadm's restore procedure restarts
        /// the apiservers for this): they resume from their last revision + 1 on a store whose
        /// revisions went back to the backup's, and silently skip the writes that reuse
        /// revisions they saw before. Needs a backup, writes after it, and a restore. Caught by
        /// `watch`.
        RestoreKeepsWatches => "restore-keeps-watches",
        /// The API load balancer (HAProxy in front of the control-plane stack's apiservers) has
        /// no health checks, so it keeps a paused machine's apiserver in rotation. Needs
        /// `stack = "control-plane"`. Caught by `api-reachability`.
        ApiLbNoHealthCheck => "api-lb-no-health-check",
        /// Restore stops and restarts the etcd members but not the apiservers (kubeadm's restore
        /// procedure stops them first and starts them after): they go on serving from their watch
        /// caches, and their clients' watches are never broken, across a store whose revisions
        /// went back to the backup's. Needs `stack = "control-plane"`, a backup, writes after it,
        /// and a restore. Caught by `api-watch`.
        RestoreKeepsApiservers => "restore-keeps-apiservers",
    }
}

impl PlantedBug {
    /// Another invariant that sees the same fault, sometimes in an earlier check than
    /// [`PlantedBug::caught_by`]'s: a falsely acknowledged transaction carries the revision of the
    /// write that won, which `watch` compares with what its sessions delivered there, while
    /// `durability` sees it only if no later acknowledged write to the key hides it.
    pub fn also_caught_by(self) -> &'static [InvariantId] {
        match self {
            PlantedBug::TxnIgnoresConflict => &[InvariantId::Watch, InvariantId::Linearizability],
            // A member restored from the other backup serves reads too: the writes acknowledged
            // between the two backups are gone from what it answers, which durability (and the
            // request history) see in the same check; when that member's status is slow to
            // answer, consistency cannot compare it yet and they head the check alone (CI,
            // 2026-12-06: "9 of 52 acknowledged writes lost", restore(b1) with b0 mixed in).
            PlantedBug::RestoreMixedBackups => &[InvariantId::Durability, InvariantId::Linearizability],
            _ => &[],
        }
    }

    /// The invariant meant to catch it.
    pub fn caught_by(self) -> InvariantId {
        match self {
            PlantedBug::UpgradeNoWait => InvariantId::Quorum,
            PlantedBug::ReplaceKeepsOldMember => InvariantId::Membership,
            PlantedBug::EndpointNoHealthCheck => InvariantId::Reachability,
            PlantedBug::AckBeforeWrite => InvariantId::Durability,
            PlantedBug::RecoverLeavesRule => InvariantId::Leaks,
            PlantedBug::ReattachOnShutdownDisk => InvariantId::Members,
            PlantedBug::RestorePartial => InvariantId::Membership,
            PlantedBug::TxnIgnoresConflict => InvariantId::Durability,
            PlantedBug::SerializableReads => InvariantId::Linearizability,
            PlantedBug::WatchResumeFromNow => InvariantId::Watch,
            PlantedBug::LeaseKeysUnattached => InvariantId::Leases,
            PlantedBug::RestoreMixedBackups => InvariantId::Consistency,
            PlantedBug::RestoreKeepsWatches => InvariantId::Watch,
            PlantedBug::ApiLbNoHealthCheck => InvariantId::ApiReachability,
            PlantedBug::RestoreKeepsApiservers => InvariantId::ApiWatch,
        }
    }

    /// Whether executing `op` exposes the bug (what a plan must contain to show it).
    pub fn triggered_by(self, op: &Op) -> bool {
        match self {
            PlantedBug::UpgradeNoWait => matches!(op, Op::RollingUpgrade { .. }),
            PlantedBug::ReplaceKeepsOldMember => matches!(op, Op::RollingReplace),
            PlantedBug::EndpointNoHealthCheck => matches!(op, Op::Pause { .. }),
            PlantedBug::AckBeforeWrite => true,
            // Recovery from an isolation (the plan generator only recovers sites that are out).
            PlantedBug::RecoverLeavesRule => matches!(op, Op::SiteOutage { mode: OutageMode::Isolate, .. }),
            PlantedBug::ReattachOnShutdownDisk => matches!(op, Op::DiskReattach { .. }),
            PlantedBug::RestorePartial => matches!(op, Op::Restore { .. }),
            // The workload's own traffic (conflicts, leases) shows them.
            PlantedBug::TxnIgnoresConflict | PlantedBug::LeaseKeysUnattached | PlantedBug::SerializableReads => true,
            // Ops that break the watch stream of a member's own watcher at once (its process
            // dies) while the others keep taking writes. A pause or an isolation breaks it too,
            // after the watcher's silence bound.
            PlantedBug::WatchResumeFromNow => matches!(
                op,
                Op::Crash { .. } | Op::RollingUpgrade { .. } | Op::RollingReplace | Op::SiteOutage { mode: OutageMode::PowerLoss, .. }
            ),
            // A restore of any backup but the first (an earlier one exists).
            PlantedBug::RestoreMixedBackups => matches!(op, Op::Restore { backup } if backup.0 > 0),
            PlantedBug::RestoreKeepsWatches => matches!(op, Op::Restore { .. }),
            PlantedBug::ApiLbNoHealthCheck => matches!(op, Op::Pause { .. }),
            PlantedBug::RestoreKeepsApiservers => matches!(op, Op::Restore { .. }),
        }
    }

    /// The stack shape the bug lives in.
    pub fn stack(self) -> Stack {
        match self {
            PlantedBug::ApiLbNoHealthCheck | PlantedBug::RestoreKeepsApiservers => Stack::ControlPlane,
            _ => Stack::Etcd,
        }
    }
}
