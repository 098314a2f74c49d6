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
    /// The workload's long-lived watches (`None`: not observed; empty: no session yet).
    #[serde(skip)]
    pub watches: Option<Vec<WatchSession>>,
    /// Every request of the workload's clients with its answer, for `linearizability` (`None`:
    /// the target records no history).
    #[serde(skip)]
    pub history: Option<HistoryView>,
    /// The workload's leases and what etcd says of them (`None`: no lease workload, or not
    /// observed).
    #[serde(skip)]
    pub leases: Option<Leases>,
    /// Samples taken since the step began: one per change.
    pub serving_samples: Vec<ServingSample>,
    /// Milliseconds since the step began when this observation was taken (the samples cover
    /// up to here).
    pub samples_until_ms: u64,
    /// Whether the model says quorum holds at every moment of the step.
    pub quorum_throughout: bool,
    /// The target-specific part: what the target finds of this run (for `leaks`).
    pub inventory: Option<Inventory>,
    /// The Kubernetes API under test (the local `control-plane` stack; the kube target with an
    /// `[api]` table): `None` where there is none.
    #[serde(skip)]
    pub api: Option<ApiObservation>,
    /// The application under test (the app target): `None` elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<AppObservation>,
}

/// A gap in a watch stream that etcd declared: the history it would have delivered was
/// compacted (see [`WatchSession::compacted`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactedGap {
    pub from: i64,
    pub to: i64,
    /// The index of the first event delivered after the gap.
    pub at: usize,
}

/// What the application target saw of the application: its workloads, its probes, its
/// data-integrity workload, and what of the run it left in the cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppObservation {
    /// Each workload the app profile names (`kind/name`), its desired and Ready replicas.
    pub workloads: Vec<AppWorkload>,
    /// The profile's probes: name, and `None` when it passed or why it failed.
    pub probes: Vec<(String, Option<String>)>,
    /// The StatefulSet's replicas in the groups of the group partition in place (`app-ready`
    /// excuses them, as it does a partitioned replica).
    #[serde(default)]
    pub in_cut_groups: i32,
    /// The data-integrity workload: keys written once each, their values.
    #[serde(skip)]
    pub data: Option<AppData>,
    /// Every write and read of the data workload, for `app-linearizability` (`None`: not
    /// observed).
    #[serde(skip)]
    pub history: Option<HistoryView>,
}

/// What of the run the application target finds in the cluster (for `leaks`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppInventory {
    /// The members whose partition NetworkPolicy (labelled with the run id) exists.
    pub partitioned: std::collections::BTreeSet<MemberId>,
    /// The pick of the group partition whose NetworkPolicies (labelled with the run id) exist.
    #[serde(default)]
    pub groups_partitioned: Option<u32>,
    /// NetworkPolicies of the run that belong to no partition (a name it did not make).
    pub stray_policies: Vec<String>,
    /// The operator's Deployment is scaled below the replicas it had when the run started.
    pub operator_scaled_down: Option<String>,
    /// Nodes the run cordoned (`node-drain`) and that are still cordoned.
    #[serde(default)]
    pub cordoned: Vec<String>,
    /// Nodes that carry the run's `NoExecute` taint (`taint`): it is the op's to remove.
    #[serde(default)]
    pub tainted: Vec<String>,
    /// Pods a `pod-failure` of the run left failed (still annotated, still on the failure image).
    #[serde(default)]
    pub failed_pods: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppWorkload {
    pub name: String,
    pub desired: i32,
    pub ready: i32,
}

/// The application's data-integrity workload: unique keys written with the profile's write
/// command (acknowledged: it exited 0), and what the read command returned.
#[derive(Debug, Clone, PartialEq)]
pub struct AppData {
    /// Acknowledged writes (key, value, start), in the order acknowledged; `start` is how many
    /// writes had been acknowledged when it was sent (with several writers, it can be less than
    /// its own position).
    pub acked: Vec<(String, String, usize)>,
    /// Where the app's backups and restores (`backup`, `restore` through the operator's custom
    /// resources) fall in `acked`.
    pub marks: Marks,
    /// Writes whose command failed or did not finish: they may or may not be there.
    pub unknown: std::collections::BTreeSet<String>,
    /// The read command's result (key → value), or why it failed. Only writes acknowledged
    /// before the read was sent are in `acked`.
    pub read: Result<std::collections::BTreeMap<String, String>, String>,
}

