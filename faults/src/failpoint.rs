//! etcd's own failpoints (gofail): the points inside etcd 3.4's raft loop, peer transport and
//! backend where a failpoint build can be made to panic or sleep, and what makes etcd reach each
//! one. The `failpoint` op arms one on one member and drives etcd there.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::model::Version;

crate::registry! {
    /// A failpoint of etcd's source, by the name its `// gofail:` comment gives it: the first
    /// fourteen are in 3.4.23 and 3.5.16, the rest only in 3.5 ([`Failpoint::since`]).
    /// Declaration order is `ALL`'s order, which generation depends on: add new ones at the end.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum Failpoint: "failpoint" {
        /// Raft loop, before the entries and hard state of a Ready are written to the WAL.
        RaftBeforeSave => "raftBeforeSave",
        /// Raft loop, after the WAL write, before the entries are handed to raft's storage.
        RaftAfterSave => "raftAfterSave",
        /// Raft loop of the leader, before it sends its messages (appends, heartbeats).
        RaftBeforeLeaderSend => "raftBeforeLeaderSend",
        /// Raft loop of a follower, before it sends its messages (append answers, votes).
        RaftBeforeFollowerSend => "raftBeforeFollowerSend",
        /// A snapshot received from the leader, before it is saved.
        RaftBeforeSaveSnap => "raftBeforeSaveSnap",
        /// A snapshot received from the leader, saved, before the entries are.
        RaftAfterSaveSnap => "raftAfterSaveSnap",
        /// A snapshot received from the leader, saved and synced, before raft's storage applies it.
        RaftBeforeApplySnap => "raftBeforeApplySnap",
        /// A snapshot received from the leader, applied to raft's storage.
        RaftAfterApplySnap => "raftAfterApplySnap",
        /// A snapshot received from the leader, after the WAL files before it were released.
        RaftAfterWalRelease => "raftAfterWALRelease",
        /// The member's own snapshot (every `snapshot_count` entries), its file written, before
        /// the WAL records it (the name's typo is etcd's).
        RaftBeforeWalSaveSnapshot => "raftBeforeWALSaveSnaphot",
        /// Backend, before a batch transaction is committed to bolt (every 100 ms under writes).
        BeforeCommit => "beforeCommit",
        /// Backend, after a batch transaction was committed to bolt.
        AfterCommit => "afterCommit",
        /// Defragmentation, before the database is copied into the new file.
        DefragBeforeCopy => "defragBeforeCopy",
        /// Defragmentation, the copy made, before the new file replaces the old.
        DefragBeforeRename => "defragBeforeRename",
        /// 3.5: the WAL written, before it is fsync'd.
        WalBeforeSync => "walBeforeSync",
        /// 3.5: the WAL fsync'd, before the raft loop goes on.
        WalAfterSync => "walAfterSync",
        /// 3.5: the apply loop, before a committed entry is applied to the store.
        BeforeApplyOneEntryNormal => "beforeApplyOneEntryNormal",
        /// 3.5: a write transaction's buffer, before it is written back into the read buffer
        /// (readers held meanwhile).
        BeforeWritebackBuf => "beforeWritebackBuf",
        /// 3.5: a compaction's last batch deleted, before the finished compaction is recorded
        /// (the backend's write lock held).
        CompactBeforeSetFinishedCompact => "compactBeforeSetFinishedCompact",
    }
}

/// What makes etcd reach a failpoint, which the op then drives on the member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// Writes through the member (any member applies and persists every write).
    Writes,
    /// Writes while the member leads (leadership is moved to it first).
    Leading,
    /// Writes while the member follows (leadership is moved off it first).
    Following,
    /// Writes until the member takes its own snapshot (`[etcd] snapshot_count` entries).
    OwnSnapshot,
    /// The member cut off until the leader must send it a snapshot (as `partition-until-snapshot`).
    IncomingSnapshot,
    /// A defragmentation of the member.
    Defrag,
    /// A compaction (asked through the member, run by every member in the background).
    Compaction,
}

