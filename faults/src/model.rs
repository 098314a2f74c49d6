//! The model: what shakedown expects the stack to look like. No IO.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::op::{Op, OpKind, PreconditionError};

/// A logical member id (`m0`, `m1`, …). Fresh ids are handed out by the model for new
/// members (rolling replace), so an id is never reused within a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemberId(pub u32);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "m{}", self.0)
    }
}

impl FromStr for MemberId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.strip_prefix('m')
            .and_then(|n| n.parse().ok())
            .map(MemberId)
            .ok_or_else(|| format!("invalid member name {s:?}: expected m<number>"))
    }
}

/// A site (failure domain), `0..sites`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SiteId(pub u8);

impl fmt::Display for SiteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "site{}", self.0)
    }
}

/// A `major.minor` component version, written `"3.4"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub major: u16,
    pub minor: u16,
}

impl Version {
    pub const fn new(major: u16, minor: u16) -> Self {
        Version { major, minor }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for Version {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid version {s:?}: expected MAJOR.MINOR such as \"3.5\"");
        let (a, b) = s.split_once('.').ok_or_else(bad)?;
        Ok(Version { major: a.parse().map_err(|_| bad())?, minor: b.parse().map_err(|_| bad())? })
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl schemars::JsonSchema for Version {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Version".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9]+\\.[0-9]+$",
            "description": "A `major.minor` component version, written `\"3.4\"`."
        })
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Process state of a member as the model expects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemberState {
    Running,
    /// SIGSTOPped: the process exists but answers nothing.
    Paused,
    /// Killed with SIGKILL: no process; its data stays on its disk.
    Crashed,
}

/// A member's disk as the model expects it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskState {
    Attached,
    /// Shut down under the member (FS_IOC_SHUTDOWN): every read and write fails with EIO.
    Detached,
}

/// How a site is out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutageMode {
    /// All traffic to and from the site's subnet is dropped; its processes keep running.
    Isolate,
    /// Every process of the site is killed at once.
    PowerLoss,
}

impl fmt::Display for OutageMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutageMode::Isolate => "isolate",
            OutageMode::PowerLoss => "power-loss",
        })
    }
}

/// A backup taken by a plan (`b0`, `b1`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BackupId(pub u32);

impl fmt::Display for BackupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b{}", self.0)
    }
}

/// Whether a member is expected to answer requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answers {
    Yes,
    No,
    /// Either is fine (a member whose disk was shut down may die at once or later).
    Either,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: MemberId,
    pub site: SiteId,
    pub version: Version,
    pub state: MemberState,
    pub disk: DiskState,
}

/// The expected state of the stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model {
    pub sites: u8,
    pub members: BTreeMap<MemberId, Member>,
    /// The next fresh member id.
    pub next_member: u32,
    /// The most members that may be down at once (paused or crashed) in this plan.
    pub max_down: usize,
    /// The versions the stack can run, oldest first.
    pub versions: Vec<Version>,
    /// Sites that are out, and how.
    #[serde(default)]
    pub outages: BTreeMap<SiteId, OutageMode>,
    /// Backups taken so far, oldest first.
    #[serde(default)]
    pub backups: Vec<BackupId>,
    /// Restores done so far, in order (each from one of `backups`).
    #[serde(default)]
    pub restores: Vec<BackupId>,
    /// After a restore: the number of the first backup taken since (every backup from it on
    /// holds the restored history); `None` before any restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backups_after_restore: Option<u32>,
    /// Replicas a NetworkPolicy cuts off (application target).
    #[serde(default)]
    pub partitioned: std::collections::BTreeSet<MemberId>,
    /// The pick of the group partition in place (`partition-groups`; application target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups_partitioned: Option<u32>,
    /// etcd's failpoints the stack can reach (a failpoint build, `[etcd] failpoints = true`),
    /// in catalogue order; empty for every other stack.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failpoints: Vec<crate::failpoint::Failpoint>,
}

impl Model {
    /// A freshly started stack: `members` members spread round-robin over `sites` sites,
    /// all running the oldest version.
    pub fn new(sites: u8, members: u32, versions: Vec<Version>, max_down: usize) -> Model {
        assert!(sites > 0 && members > 0 && !versions.is_empty(), "checked by Profile::validate");
        let version = versions[0];
        let members = (0..members)
            .map(|i| {
                let id = MemberId(i);
                (id, Member { id, site: SiteId((i % sites as u32) as u8), version, state: MemberState::Running, disk: DiskState::Attached })
            })
            .collect::<BTreeMap<_, _>>();
        Model {
            sites,
            next_member: members.len() as u32,
            members,
            max_down,
            versions,
            outages: BTreeMap::new(),
            backups: vec![],
            restores: vec![],
            backups_after_restore: None,
            partitioned: Default::default(),
            groups_partitioned: None,
            failpoints: vec![],
        }
    }

    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Votes needed for a majority of the current membership.
    pub fn quorum(&self) -> usize {
        self.size() / 2 + 1
    }