/// What the Kubernetes API workload and the API probes saw. Objects are the workload's
/// ConfigMaps: a key is an object's name, a value its `data.v`, a revision its
/// `resourceVersion` (kube-apiserver's resourceVersion is etcd's revision).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiObservation {
    /// The acknowledged creates, updates and deletes, and a quorum LIST of the run's namespace
    /// (`read_revision`: the list's resourceVersion). Its `marks` hold the backups and restores
    /// that act on this API's data: the local stack's etcd snapshots do; a Velero backup of a
    /// management cluster's namespace does not touch a workload cluster's objects (none then).
    pub durability: Option<Durability>,
    /// The workload's watches (Kubernetes sends no previous values: `prev_unknown`).
    pub watches: Vec<WatchSession>,
    /// Every request of the API workload's writers and every LIST of the checks, for
    /// `api-linearizability` (`None`: not observed).
    pub history: Option<HistoryView>,
    /// Quorum reads through the API load balancer, each on a fresh connection.
    pub endpoint: Vec<Probe>,
    /// `GET /readyz` of each apiserver the target reaches on its own (the local stack's machines;
    /// none on the kube target, which knows only the load balancer).
    pub apiservers: Vec<ApiServerReady>,
}

/// One apiserver's `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServerReady {
    /// The apiserver's name (`m0-apiserver`).
    pub name: String,
    /// The machine (model member) it runs on.
    pub member: Option<MemberId>,
    /// It answered HTTP at all (a refused or timed-out connection: `false`).
    pub answered: bool,
    /// It answered 200: ready.
    pub ready: bool,
    /// What it answered otherwise (the status and the failing checks, or the connection error).
    pub detail: Option<String>,
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
    /// The application target: its NetworkPolicies and the operator's scale.
    App(AppInventory),
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
    /// The `control-plane` stack: machine names with a live kube-apiserver (`None`: the `etcd`
    /// stack, which runs none).
    #[serde(default)]
    pub apiservers: Option<BTreeSet<String>>,
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
    /// The raft index etcd reports (its committed index).
    pub raft_index: u64,
    /// The raft applied index, read by etcd after `revision` in the same status answer.
    #[serde(default)]
    pub applied_index: u64,
    /// The raft term etcd's status reports: the term of the last entry the member applied (etcd
    /// 3.4 and 3.5 set it as they apply), not its current term. A term that moved on during a
    /// step is an election that elected a leader; campaigns that elected nobody do not show.
    #[serde(default)]
    pub raft_term: Option<u64>,
    /// The revision of a second status request sent after the first answered: it reflects at
    /// least every entry up to `applied_index`.
    #[serde(default)]
    pub revision_after: Option<i64>,
    /// A quiet point: (revision, applied index) that two status answers in a row reported.
    /// The member's store then holds exactly the entries up to that index (etcd updates the
    /// store and the applied index in one apply of an entry, without waiting in between).
    #[serde(default)]
    pub settled: Option<(i64, u64)>,
    pub version: Option<String>,
    /// (revision, hash) from HashKV at a revision common to all reachable members.
    pub hash: Option<(i64, u32)>,
    /// The compacted revision the hash begins at (HashKV hashes what is left after it): hashes
    /// are compared only between members at the same one (0: never compacted).
    #[serde(default)]
    pub hash_from: i64,
    pub error: Option<String>,
}