impl Failpoint {
    /// The name a build's gofail registered it under, among the `registered` ones its endpoint
    /// lists: `etcdserver/raftBeforeSave` (etcd 3.4's gofail prefixes the package) or
    /// `raftBeforeSave` (3.5's does not).
    pub fn registered_in(self, registered: &[String]) -> Option<&str> {
        let name = self.name();
        registered.iter().map(String::as_str).find(|r| *r == name || r.rsplit_once('/').is_some_and(|(_, n)| n == name))
    }

    /// What reaches it.
    pub fn trigger(self) -> Trigger {
        match self {
            Failpoint::RaftBeforeSave
            | Failpoint::RaftAfterSave
            | Failpoint::BeforeCommit
            | Failpoint::AfterCommit
            | Failpoint::WalBeforeSync
            | Failpoint::WalAfterSync
            | Failpoint::BeforeApplyOneEntryNormal
            | Failpoint::BeforeWritebackBuf => Trigger::Writes,
            Failpoint::RaftBeforeLeaderSend => Trigger::Leading,
            Failpoint::RaftBeforeFollowerSend => Trigger::Following,
            Failpoint::RaftBeforeSaveSnap
            | Failpoint::RaftAfterSaveSnap
            | Failpoint::RaftBeforeApplySnap
            | Failpoint::RaftAfterApplySnap
            | Failpoint::RaftAfterWalRelease => Trigger::IncomingSnapshot,
            Failpoint::RaftBeforeWalSaveSnapshot => Trigger::OwnSnapshot,
            Failpoint::DefragBeforeCopy | Failpoint::DefragBeforeRename => Trigger::Defrag,
            Failpoint::CompactBeforeSetFinishedCompact => Trigger::Compaction,
        }
    }

    /// The first etcd release whose source has it.
    pub fn since(self) -> Version {
        match self {
            Failpoint::WalBeforeSync
            | Failpoint::WalAfterSync
            | Failpoint::BeforeApplyOneEntryNormal
            | Failpoint::BeforeWritebackBuf
            | Failpoint::CompactBeforeSetFinishedCompact => Version::new(3, 5),
            _ => Version::new(3, 4),
        }
    }

    /// Whether reaching it needs snapshots within a run's reach (`[etcd] snapshot_count`).
    pub fn needs_snapshots(self) -> bool {
        matches!(self.trigger(), Trigger::OwnSnapshot | Trigger::IncomingSnapshot)
    }

    /// Whether a sleep there can be verified: the op's own request to the member must wait it
    /// out (the raft loop or the backend's lock is held). On the snapshot paths nothing the op
    /// sends waits for it, so only a panic is drawn there.
    pub fn can_sleep(self) -> bool {
        !self.needs_snapshots()
    }
}

/// What an armed failpoint does when etcd reaches it, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailpointAction {
    /// The process panics there (gofail's `panic`): a crash at exactly that point.
    Panic,
    /// The goroutine sleeps there, once (gofail's `1*sleep(ms)`): the member stalls.
    Sleep { ms: u32 },
}

/// The sleeps a plan draws: one shorter than etcd's default election timeout, one longer (a
/// stalled leader loses its leadership).
pub const SLEEPS_MS: [u32; 2] = [500, 2_000];

impl FailpointAction {
    /// gofail's terms for it at the failpoint registered as `registered`, as PUT to its
    /// endpoint. A panic carries that name as its value, so the process's panic message names
    /// it (`failpoint panic: etcdserver/raftBeforeSave`; a plain `panic` says
    /// `failpoint panic: {}` on 3.4).
    pub fn terms(self, registered: &str) -> String {
        match self {
            FailpointAction::Panic => format!("panic(\"{registered}\")"),
            FailpointAction::Sleep { ms } => format!("1*sleep({ms})"),
        }
    }
}