    /// A member is up when its process runs, its disk is attached and its site is not out.
    pub fn is_up(&self, m: &Member) -> bool {
        m.state == MemberState::Running && m.disk == DiskState::Attached && !self.outages.contains_key(&m.site)
    }

    /// Whether a request from outside the sites (shakedown, the endpoint) reaches the member and
    /// gets an answer.
    pub fn answers(&self, m: &Member) -> Answers {
        if self.outages.contains_key(&m.site) {
            return Answers::No;
        }
        match (m.state, m.disk) {
            (MemberState::Running, DiskState::Attached) => Answers::Yes,
            (MemberState::Running, DiskState::Detached) => Answers::Either,
            _ => Answers::No,
        }
    }

    /// Whether the member has a process (running, paused, or cut off with its site).
    pub fn has_process(&self, m: &Member) -> Answers {
        match (m.state, m.disk, self.outages.get(&m.site)) {
            (_, _, Some(OutageMode::PowerLoss)) | (MemberState::Crashed, _, _) => Answers::No,
            (_, DiskState::Detached, _) => Answers::Either,
            _ => Answers::Yes,
        }
    }

    pub fn down(&self) -> usize {
        self.members.values().filter(|m| !self.is_up(m)).count()
    }

    pub fn site_members(&self, site: SiteId) -> impl Iterator<Item = &Member> {
        self.members.values().filter(move |m| m.site == site)
    }

    pub fn up(&self) -> usize {
        self.size() - self.down()
    }

    /// Quorum is expected to hold: enough members are up.
    pub fn quorum_expected(&self) -> bool {
        self.up() >= self.quorum()
    }

    /// The service behind the endpoint is expected to answer linearizable reads.
    pub fn service_expected_up(&self) -> bool {
        self.quorum_expected()
    }

    /// The newest version any member runs.
    pub fn newest_version(&self) -> Version {
        self.members.values().map(|m| m.version).max().unwrap_or(self.versions[0])
    }

    /// The oldest version any member runs.
    pub fn oldest_version(&self) -> Version {
        self.members.values().map(|m| m.version).min().unwrap_or(self.versions[0])
    }

    pub fn member(&self, id: MemberId) -> Result<&Member, PreconditionError> {
        self.members.get(&id).ok_or(PreconditionError::NoSuchMember(id))
    }

    /// Whether quorum is expected to hold at every moment while `op` executes, not only
    /// before and after it: rolling ops take one member down at a time.
    #[deny(clippy::wildcard_enum_match_arm)]
    pub fn quorum_throughout(&self, op: &Op) -> bool {
        let transient = match op.kind() {
            // One member at a time, or the one cut off while the op runs.
            OpKind::RollingUpgrade | OpKind::RollingReplace | OpKind::PartitionUntilSnapshot | OpKind::Failpoint => 1,
            // A restore takes the whole cluster down on purpose.
            OpKind::Restore | OpKind::RestorePitr => return false,
            // One member (or one site) at a time, or nothing of etcd's: the precondition decides.
            OpKind::Crash
            | OpKind::Restart
            | OpKind::Pause
            | OpKind::Resume
            | OpKind::SiteOutage
            | OpKind::SiteRecover
            | OpKind::DiskDetach
            | OpKind::DiskReattach
            | OpKind::Backup
            | OpKind::DiskReplace
            | OpKind::PodKill
            | OpKind::OperatorRestart
            | OpKind::PvcLoss
            | OpKind::Partition
            | OpKind::PartitionHeal
            | OpKind::PodKillSelected
            | OpKind::NodeDrain
            | OpKind::PodFailure
            | OpKind::Switchover
            | OpKind::Taint
            | OpKind::PartitionGroups
            | OpKind::PartitionGroupsHeal
            | OpKind::Defrag => 0,
        };
        let mut after = self.clone();
        after.apply(op).is_ok() && self.quorum_expected() && after.quorum_expected() && self.up() >= self.quorum() + transient
    }