impl MemberStatus {
    /// A member the target has no etcd status answer for (unreachable, or a target that reads
    /// health elsewhere): every etcd field empty, not reachable; callers fill in what they know.
    pub fn without_status(name: String, member: Option<MemberId>) -> MemberStatus {
        MemberStatus {
            name,
            member,
            reachable: false,
            leader: None,
            etcd_id: None,
            revision: 0,
            raft_index: 0,
            applied_index: 0,
            raft_term: None,
            revision_after: None,
            settled: None,
            version: None,
            hash: None,
            hash_from: 0,
            error: None,
        }
    }
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
    /// Every write the workload acknowledged, in the order acknowledged.
    pub acked: Acked,
    /// Writes whose outcome the workload does not know (a timeout, a broken connection, or still
    /// in flight): each may or may not have been applied.
    pub unknown: Vec<Unknown>,
    /// Where backups and restores fall in `acked` (counts of acknowledged writes at the time).
    pub marks: Marks,
    /// What a linearizable read of the workload's object keys returned: key → value. It was
    /// taken before `acked` and `unknown`, so every write it can reflect is in one of them.
    pub read: HashMap<String, String>,
    /// The store revision of that read: it reflects every write at or below it and none above
    /// (0: not known, every acknowledged write counts).
    pub read_revision: i64,
    pub read_error: Option<String>,
    /// What the workload's paginated reads at a pinned revision found wrong (keys out of order
    /// or repeated across pages, an entry newer than the pinned revision).
    pub list_anomalies: Vec<String>,
    /// The workload's transactions with writes that a member refused for a range at a
    /// revision it had compacted away (or not reached): etcd-io/etcd#18667 makes the members that
    /// did not receive such a transaction from the client apply its writes anyway. Each in words.
    pub refused_write_txns: Vec<String>,
    /// The workload's transactions with writes and a range at an older revision that got no
    /// answer, whose revision a compaction has since passed: applied after that compaction, the
    /// member that received one refused it and the others applied its writes (etcd-io/etcd#18667)
    /// — or it was applied before, or never. Each in words.
    pub unanswered_compacted_txns: Vec<String>,
    /// How many writes had been acknowledged when the read was sent (`None`: not recorded).
    /// A write acknowledged before is reflected by it; one acknowledged after is reflected only
    /// if its revision is at or below `read_revision`, and one whose revision is not known (a
    /// Kubernetes DELETE answers with the object as it was) may or may not be.
    pub read_sent_at: Option<usize>,
}

/// One acknowledged write of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub key: String,
    /// The value written; `None` for a delete.
    pub value: Option<String>,
    /// The store revision etcd assigned to the write (its response header); 0 when not known
    /// (then the write is judged by its place in acknowledgement order alone).
    pub revision: i64,
    /// How many writes had been acknowledged when this one was sent (a position in `acked`).
    pub start: usize,
}

impl Ack {
    /// A plain put (the unique-key writer).
    pub fn put(key: impl Into<String>, value: impl Into<String>, revision: i64, start: usize) -> Ack {
        Ack { key: key.into(), value: Some(value.into()), revision, start }
    }
}

/// A write whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unknown {
    pub key: String,
    /// `None` for a delete.
    pub value: Option<String>,
    /// How many writes had been acknowledged when it was sent.
    pub start: usize,
    /// It may apply after any later write of the key, whenever it was sent: a create
    /// (`If(ModRevision(key) == 0)`, after any later delete), and a write no compare on the key's
    /// own revision guards (a plain put or delete, a delete-range, a transaction guarded by other
    /// keys: the `kv` workload's). `false`: a write guarded by the key's mod revision, which can
    /// only apply after the writes acknowledged before it was sent.
    pub any_time: bool,
}