impl fmt::Display for FailpointAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailpointAction::Panic => f.write_str("panic"),
            FailpointAction::Sleep { ms } => write!(f, "sleep {ms}ms"),
        }
    }
}

impl FromStr for FailpointAction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "panic" {
            return Ok(FailpointAction::Panic);
        }
        let ms = s.strip_prefix("sleep ").and_then(|d| d.strip_suffix("ms")).and_then(|n| n.parse::<u32>().ok());
        match ms {
            Some(ms) if ms > 0 => Ok(FailpointAction::Sleep { ms }),
            _ => Err(format!("failpoint action {s:?}: \"panic\" or \"sleep Nms\" (N > 0)")),
        }
    }
}

impl Serialize for FailpointAction {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for FailpointAction {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Failpoint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Failpoint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_round_trip_through_their_text_and_bad_text_is_refused() {
        for a in [FailpointAction::Panic, FailpointAction::Sleep { ms: 500 }, FailpointAction::Sleep { ms: 2_000 }] {
            assert_eq!(a.to_string().parse::<FailpointAction>(), Ok(a));
        }
        for bad in ["", "sleep", "sleep 0ms", "sleep 2s", "panic!", "1*panic"] {
            assert!(bad.parse::<FailpointAction>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(FailpointAction::Sleep { ms: 500 }.terms("beforeCommit"), "1*sleep(500)");
        assert_eq!(FailpointAction::Panic.terms("etcdserver/raftBeforeSave"), "panic(\"etcdserver/raftBeforeSave\")");
    }

    #[test]
    fn failpoints_are_found_by_name_as_either_gofail_registers_them() {
        // As scripts/build-etcd-failpoints.sh lists them from the binaries: 3.4's gofail
        // prefixes the package, 3.5's does not; a longer name ending alike is another failpoint.
        let v34: Vec<String> =
            ["backend/beforeCommit", "etcdserver/raftAfterWALRelease", "etcdserver/raftBeforeSaveWaitWalSync"].map(String::from).to_vec();
        let v35: Vec<String> = ["beforeCommit", "raftBeforeWALSaveSnaphot", "walBeforeSync"].map(String::from).to_vec();
        assert_eq!(Failpoint::BeforeCommit.registered_in(&v34), Some("backend/beforeCommit"));
        assert_eq!(Failpoint::RaftAfterWalRelease.registered_in(&v34), Some("etcdserver/raftAfterWALRelease"));
        assert_eq!(Failpoint::RaftBeforeSave.registered_in(&v34), None);
        assert_eq!(Failpoint::BeforeCommit.registered_in(&v35), Some("beforeCommit"));
        assert_eq!(Failpoint::RaftBeforeWalSaveSnapshot.registered_in(&v35), Some("raftBeforeWALSaveSnaphot"));
        assert_eq!(Failpoint::AfterCommit.registered_in(&v35), None);
    }

    #[test]
    fn the_failpoints_only_3_5_has_are_said_so() {
        let v35: Vec<_> = Failpoint::ALL.into_iter().filter(|f| f.since() == Version::new(3, 5)).collect();
        assert_eq!(v35.len(), 5, "{v35:?}");
        assert!(v35.contains(&Failpoint::WalBeforeSync) && !v35.contains(&Failpoint::RaftBeforeSave));
    }

    #[test]
    fn only_failpoints_an_op_request_waits_for_may_sleep() {
        let sleepers: Vec<_> = Failpoint::ALL.into_iter().filter(|f| f.can_sleep()).collect();
        assert!(sleepers.contains(&Failpoint::DefragBeforeCopy) && sleepers.contains(&Failpoint::RaftBeforeLeaderSend));
        assert!(!sleepers.contains(&Failpoint::RaftBeforeApplySnap) && !sleepers.contains(&Failpoint::RaftBeforeWalSaveSnapshot));
    }
}
