//! Planted bugs: documented ways to make one of the local target's own operations wrong, to
//! show that the invariants catch a real class of provider bug.


use shakedown_faults::{Op, OutageMode};
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
    }
}

impl PlantedBug {
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
        }
    }
}