/// What one long-lived watch of the workload's object keys delivered since it last started from
/// scratch (resumptions from the last revision + 1 continue the same session).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WatchSession {
    /// The watcher (`w0`, …).
    pub name: String,
    /// The first revision the session covers.
    pub start_revision: i64,
    /// How many writes had been acknowledged when the session started.
    pub start_ack: usize,
    /// Every event delivered, in delivery order.
    pub events: Chunked<WatchEvent>,
    /// How often the stream broke and was resumed from the last revision + 1.
    pub resumptions: u32,
    /// Compaction reported by etcd on a resumption, each a declared gap: the stream resumed
    /// from revision `from` was told the history below `to` is compacted, and goes on from
    /// `to`. The writes in `from..to` are declared lost (not missing), and the stream's
    /// knowledge of each key's value, create revision and version starts again at event `at`
    /// (the first after the gap).
    pub compacted: Vec<CompactedGap>,
    /// The revisions of the compactions requested while the session ran: an event at or below
    /// one may come without its `prev_kv` (etcd-io/etcd#10681).
    pub compactions: Vec<i64>,
    /// The stream carries no previous values (a Kubernetes watch): `prev` is not checked.
    pub prev_unknown: bool,
    /// The key prefix the watch asked for (`None`: not an etcd range, a Kubernetes watch):
    /// every event must be inside it, and every event must be a write some client sent.
    pub range: Option<String>,
    /// The progress notifications the stream received, in order.
    pub progress: Vec<WatchProgress>,
    /// Which member served each stream of the session, in order.
    pub streams: Vec<WatchStream>,
}

/// One stream of a watch session: from its creation to its break.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchStream {
    /// The index (in the session) of the first event it delivered.
    pub first: usize,
    /// The member that served it: its name, or its id (hexadecimal) when it has no name yet.
    pub member: String,
    /// The etcd release that member ran when the stream was created (`None`: not known).
    pub version: Option<String>,
}

impl WatchSession {
    /// The stream that delivered event `i` (or would deliver the next one): `None` when the
    /// session does not record its streams.
    pub fn stream_at(&self, i: usize) -> Option<&WatchStream> {
        self.streams.iter().rev().find(|s| s.first <= i)
    }

    /// The member whose stream delivered event `i`.
    pub fn member_at(&self, i: usize) -> Option<&str> {
        self.stream_at(i).map(|s| s.member.as_str())
    }
}

/// A progress notification: etcd's promise that every event of the watch's range up to
/// `revision` has been delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchProgress {
    /// The revision it promises (its response header's).
    pub revision: i64,
    /// How many events the session had delivered when it arrived.
    pub delivered: usize,
}

/// One event a watch delivered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchEvent {
    pub revision: i64,
    pub key: String,
    /// `None` for a delete.
    pub value: Option<String>,
    /// The `prev_kv` etcd sent: `None` when it sent none.
    pub prev: Option<String>,
    /// The response that carried it, counted per session (events of one revision must arrive
    /// in one response).
    pub response: u64,
    /// The key's create revision and version as the event states them (a delete: `None`, as
    /// for a watch that does not carry them).
    pub created: Option<(i64, i64)>,
}

/// What the lease invariant judges: the workload's leases, etcd's live leases, and the
/// lease-attached keys, read in that order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Leases {
    /// The workload's leases whose grant was acknowledged before the observation began (since
    /// the last restore: a restore brings back another lease table).
    pub records: Vec<LeaseRecord>,
    /// etcd's live leases (LeaseLeases), asked after `records` was taken.
    pub alive: std::collections::BTreeSet<i64>,
    /// A linearizable read of the lease-attached keys, after `alive`: key → lease id.
    pub read: BTreeMap<String, i64>,
    /// Milliseconds since the workload started when the read had returned.
    pub read_done_ms: u64,
    /// Leases the workload had sent a revoke for by the time the read returned (a revoke sent
    /// after `records` was taken can still have removed a lease before `alive` was asked).
    pub revoking: std::collections::BTreeSet<i64>,
    pub error: Option<String>,
}

/// One lease the workload granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub id: i64,
    /// The TTL etcd granted, in milliseconds.
    pub ttl_ms: u64,
    /// Milliseconds since the workload started when the grant was sent: the lease cannot
    /// expire before this + TTL (a leader change only extends it).
    pub granted_at_ms: u64,
    /// Keys put with this lease whose put was acknowledged.
    pub keys: Vec<String>,
    pub revoke: Revoke,
    /// Milliseconds since the workload started when the last keep-alive etcd answered (with a
    /// TTL above 0) was sent, 0 for none: the lease cannot expire before this + TTL either.
    pub kept_alive_at_ms: u64,
}

