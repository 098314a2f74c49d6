//! What a target reports after a step. Plain data: targets fill it in, invariants judge it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use shakedown_faults::{BackupId, MemberId};

/// Everything a target observed for one check.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// One entry per member process the target knows of (model members and any it still runs).
    pub members: Vec<MemberStatus>,
    /// etcd's member list as the leader (or any reachable member) reports it.
    pub member_list: Option<Vec<ListedMember>>,
    /// Linearizable reads through the endpoint, each on a fresh connection.
    pub probes: Vec<Probe>,
    /// The acknowledged writes and what a linearizable read returned for them.
    #[serde(skip)]
    pub durability: Option<Durability>,
    /// Samples taken since the step began: one per change.
    pub serving_samples: Vec<ServingSample>,
    /// Milliseconds since the step began when this observation was taken (the samples cover
    /// up to here).
    pub samples_until_ms: u64,
    /// Whether the model says quorum holds at every moment of the step.
    pub quorum_throughout: bool,
    /// The target-specific part: what the target finds of this run (for `leaks`).
    pub inventory: Option<Inventory>,
}

/// What a target finds of the run, read off the stack rather than the target's bookkeeping:
/// the part of an observation that differs per target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "target", rename_all = "kebab-case")]
pub enum Inventory {
    /// The local target: processes, mounts, loop devices, rules and files on this machine.
    Local(LocalInventory),
    /// The kube target: Cluster API objects (and the workload cluster's).
    Kube(KubeInventory),
}

/// Resources of the run found on the machine (not from the target's own bookkeeping).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalInventory {
    /// Member names with a live etcd process.
    pub processes: BTreeSet<String>,
    /// Live HAProxy processes (a reload hands over within seconds).
    pub haproxies: usize,
    /// Member names with a mounted disk.
    pub mounts: BTreeSet<String>,
    /// Member names with a loop device attached to their disk image.
    pub loop_devices: BTreeSet<String>,
    /// Member names with a data directory.
    pub data_dirs: BTreeSet<String>,
    /// Sites with partition rules (by the rules' comments).
    pub partition_rules: BTreeSet<String>,
    /// Backup files in the backup store (`b0`, …).
    pub backups: BTreeSet<String>,
    /// Whether the target uses loop-mounted disks (else plain directories: no mounts expected).
    pub loop_disks: bool,
}

/// The kube target's inventory: objects labelled `cluster.x-k8s.io/cluster-name=<cluster>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeInventory {
    /// Control-plane Machines not being deleted: Machine name → the model member it stands for
    /// (`None`: it stands for none).
    pub machines: BTreeMap<String, Option<MemberId>>,
    /// Worker Machines per MachineDeployment: (name, spec.replicas, Machines found).
    pub machine_deployments: Vec<(String, i64, usize)>,
    /// InfraMachines (`Kind/name`) that no Machine references.
    pub orphan_infra_machines: Vec<String>,
    /// Workload-cluster Nodes that no Machine references (empty when not observed).
    pub orphan_nodes: Vec<String>,
    /// PersistentVolumes in phase Released or Failed (empty when not observed).
    pub released_volumes: Vec<String>,
    /// VolumeAttachments whose Node is gone (empty when not observed).
    pub orphan_volume_attachments: Vec<String>,
    /// Objects being deleted (`Kind/name`) → seconds since their deletionTimestamp.
    pub deleting: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// The etcd member name (`m0`).
    pub name: String,
    /// The model id, when the name is one.
    pub member: Option<MemberId>,
    /// Answered the status request in time.
    pub reachable: bool,
    /// The leader this member sees, if any.
    pub leader: Option<Leader>,
    pub etcd_id: Option<u64>,
    pub revision: i64,
    pub raft_index: u64,
    pub version: Option<String>,
    /// (revision, hash) from HashKV at a revision common to all reachable members.
    pub hash: Option<(i64, u32)>,
    pub error: Option<String>,
}

/// The leader a member sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Leader {
    /// This etcd member id.
    Id(u64),
    /// A leader, which one the target cannot tell (the kube target: KubeadmControlPlane reports
    /// the etcd cluster healthy, not who leads).
    Unnamed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedMember {
    /// etcd's member id, when the target can see it (not through Cluster API).
    pub id: Option<u64>,
    pub name: String,
    pub peer_urls: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub latency_ms: u64,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Durability {
    /// Every write the workload acknowledged, in the order acknowledged: key → value.
    pub acked: Acked,
    /// Where backups and restores fall in `acked` (counts of acknowledged writes at the time).
    pub marks: Marks,
    /// What a linearizable read of the workload's prefix returned.
    pub read: HashMap<String, String>,
    pub read_error: Option<String>,
}

/// Which members answered at one instant during a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServingSample {
    /// Milliseconds since the step started.
    pub at_ms: u64,
    /// Names of the members that answered a status request in time.
    pub serving: Vec<String>,
    /// Size of the etcd membership at that instant.
    pub cluster_size: usize,
}

/// Positions in the sequence of acknowledged writes: `n` means "after the first n acks".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    /// Backup → (acks when the snapshot started, acks when it ended).
    pub backups: BTreeMap<BackupId, (usize, usize)>,
    /// Restores in order: (backup, acks when the restore started, acks when the stack was back).
    pub restores: Vec<(BackupId, usize, usize)>,
}

/// Acknowledged writes (key, value) in the order acknowledged, kept in shared chunks: taking a
/// snapshot for a check costs one pointer per [`Acked::CHUNK`] writes plus the open chunk, not a
/// copy of every write (checks run every 50 ms on a history that grows for the whole run).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Acked {
    chunks: Vec<std::sync::Arc<Vec<(String, String)>>>,
}

impl Acked {
    /// Writes per sealed chunk.
    pub const CHUNK: usize = 4096;

    /// A history from sealed chunks (each shared, not copied) and the open one.
    pub fn from_chunks(sealed: &[std::sync::Arc<Vec<(String, String)>>], open: &[(String, String)]) -> Acked {
        let mut chunks = sealed.to_vec();
        if !open.is_empty() {
            chunks.push(std::sync::Arc::new(open.to_vec()));
        }
        Acked { chunks }
    }

    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &(String, String)> {
        self.chunks.iter().flat_map(|c| c.iter())
    }
}

impl From<Vec<(String, String)>> for Acked {
    fn from(v: Vec<(String, String)>) -> Acked {
        Acked { chunks: if v.is_empty() { vec![] } else { vec![std::sync::Arc::new(v)] } }
    }
}