    /// Checks `op`'s precondition, then applies its expected effect.
    pub fn apply(&mut self, op: &Op) -> Result<(), PreconditionError> {
        self.check(op)?;
        match *op {
            Op::Crash { member } => self.set_state(member, MemberState::Crashed),
            Op::Restart { member } | Op::Resume { member } => self.set_state(member, MemberState::Running),
            Op::Pause { member } => self.set_state(member, MemberState::Paused),
            Op::RollingUpgrade { to } => self.members.values_mut().for_each(|m| m.version = to),
            Op::RollingReplace => {
                let version = self.newest_version();
                for (old, new) in self.replacements() {
                    let site = self.members.remove(&old).map(|m| m.site).unwrap_or(SiteId(0));
                    self.members.insert(new, Member { id: new, site, version, state: MemberState::Running, disk: DiskState::Attached });
                }
                self.next_member += self.members.len() as u32;
            }
            Op::SiteOutage { site, mode } => {
                self.outages.insert(site, mode);
                if mode == OutageMode::PowerLoss {
                    self.members.values_mut().filter(|m| m.site == site).for_each(|m| m.state = MemberState::Crashed);
                }
            }
            Op::SiteRecover { site } => {
                if self.outages.remove(&site) == Some(OutageMode::PowerLoss) {
                    self.members.values_mut().filter(|m| m.site == site).for_each(|m| m.state = MemberState::Running);
                }
            }
            Op::DiskDetach { member } => {
                if let Some(m) = self.members.get_mut(&member) {
                    m.disk = DiskState::Detached;
                }
            }
            Op::DiskReattach { member } | Op::DiskReplace { member } => {
                if let Some(m) = self.members.get_mut(&member) {
                    m.disk = DiskState::Attached;
                    m.state = MemberState::Running;
                }
            }
            Op::Backup => {
                let id = BackupId(self.backups.len() as u32);
                self.backups.push(id);
            }
            Op::PodKill { .. }
            | Op::OperatorRestart
            | Op::PvcLoss { .. }
            | Op::PodKillSelected { .. }
            | Op::NodeDrain { .. }
            | Op::PodFailure { .. }
            | Op::Switchover { .. }
            | Op::Taint { .. }
            | Op::Defrag { .. }
            | Op::PartitionUntilSnapshot { .. } => {}
            // A panic is a crash at that point; after a sleep the member runs on.
            Op::Failpoint { member, action, .. } => {
                if action == crate::failpoint::FailpointAction::Panic {
                    self.set_state(member, MemberState::Crashed);
                }
            }
            Op::Partition { member } => {
                self.partitioned.insert(member);
            }
            Op::PartitionHeal { member } => {
                self.partitioned.remove(&member);
            }
            Op::PartitionGroups { pick } => self.groups_partitioned = Some(pick),
            Op::PartitionGroupsHeal { .. } => self.groups_partitioned = None,
            Op::Restore { backup } | Op::RestorePitr { backup, .. } => {
                self.restores.push(backup);
                self.backups_after_restore = Some(self.backups.len() as u32);
                self.members.values_mut().for_each(|m| {
                    m.state = MemberState::Running;
                    m.disk = DiskState::Attached;
                });
            }
        }
        Ok(())
    }

    /// The (old, new) member pairs of a rolling replace from this state, in the order the
    /// replace runs: old members by id, new ids handed out in that order.
    pub fn replacements(&self) -> Vec<(MemberId, MemberId)> {
        self.members.keys().enumerate().map(|(i, &old)| (old, MemberId(self.next_member + i as u32))).collect()
    }

    /// Heals every fault, as an operator would: sites recover, detached disks are reattached,
    /// paused members resume, crashed members restart. Returns the ops, in order.
    pub fn heal_ops(&self) -> Vec<Op> {
        let mut ops: Vec<Op> = self.outages.keys().map(|&site| Op::SiteRecover { site }).collect();
        let mut healed = self.clone();
        for op in &ops {
            let _ = healed.apply(op);
        }
        // Processes first, so that quorum is back before disks are reattached (a reattached
        // member catches up from a leader, or is re-added if its data is unusable).
        for m in healed.members.values() {
            match (m.disk, m.state) {
                (DiskState::Detached, _) => {}
                (_, MemberState::Paused) => ops.push(Op::Resume { member: m.id }),
                (_, MemberState::Crashed) => ops.push(Op::Restart { member: m.id }),
                _ => {}
            }
        }
        ops.extend(healed.members.values().filter(|m| m.disk == DiskState::Detached).map(|m| Op::DiskReattach { member: m.id }));
        ops.extend(self.partitioned.iter().map(|&member| Op::PartitionHeal { member }));
        ops.extend(self.groups_partitioned.map(|pick| Op::PartitionGroupsHeal { pick }));
        ops
    }

    fn set_state(&mut self, id: MemberId, state: MemberState) {
        if let Some(m) = self.members.get_mut(&id) {
            m.state = state;
        }
    }
}
