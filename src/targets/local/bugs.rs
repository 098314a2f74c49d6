//! Planted bugs: documented ways to make one of the local target's own operations wrong, to
//! show that the invariants catch a real class of provider bug.

use std::fmt;
use std::str::FromStr;

use shakedown_faults::{Op, OutageMode};
use shakedown_invariants::InvariantId;

/// A documented way to make one of the local target's own operations wrong, to show that the
/// invariants catch a real class of provider bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlantedBug {
    /// The rolling upgrade does not wait for the upgraded member to be healthy before taking the
    /// next one down. Caught by `quorum`.
    UpgradeNoWait,
    /// The rolling replace forgets to remove the old member from the etcd cluster. Caught by
    /// `membership`.
    ReplaceKeepsOldMember,
    /// The endpoint (HAProxy) has no health checks, so it keeps routing to a member that cannot
    /// answer. Caught by `reachability`.
    EndpointNoHealthCheck,
    /// The write path acknowledges a write before etcd does (write-behind: acknowledged when
    /// queued, sent 100 ms later). Caught by `durability` at the first check.
    AckBeforeWrite,
    /// Site recovery removes the inbound partition rule but leaves the outbound one. Caught by
    /// `leaks`.
    RecoverLeavesRule,
    /// Disk reattach restarts the member on the disk that is still shut down (no remount), and
    /// does not replace it when it fails. Caught by `members`.
    ReattachOnShutdownDisk,
    /// Restore brings back only some members: the last keeps its old data and old cluster, so
    /// the new cluster never hears from it. Caught by `membership`.
    RestorePartial,
}

impl PlantedBug {
    pub const ALL: [PlantedBug; 7] = [
        PlantedBug::UpgradeNoWait,
        PlantedBug::ReplaceKeepsOldMember,
        PlantedBug::EndpointNoHealthCheck,
        PlantedBug::AckBeforeWrite,
        PlantedBug::RecoverLeavesRule,
        PlantedBug::ReattachOnShutdownDisk,
        PlantedBug::RestorePartial,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PlantedBug::UpgradeNoWait => "upgrade-no-wait",
            PlantedBug::ReplaceKeepsOldMember => "replace-keeps-old-member",
            PlantedBug::EndpointNoHealthCheck => "endpoint-no-health-check",
            PlantedBug::AckBeforeWrite => "ack-before-write",
            PlantedBug::RecoverLeavesRule => "recover-leaves-rule",
            PlantedBug::ReattachOnShutdownDisk => "reattach-on-shutdown-disk",
            PlantedBug::RestorePartial => "restore-partial",
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

impl fmt::Display for PlantedBug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PlantedBug {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        shakedown_faults::parse_name(s, &PlantedBug::ALL, PlantedBug::name, "planted bug")
    }
}