/// Whether the workload revoked a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Revoke {
    #[default]
    No,
    /// Revoked, acknowledged.
    Acked,
    /// A revoke was sent; its outcome is unknown.
    Unknown,
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

/// The backups and restores of a run, in the order its ops made them, with positions in the
/// sequence of acknowledged writes (`n` means "after the first n acks").
///
/// Ack positions alone cannot order a backup and a restore: with no write acknowledged between
/// them (a workload that paused, a stack that served nothing), a restore's end and a later
/// backup's start are the same count. Op order is recorded instead ([`BackupMark::after_restores`]),
/// so fill these only through [`Marks::backup_taken`], [`Marks::restore_begins`] and
/// [`Marks::restore_ends`], in op order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    pub backups: BTreeMap<BackupId, BackupMark>,
    /// Restores in op order.
    pub restores: Vec<RestoreMark>,
}

/// One backup: when its snapshot started and ended, and where it falls among the restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupMark {
    /// Acks when the snapshot started.
    pub start: usize,
    /// Acks when it ended.
    pub end: usize,
    /// How many of the run's restores came before this backup in op order: the data it holds is
    /// what those restores left, plus what was written since.
    pub after_restores: usize,
}

/// One restore: from which backup, acks when it began and when the stack was back (`usize::MAX`
/// while it is not finished).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreMark {
    pub backup: BackupId,
    pub start: usize,
    pub end: usize,
    /// A point-in-time restore: the instant recovered to, as a backup taken at that instant
    /// (`start`: the acks before it; `end`: a write sent with at least `end` acks was sent
    /// after it). `None`: the backup itself was restored.
    pub point: Option<BackupMark>,
}

impl Marks {
    /// Backup `b` was taken while the acks went from `start` to `end` (after every restore
    /// recorded so far).
    pub fn backup_taken(&mut self, b: BackupId, start: usize, end: usize) {
        let after_restores = self.restores.len();
        self.backups.insert(b, BackupMark { start, end, after_restores });
    }

    /// A restore from `b` begins with `start` writes acknowledged; it ends at [`Marks::restore_ends`].
    pub fn restore_begins(&mut self, b: BackupId, start: usize) {
        self.restores.push(RestoreMark { backup: b, start, end: usize::MAX, point: None });
    }

    /// A point-in-time restore from `b` begins with `start` writes acknowledged; it recovers
    /// to an instant before which `acked` writes were acknowledged and after which every write
    /// sent had at least `sent_after` acknowledged before it. It ends at [`Marks::restore_ends`].
    pub fn pitr_begins(&mut self, b: BackupId, start: usize, acked: usize, sent_after: usize) {
        let point = BackupMark { start: acked, end: sent_after.max(acked), after_restores: self.restores.len() };
        self.restores.push(RestoreMark { backup: b, start, end: usize::MAX, point: Some(point) });
    }

    /// The restore begun last is done: the stack serves again with `end` writes acknowledged.
    pub fn restore_ends(&mut self, end: usize) {
        if let Some(last) = self.restores.last_mut() {
            last.end = end;
        }
    }

    /// Where the last finished restore left the acks (0 without one).
    pub fn last_restore_end(&self) -> usize {
        self.restores.last().map_or(0, |r| r.end)
    }
}

/// The workload's history as one check sees it: the requests that ended, in the order they
/// ended (a log shared with the recorder, not copied), and those still in flight, with the
/// checker that remembers what earlier checks of the same log decided.
#[derive(Debug, Clone)]
pub struct HistoryView {
    pub ended: Chunked<shakedown_history::Operation>,
    /// Sent and not ended yet: no answer so far.
    pub in_flight: Vec<shakedown_history::Operation>,
    /// No request that ends after this view was taken was sent before this instant (µs): the
    /// earliest call in flight, or the instant the view was taken.
    pub horizon: u64,
    /// The checker's memory. It only makes a check cheaper: the verdict is what the whole check
    /// of `ended` and `in_flight` gives.
    pub memo: std::sync::Arc<std::sync::Mutex<shakedown_history::Incremental>>,
    /// Member names by the ids the requests recorded, for a violation's wording.
    pub members: std::collections::HashMap<String, String>,
}

impl HistoryView {
    /// A view of a whole history given at once (no request in flight), with a memory of its own.
    pub fn of(history: shakedown_history::History, bound: u64) -> HistoryView {
        let horizon = history.ops.iter().map(|o| o.ret.unwrap_or(o.call)).max().map_or(0, |t| t + 1);
        HistoryView {
            ended: Chunked::from(history.ops),
            in_flight: vec![],
            horizon,
            memo: std::sync::Arc::new(std::sync::Mutex::new(shakedown_history::Incremental::new(bound))),
            members: HashMap::new(),
        }
    }

    /// The checker's report on this view: what was not judged by an earlier check of the same
    /// log is judged now.
    pub fn check(&self) -> shakedown_history::Report {
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        if memo.fed() > self.ended.len() {
            // Another log than the one the memory holds: start again.
            *memo = shakedown_history::Incremental::new(memo.bound());
        }
        let from = memo.fed();
        memo.name_members(&self.members);
        memo.feed(self.ended.iter_from(from).cloned());
        memo.check(&self.in_flight, self.horizon)
    }
}

impl PartialEq for HistoryView {
    fn eq(&self, other: &HistoryView) -> bool {
        self.ended == other.ended && self.in_flight == other.in_flight && self.horizon == other.horizon
    }
}

/// An append-only log kept in shared chunks: taking a snapshot for a check costs one pointer per
/// [`Chunked::CHUNK`] entries plus the open chunk, not a copy of every entry (checks run every
/// 50 ms on histories that grow for the whole run).
#[derive(Debug, Clone, PartialEq)]
pub struct Chunked<T> {
    chunks: Vec<std::sync::Arc<Vec<T>>>,
}

/// The acknowledged writes, in the order acknowledged.
pub type Acked = Chunked<Ack>;

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked { chunks: vec![] }
    }
}

impl<T: Clone> Chunked<T> {
    /// Entries per sealed chunk.
    pub const CHUNK: usize = 4096;

    /// A log from sealed chunks (each shared, not copied) and the open one.
    pub fn from_chunks(sealed: &[std::sync::Arc<Vec<T>>], open: &[T]) -> Chunked<T> {
        let mut chunks = sealed.to_vec();
        if !open.is_empty() {
            chunks.push(std::sync::Arc::new(open.to_vec()));
        }
        Chunked { chunks }
    }

    pub fn len(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter())
    }

    /// The entries from index `from` on, skipping whole chunks without walking them.
    pub fn iter_from(&self, from: usize) -> impl Iterator<Item = &T> {
        let mut skip = from;
        self.chunks.iter().flat_map(move |c| {
            let start = skip.min(c.len());
            skip -= start;
            c[start..].iter()
        })
    }
}

impl<T> From<Vec<T>> for Chunked<T> {
    fn from(v: Vec<T>) -> Chunked<T> {
        Chunked { chunks: if v.is_empty() { vec![] } else { vec![std::sync::Arc::new(v)] } }
    }
}

/// The writer side of a [`Chunked`] log: sealed chunks (shared with the snapshots checks take)
/// and the open one.
#[derive(Debug)]
pub struct ChunkedLog<T> {
    sealed: Vec<std::sync::Arc<Vec<T>>>,
    open: Vec<T>,
    len: usize,
}

impl<T> Default for ChunkedLog<T> {
    fn default() -> Self {
        ChunkedLog { sealed: vec![], open: vec![], len: 0 }
    }
}

impl<T: Clone> ChunkedLog<T> {
    pub fn push(&mut self, v: T) {
        self.open.push(v);
        self.len += 1;
        if self.open.len() == Chunked::<T>::CHUNK {
            self.sealed.push(std::sync::Arc::new(std::mem::take(&mut self.open)));
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn snapshot(&self) -> Chunked<T> {
        Chunked::from_chunks(&self.sealed, &self.open)
    }
}
