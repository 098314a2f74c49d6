//! Profiles: named tiers (plan length, op weights, members, bounds), written in TOML.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::model::{Model, Version};
use crate::op::OpKind;

/// The longest plan a profile may ask for: generation and the model are linear in it, and a
/// plan this long already runs for days.
pub const MAX_STEPS: usize = 100_000;

/// The largest weight a profile may pin: weights are relative, and the sum of every kind's must
/// fit the planner's u32 (with this cap it does for any number of kinds below 4,000).
pub const MAX_WEIGHT: u32 = 1_000_000;

/// A named tier: which ops with which weights, how long plans are, the bounds of every wait,
/// and which invariants are checked.
///
/// Written in TOML (`--profile FILE`, or a shipped name); unknown fields are an error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The tier's name, printed on the first line of a run and recorded in seed records
    /// (`--profile` takes a shipped name or a file path, not this field).
    pub name: String,
    /// One line on what the tier is for, listed by `shakedown profiles`.
    #[serde(default)]
    pub description: String,
    /// Plan length: how many ops a plan of this tier has, 1 to 100,000. `--steps N` overrides
    /// it for one command.
    #[schemars(range(min = 1, max = MAX_STEPS))]
    pub steps: usize,
    /// How many sites (failure domains) the members are spread over, round-robin: member `i`
    /// is in site `i mod sites`. A `site-outage` takes one site down. At least 1 and at most
    /// `members` (a site without a member would be empty); the kube target needs at least this
    /// many failure domains.
    #[schemars(range(min = 1))]
    #[serde(default = "default_three")]
    pub sites: u8,
    /// How many etcd members the stack starts with, 1 to 9 (kube: control-plane Machines,
    /// which must equal the KubeadmControlPlane's `spec.replicas`).
    #[schemars(range(min = 1, max = 9))]
    #[serde(default = "default_three_u32")]
    pub members: u32,
    /// Versions the stack can run, oldest first, without repeats, as `"MAJOR.MINOR"`; the
    /// stack starts on the first and `rolling-upgrade` moves to a later one. The local target
    /// runs the etcd binary of each version (`--etcd VERSION=PATH`); the kube target needs a
    /// `[versions."V"]` table in the kube profile for each version it upgrades to.
    pub versions: Vec<Version>,
    /// The most members down at once (crashed, on a site that is out, or with a detached
    /// disk), at least 1. Absent: as many as keeps quorum (1 of 3 members). A larger value makes
    /// destructive plans that lose quorum on purpose; the invariants follow the model (nothing
    /// acknowledged may be lost, the healed stack must converge).
    #[schemars(range(min = 1))]
    #[serde(default)]
    pub max_down: Option<usize>,
    /// The op kinds this tier may use; kinds not listed get weight 0. Absent: every kind. A
    /// tier that lists its ops never picks up a new op kind by accident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<Vec<OpKind>>,
    /// Pinned op weights, by op kind (`crash = 8`). Kinds left out are drawn from the seed
    /// (swarm testing) and printed at the start of a run; a weight of 0 disables a kind. A
    /// kind with a weight above 0 must be in `ops` when `ops` is given.
    #[serde(default)]
    #[schemars(extend("x-key" = "op kind"))]
    pub weights: BTreeMap<OpKind, u32>,
    /// The bounds of every wait (`[timeouts]`); fields left out keep their defaults.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// The clients that load the stack during the run (`[workload]`; local target only, the
    /// kube target runs none); fields left out keep their defaults.
    #[serde(default)]
    pub workload: Workload,
    /// The local target's stack: `etcd` (etcd members behind HAProxy: the cheap default) or
    /// `control-plane` (per site a machine of kubeadm's stacked topology: an etcd member and a
    /// kube-apiserver that talks to it, behind HAProxy as the API load balancer, loaded by the
    /// `[api]` workload and checked by the `api-*` invariants too). An apiserver restarted with
    /// its machine takes seconds to be ready: give such a tier `converge` of about 30 s (the
    /// shipped `control-plane` profile does). The kube target ignores it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub stack: Stack,
    /// The Kubernetes API workload of the `control-plane` stack (`[api]`); fields left out keep
    /// their defaults. (The kube target's API workload is configured in the kube profile.)
    #[serde(default, skip_serializing_if = "is_default")]
    pub api: ApiLoad,
    /// etcd's own flags for the local target's members (`[etcd]`), pinned or drawn per seed
    /// (`draw`); fields left out keep etcd's defaults (and the testbed's raft timing). Every
    /// member the run starts gets them, restarted, replaced and restored ones too. The kube and
    /// app targets run no etcd of their own and ignore it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub etcd: EtcdFlags,
    /// Names of the invariants checked after every step (`docs/reference.md` lists them).
    /// Absent: all of those of the profile's `stack` (for `app`: `leaks`, `app-ready`,
    /// `app-durability`, `app-linearizability`; otherwise every other one). A target leaves out, with a note, those it
    /// cannot observe.
    #[serde(default)]
    pub invariants: Option<Vec<String>>,
}

/// Every wait is bounded; these are the bounds. Durations are written the human way
/// (`"500ms"`, `"10s"`, `"2m"`) and must be more than zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// How long the stack may take to satisfy every invariant after a step: the checks are
    /// retried until then, and a violation still there fails the run (exit 1; one that waiting
    /// cannot undo, such as a lost acknowledged write, fails at once).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub converge: Duration,
    /// Deadline of one linearizable read through the endpoint (local target: the
    /// `reachability` probes and the read-back through HAProxy).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub probe: Duration,
    /// How long the healed stack may take to converge after the last op; longer is a liveness
    /// failure (exit 3).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub liveness: Duration,
    /// How long one op of the local target may take, its own waits included (a member
    /// becoming healthy, caught up); longer is a liveness failure (exit 3). The kube target
    /// bounds its ops with the kube profile's timeouts instead.
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub op: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            converge: Duration::from_secs(10),
            probe: Duration::from_secs(2),
            liveness: Duration::from_secs(30),
            op: Duration::from_secs(60),
        }
    }
}

/// etcd's flags for the local target's members. Each is etcd's own flag of the same name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdFlags {
    /// `--snapshot-count`: entries a member applies between two snapshots of its store. After
    /// each, the member keeps only the last 5,000 raft entries before it (etcd's fixed catch-up
    /// window on 3.4 and 3.5), so a member further behind than that when the leader has just
    /// snapshotted is sent the whole snapshot when it comes back, instead of the entries it
    /// missed. Absent: etcd's default, 100,000 (no run here gets that far).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_count: Option<u64>,
    /// `--heartbeat-interval`, raft's heartbeat. Absent: 100 ms, etcd's default.
    #[serde(default, with = "human_opt", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub heartbeat: Option<Duration>,
    /// `--election-timeout`; etcd refuses one shorter than 5 heartbeats. Absent: 1 s, etcd's
    /// default.
    #[serde(default, with = "human_opt", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration_schema")]
    pub election: Option<Duration>,
    /// `--experimental-compaction-batch-limit`: revisions one batch of a compaction deletes
    /// before it yields to other transactions. Absent: etcd's default, 1,000.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction_batch_limit: Option<u64>,
    /// Run a failpoint build of etcd (its own gofail failpoints compiled in;
    /// `scripts/build-etcd-failpoints.sh` makes 3.4.23's and 3.5.16's from Debian's source,
    /// `install-deps.sh --all` runs it) and draw the `failpoint` op: etcd made to panic or sleep at a
    /// chosen point of its raft loop, backend or defragmentation. Each version's binary must
    /// be such a build (a `failpoints` list beside it). The snapshot paths' failpoints are drawn
    /// only with a `snapshot_count` of at most 10,000.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub failpoints: bool,
    /// Flags drawn from the seed instead of pinned (swarm testing, as the op weights a profile
    /// does not pin are): each seed gets its own value of each, from the values listed for it
    /// under "etcd flags" in the reference's names, never one above what etcd or a shipped op
    /// needs. The plan keeps the
    /// values (pinned and drawn), a run prints them beside the weights, and a seed record
    /// replays with them. A flag is pinned or drawn, not both. Absent: none is drawn.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub draw: Vec<EtcdFlag>,
}

/// An etcd flag a profile can have drawn per seed (`[etcd] draw`), with the values it is drawn
/// from. Each is drawn from its own stream of the seed, so drawing one more flag changes no other
/// flag's value, and none changes the weights or ops a seed draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(title = "etcd flag")]
pub enum EtcdFlag {
    /// 500, 1,000, 5,000 or 10,000 entries: never above 10,000, so
    /// `partition-until-snapshot` and the snapshot paths' failpoints stay reachable.
    SnapshotCount,
    /// 50 ms, 100 ms or 200 ms; with a pinned `election`, only those of at most a fifth of it
    /// (etcd refuses an election timeout below 5 heartbeats).
    Heartbeat,
    /// 500 ms, 1 s or 2 s, those of 5 to 20 heartbeats (the heartbeat drawn or pinned, else
    /// 100 ms). Not below 500 ms: the testbed's old timing, 50 ms and 500 ms, already churned
    /// elections on a loaded 2-core machine (docs/development.md), and shorter would churn more;
    /// not above 2 s: a recovery on etcd 3.4 (no pre-vote) takes rounds of one or two election
    /// timeouts, which a 15 s `converge` must still cover.
    Election,
    /// 100, 1,000 (etcd's default) or 10,000 revisions per batch.
    CompactionBatchLimit,
}

impl EtcdFlag {
    /// In the order they are drawn (an election timeout fits the heartbeat drawn before it).
    pub const ALL: [EtcdFlag; 4] = [EtcdFlag::SnapshotCount, EtcdFlag::Heartbeat, EtcdFlag::Election, EtcdFlag::CompactionBatchLimit];

    /// The name a profile writes (`draw = ["snapshot_count"]`), the field's own.
    pub fn name(self) -> &'static str {
        match self {
            EtcdFlag::SnapshotCount => "snapshot_count",
            EtcdFlag::Heartbeat => "heartbeat",
            EtcdFlag::Election => "election",
            EtcdFlag::CompactionBatchLimit => "compaction_batch_limit",
        }
    }
}

impl std::fmt::Display for EtcdFlag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The snapshot counts `draw = ["snapshot_count"]` draws from.
pub const DRAWN_SNAPSHOT_COUNTS: [u64; 4] = [500, 1_000, 5_000, 10_000];
/// The heartbeats `draw = ["heartbeat"]` draws from.
pub const DRAWN_HEARTBEATS: [Duration; 3] = [Duration::from_millis(50), Duration::from_millis(100), Duration::from_millis(200)];
/// The election timeouts `draw = ["election"]` draws from (those of 5 to 20 heartbeats).
pub const DRAWN_ELECTIONS: [Duration; 3] = [Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];
/// The compaction batch limits `draw = ["compaction_batch_limit"]` draws from.
pub const DRAWN_COMPACTION_BATCH_LIMITS: [u64; 3] = [100, 1_000, 10_000];
/// etcd's heartbeat when none is set (`--heartbeat-interval`), as the testbed runs it.
pub const ETCD_DEFAULT_HEARTBEAT: Duration = Duration::from_millis(100);
/// etcd's election timeout when none is set (`--election-timeout`), as the testbed runs it.
pub const ETCD_DEFAULT_ELECTION: Duration = Duration::from_secs(1);

/// The election timeouts a drawn election is chosen from: those of [`DRAWN_ELECTIONS`] that are
/// 5 to 20 heartbeats of `heartbeat`.
pub fn election_choices(heartbeat: Duration) -> Vec<Duration> {
    DRAWN_ELECTIONS.into_iter().filter(|e| *e >= heartbeat * 5 && *e <= heartbeat * 20).collect()
}

/// The largest `[etcd] snapshot_count` at which a run can outrun a member's raft log (the
/// others apply `snapshot_count` + 5,000 entries): `partition-until-snapshot` and the snapshot
/// paths' failpoints need one this small.
pub const MAX_SNAPSHOT_COUNT_TO_OUTRUN: u64 = 10_000;

impl EtcdFlags {
    /// The failpoints a run of these flags can reach, in catalogue order: none without a
    /// failpoint build; the snapshot paths' only when snapshots come often enough.
    pub fn reachable_failpoints(&self) -> Vec<crate::failpoint::Failpoint> {
        if !self.failpoints {
            return vec![];
        }
        let snapshots = self.snapshot_count.is_some_and(|n| n <= MAX_SNAPSHOT_COUNT_TO_OUTRUN);
        crate::failpoint::Failpoint::ALL.into_iter().filter(|f| snapshots || !f.needs_snapshots()).collect()
    }
}

impl EtcdFlags {
    /// What is wrong with these flags, said as a profile error: a value etcd would refuse, or a
    /// `draw` that names a flag twice, names one also pinned, or has nothing to draw from.
    pub fn problem(&self) -> Option<String> {
        if self.snapshot_count == Some(0) {
            return Some("etcd.snapshot_count must be at least 1".into());
        }
        if self.compaction_batch_limit == Some(0) {
            return Some("etcd.compaction_batch_limit must be at least 1".into());
        }
        for (i, flag) in self.draw.iter().enumerate() {
            if self.draw[..i].contains(flag) {
                return Some(format!("etcd.draw names {flag} twice"));
            }
            if let Some(value) = self.pinned(*flag) {
                return Some(format!(
                    "etcd.draw names {flag}, which etcd.{flag} = {value} pins: a flag is pinned or drawn, not both (leave out one of them)"
                ));
            }
        }
        let heartbeat = self.heartbeat.unwrap_or(ETCD_DEFAULT_HEARTBEAT);
        let election = self.election.unwrap_or(ETCD_DEFAULT_ELECTION);
        if heartbeat < Duration::from_millis(1) || !heartbeat.subsec_nanos().is_multiple_of(1_000_000) {
            return Some("etcd.heartbeat must be a whole number of milliseconds, at least 1ms".into());
        }
        let listed = |d: &[Duration]| d.iter().map(|d| humantime::format_duration(*d).to_string()).collect::<Vec<_>>().join(", ");
        if self.draws(EtcdFlag::Heartbeat) && self.heartbeat_choices().is_empty() {
            return Some(format!(
                "etcd.draw names heartbeat, but none of the heartbeats it draws from ({}) is at most a fifth of etcd.election = {}, as etcd requires: pin heartbeat too, or draw election",
                listed(&DRAWN_HEARTBEATS),
                humantime::format_duration(election)
            ));
        }
        if self.draws(EtcdFlag::Election) && election_choices(heartbeat).is_empty() {
            return Some(format!(
                "etcd.draw names election, but none of the election timeouts it draws from ({}) is 5 to 20 heartbeats of etcd.heartbeat = {}: pin election too, or draw heartbeat",
                listed(&DRAWN_ELECTIONS),
                humantime::format_duration(heartbeat)
            ));
        }
        // A drawn heartbeat or election is drawn to fit the other (the two checks above).
        let drawn_timing = self.draws(EtcdFlag::Heartbeat) || self.draws(EtcdFlag::Election);
        if !election.subsec_nanos().is_multiple_of(1_000_000)
            || (!drawn_timing && election < heartbeat * 5)
            || election > Duration::from_secs(50)
        {
            return Some(format!(
                "etcd.election = {} must be whole milliseconds, at least 5 heartbeats ({}) and at most 50s, as etcd requires",
                humantime::format_duration(election),
                humantime::format_duration(heartbeat * 5)
            ));
        }
        None
    }

    /// Whether `draw` names `flag`.
    pub fn draws(&self, flag: EtcdFlag) -> bool {
        self.draw.contains(&flag)
    }

    /// The value these flags pin for `flag`, as a profile writes it.
    fn pinned(&self, flag: EtcdFlag) -> Option<String> {
        let human = |d: Option<Duration>| d.map(|d| format!("{:?}", humantime::format_duration(d).to_string()));
        match flag {
            EtcdFlag::SnapshotCount => self.snapshot_count.map(|n| n.to_string()),
            EtcdFlag::Heartbeat => human(self.heartbeat),
            EtcdFlag::Election => human(self.election),
            EtcdFlag::CompactionBatchLimit => self.compaction_batch_limit.map(|n| n.to_string()),
        }
    }

    /// The heartbeats a drawn heartbeat is chosen from: [`DRAWN_HEARTBEATS`], with a pinned
    /// election (or etcd's default one) only those of at most a fifth of it; with a drawn one,
    /// all of them (the election is drawn to fit).
    pub fn heartbeat_choices(&self) -> Vec<Duration> {
        if self.draws(EtcdFlag::Election) {
            return DRAWN_HEARTBEATS.to_vec();
        }
        let election = self.election.unwrap_or(ETCD_DEFAULT_ELECTION);
        DRAWN_HEARTBEATS.into_iter().filter(|h| *h * 5 <= election).collect()
    }

    /// The flags as a run prints them, beside the weights (`snapshot_count=1000 heartbeat=50ms
    /// …`); empty when none is set.
    pub fn summary(&self) -> String {
        let mut out: Vec<String> =
            EtcdFlag::ALL.into_iter().filter_map(|f| self.pinned(f).map(|v| format!("{f}={}", v.trim_matches('"')))).collect();
        if self.failpoints {
            out.push("failpoints".into());
        }
        out.join(" ")
    }

    /// The command-line flags these settings add to etcd's (heartbeat and election apart: the
    /// testbed always sets those).
    pub fn args(&self) -> Vec<String> {
        let mut a = vec![];
        if let Some(n) = self.snapshot_count {
            a.extend(["--snapshot-count".to_string(), n.to_string()]);
        }
        if let Some(n) = self.compaction_batch_limit {
            a.extend(["--experimental-compaction-batch-limit".to_string(), n.to_string()]);
        }
        a
    }
}

/// The clients that load the stack through the endpoint during the run. Every acknowledged
/// write is recorded with its revision and judged by `durability`, `watch` and `leases`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Workload {
    /// Which workload: `kube` (the shape of kube-apiserver's storage traffic) or `puts` (one
    /// client writing unique keys with plain puts).
    pub kind: WorkloadKind,
    /// Pause between two requests of one client (`puts`: between two writes); `"0s"` sends as
    /// fast as etcd answers.
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub interval: Duration,
    /// Deadline of one request, more than zero; a write without an answer by then is recorded
    /// as of unknown outcome (it may or may not have applied).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub timeout: Duration,
    /// `kube`: concurrent clients writing objects (transactions guarded by a revision compare,
    /// conflict retries), 1 to 256.
    #[schemars(range(min = 1, max = 256))]
    pub clients: u32,
    /// `kube`: how many object keys the clients share, at least 1 (fewer keys, more conflicts).
    #[schemars(range(min = 1))]
    pub keyspace: u32,
    /// `kube`: long-lived watches of the object keys, 0 to 16, each resumed after an error from
    /// its last revision plus one. Watch `i` goes to member `i` first (as a stacked
    /// kube-apiserver watches its local member), through the endpoint when that member does not
    /// answer.
    #[schemars(range(max = 16))]
    pub watches: u32,
    /// `kube`: how often each watch asks etcd for a progress notification (as kube-apiserver's
    /// watch cache does before a consistent read from it); `"0s"` never asks. `watch` holds
    /// every notification to its promise: no event at or below its revision comes after it.
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub watch_progress: Duration,
    /// `kube`: how often the history before the previous compaction point is compacted away,
    /// as kube-apiserver's compactor does (every 5 minutes by default there): each time, to the
    /// revision the store had one interval earlier, and every third time to the revision it
    /// has then (ahead of what a resuming watch or a list in progress holds); a tick that finds
    /// no answer (an election, a member just killed) is tried again 200 ms later. Watches resumed below it are told so by etcd
    /// (and `watch` holds them to saying it), paginated reads pinned below it are refused.
    /// `"0s"` (the default, which records made before it existed replay with) never compacts;
    /// the shipped tiers compact every 10 s.
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub compact_interval: Duration,
    /// `kube`: what each client does, by weight (`[workload.mix]`); fields left out keep their
    /// defaults.
    pub mix: Mix,
    /// `kv`: what each client sends, by weight (`[workload.kv]`); fields left out keep their
    /// defaults.
    pub kv: KvMix,
    /// `kube`: the TTL of the leases the lease client grants, at least 2 s when `mix.lease` is
    /// above 0 (etcd raises anything below its minimum, about 1.5 s with default timings).
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub lease_ttl: Duration,
}

/// Which workload loads the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// Kubernetes-shaped: concurrent clients, compare-guarded transactions, leases, paginated
    /// reads, resumed watches.
    #[default]
    Kube,
    /// The original writer: one client, unique keys, plain puts, one every `interval`. Seed
    /// records written before workload kinds existed replay with it.
    Puts,
    /// etcd's whole key-value API (`[workload.kv]`): everything `kube` sends, plus plain puts,
    /// gets and deletes, ranges (linearizable, serializable, with a limit, keys-only,
    /// count-only, at an old revision), delete-ranges and multi-key transactions comparing
    /// values, versions and revisions. The `kube` settings (`clients`, `keyspace`, `watches`,
    /// `mix`, ...) apply to it too.
    Kv,
}

/// What a `kv` workload client sends, by weight (`[workload.kv]`; 0 switches a request off, at
/// least one must be above 0). Every request goes into the history, a request over several keys
/// as one line per key it covers (`group`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KvMix {
    /// A plain put of one key (a value nobody else writes).
    pub put: u32,
    /// A get of one key: linearizable, or serializable one time in four.
    pub get: u32,
    /// A plain delete of one key.
    pub delete: u32,
    /// A range over up to 20 consecutive keys, drawn among: linearizable, serializable, with a
    /// limit, keys-only, at an older revision (sometimes one compacted away, which etcd must
    /// refuse), and a read-only transaction that reads the range whole, keys-only and
    /// count-only at one revision (the three must agree).
    pub range: u32,
    /// A delete-range over up to 10 consecutive keys, with `prev_kv`.
    pub delete_range: u32,
    /// A transaction over several keys: compares on 1 to 3 keys' value, version, create or mod
    /// revision (`=`, `!=`, `<`, `>`), puts and deletes of 1 to 3 keys when they hold, the
    /// compared keys read in both branches (their answers must agree with the branch taken),
    /// and now and then a range at an older revision (one the store still has: drawn at or
    /// above every compaction asked for, never racing one).
    pub txn: u32,
    /// The same transaction with its range at a revision compacted away, which etcd must
    /// refuse as a whole. On every etcd installed here the members that did not receive it from
    /// the client apply its writes anyway and the stores diverge (etcd-io/etcd#18667,
    /// docs/findings.md finding 7): 0 by default, so that a run can find anything else;
    /// `seeds/` keeps a record that reaches it.
    pub txn_compacted: u32,
    /// `kube`'s guarded create, update or delete (`[workload.mix]` weighs which).
    pub guarded: u32,
    /// `kube`'s lease puts (grant, attach keys, then revoke or let expire), one time in three a
    /// keep-alive of the lease in use instead.
    pub lease: u32,
    /// `kube`'s paginated list of every key.
    pub list: u32,
}

impl Default for KvMix {
    fn default() -> Self {
        KvMix { put: 15, get: 15, delete: 5, range: 12, delete_range: 3, txn: 25, txn_compacted: 0, guarded: 15, lease: 8, list: 2 }
    }
}

impl KvMix {
    /// The weights in order: put, get, delete, range, delete-range, txn, txn-compacted,
    /// guarded, lease, list.
    pub fn weights(&self) -> [u32; 10] {
        [self.put, self.get, self.delete, self.range, self.delete_range, self.txn, self.txn_compacted, self.guarded, self.lease, self.list]
    }
}

/// What a `kube` workload client does, by weight (0 switches a kind of request off; at least one
/// must be above 0).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Mix {
    /// Create a key believed absent (`If(ModRevision == 0) Then(Put) Else(Get)`).
    pub create: u32,
    /// Update a key believed present (`If(ModRevision == rev) Then(Put) Else(Get)`, retried on
    /// conflict with the revision the `Else` returned).
    pub update: u32,
    /// Delete a key believed present (same guard, `Delete`).
    pub delete: u32,
    /// Put a key attached to the client's lease (a lease is reused for a few keys, then revoked
    /// or left to expire, the way kube-apiserver attaches Events to shared leases).
    pub lease: u32,
    /// A paginated read of the object keys at a pinned revision (LIST with `limit` and
    /// continue).
    pub list: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix { create: 20, update: 60, delete: 10, lease: 8, list: 2 }
    }
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            kind: WorkloadKind::Kube,
            interval: Duration::from_millis(5),
            timeout: Duration::from_secs(1),
            clients: 4,
            keyspace: 500,
            watches: 3,
            watch_progress: Duration::from_secs(1),
            compact_interval: Duration::ZERO,
            mix: Mix::default(),
            kv: KvMix::default(),
            lease_ttl: Duration::from_secs(3),
        }
    }
}

/// The shape of the local target's stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Stack {
    /// etcd members behind HAProxy.
    #[default]
    Etcd,
    /// Per site, an etcd member and a kube-apiserver talking to it (kubeadm's stacked
    /// topology), HAProxy in front of the apiservers (health check: `/readyz`).
    ControlPlane,
    /// An application on a Kubernetes cluster (`--target app` with an app profile): the members
    /// are its StatefulSet's replicas, and only the application ops (`pod-kill`,
    /// `operator-restart`, `pvc-loss`, `partition`, `partition-heal`, `pod-kill-selected`,
    /// `node-drain`, `pod-failure`) and `backup` / `restore` (the operator's custom resources)
    /// are drawn.
    App,
}

impl Stack {
    /// The name a profile writes (`stack = "control-plane"`).
    pub fn name(self) -> &'static str {
        match self {
            Stack::Etcd => "etcd",
            Stack::ControlPlane => "control-plane",
            Stack::App => "app",
        }
    }
}

/// Clients of a Kubernetes API (kube-rs): ConfigMaps created, updated with a
/// `resourceVersion` precondition (a conflict re-reads and retries) and deleted with one, in the
/// run's namespace through the load balancer; watches with bookmarks resumed from their last
/// `resourceVersion`, relisting on "too old". Every acknowledgement is judged by
/// `api-durability` and `api-watch`, and every request by `api-linearizability`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ApiLoad {
    /// Concurrent clients, 1 to 64; each owns `objects` ConfigMaps (one writer per object, so
    /// acknowledgement order is the order the API applied them).
    #[schemars(range(min = 1, max = 64))]
    pub clients: u32,
    /// ConfigMaps per client, 1 to 1000.
    #[schemars(range(min = 1, max = 1000))]
    pub objects: u32,
    /// Watches of the run's ConfigMaps, 0 to 16.
    #[schemars(range(max = 16))]
    pub watches: u32,
    /// Pause between two requests of one client.
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub interval: Duration,
    /// Deadline of one request, more than zero; a write without an answer by then is of
    /// unknown outcome.
    #[serde(with = "human")]
    #[schemars(schema_with = "duration_schema")]
    pub timeout: Duration,
}

impl Default for ApiLoad {
    fn default() -> Self {
        ApiLoad { clients: 2, objects: 16, watches: 2, interval: Duration::from_millis(20), timeout: Duration::from_secs(3) }
    }
}

impl ApiLoad {
    /// What is wrong with these settings (`table`: where they were written, for the message).
    pub fn problem(&self, table: &str) -> Option<String> {
        if self.clients == 0 || self.clients > 64 {
            return Some(format!("{table}.clients = {} must be between 1 and 64", self.clients));
        }
        if self.objects == 0 || self.objects > 1000 {
            return Some(format!("{table}.objects = {} must be between 1 and 1000", self.objects));
        }
        if self.watches > 16 {
            return Some(format!("{table}.watches = {} is more than 16", self.watches));
        }
        if self.timeout.is_zero() {
            return Some(format!("{table}.timeout must be more than zero"));
        }
        None
    }
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// The JSON Schema of a duration written the human way (`humantime`: `"500ms"`, `"10s"`,
/// `"1h30m"`): a string, whatever the Rust type. Used by the profile types of every crate.
pub fn duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "string", "format": "duration" })
}

fn default_three() -> u8 {
    3
}
fn default_three_u32() -> u32 {
    3
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("not a valid profile: {0}")]
    Parse(String),
    #[error("profile {name:?}: {problem}")]
    Invalid { name: String, problem: String },
}

impl Profile {
    pub fn from_toml(text: &str) -> Result<Profile, ProfileError> {
        let p: Profile = toml::from_str(text).map_err(|e| ProfileError::Parse(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a profile always serializes")
    }

    pub fn validate(&self) -> Result<(), ProfileError> {
        let bad = |problem: String| Err(ProfileError::Invalid { name: self.name.clone(), problem });
        if self.steps == 0 {
            return bad("steps must be at least 1".into());
        }
        if self.steps > MAX_STEPS {
            return bad(format!("steps = {} is more than the {MAX_STEPS} a plan may have", self.steps));
        }
        if let Some(ops) = &self.ops {
            if let Some((k, _)) = self.weights.iter().find(|(k, w)| **w > 0 && !ops.contains(k)) {
                return bad(format!("weights.{k} is set but {k} is not in ops"));
            }
        }
        if let Some((k, w)) = self.weights.iter().find(|(_, w)| **w > MAX_WEIGHT) {
            return bad(format!(
                "weights.{k} = {w} is more than {MAX_WEIGHT}: weights are relative (crash = 8 beside restart = 1 makes crash 8 times as likely)"
            ));
        }
        // A weight of 0 disables a kind: with every kind disabled there is nothing to plan
        // (not, as it once was, every kind at weight 1).
        let allowed: Vec<OpKind> = OpKind::ALL.into_iter().filter(|k| self.allows(*k)).collect();
        if allowed.is_empty() {
            return bad(format!("ops names no op kind the {} stack can run: nothing would be planned", self.stack.name()));
        }
        if allowed.iter().all(|k| self.weights.get(k) == Some(&0)) {
            return bad("every op kind this tier may use has weight 0 (a weight of 0 disables a kind): nothing would be planned".into());
        }
        if self.sites == 0 || self.members == 0 {
            return bad("sites and members must be at least 1".into());
        }
        if self.members > 9 {
            return bad(format!("members = {} is more than the 9 a testbed supports", self.members));
        }
        if self.versions.is_empty() {
            return bad("versions must name at least one version, e.g. versions = [\"3.4\", \"3.5\"]".into());
        }
        if self.versions.windows(2).any(|w| w[0] >= w[1]) {
            return bad("versions must be listed oldest first, without repeats".into());
        }
        if let Some(d) = self.max_down {
            if d > self.members as usize {
                return bad(format!("max_down = {d} is more than the {}", crate::counted(self.members, "member")));
            }
        }
        if self.max_down() == 0 {
            return bad(format!(
                "max_down is 0 for {}: no fault could run; set max_down = 1 or more (more than {} loses quorum: destructive plans)",
                crate::counted(self.members, "member"),
                self.members - (self.members / 2 + 1)
            ));
        }
        if u32::from(self.sites) > self.members {
            return bad(format!(
                "sites = {} is more than the {}: members go round-robin over the sites, so {} site(s) would be empty and an outage of one would take nothing down",
                self.sites,
                crate::counted(self.members, "member"),
                u32::from(self.sites) - self.members
            ));
        }
        for (name, d) in [
            ("converge", self.timeouts.converge),
            ("probe", self.timeouts.probe),
            ("liveness", self.timeouts.liveness),
            ("op", self.timeouts.op),
        ] {
            if d.is_zero() {
                return bad(format!("timeouts.{name} must be more than zero"));
            }
        }
        if self.workload.timeout.is_zero() {
            return bad("workload.timeout must be more than zero".into());
        }
        if let Some(p) = self.api.problem("api") {
            return bad(p);
        }
        if let Some(p) = self.etcd.problem() {
            return bad(p);
        }
        let w = &self.workload;
        if matches!(w.kind, WorkloadKind::Kube | WorkloadKind::Kv) {
            if w.clients == 0 || w.clients > 256 {
                return bad(format!("workload.clients = {} must be between 1 and 256", w.clients));
            }
            if w.keyspace == 0 {
                return bad("workload.keyspace must be at least 1".into());
            }
            if w.watches > 16 {
                return bad(format!("workload.watches = {} is more than 16", w.watches));
            }
            let m = &w.mix;
            let sum = |ws: &[u32]| ws.iter().map(|&w| u64::from(w)).sum::<u64>();
            if w.kind == WorkloadKind::Kube && sum(&[m.create, m.update, m.delete, m.lease, m.list]) == 0 {
                return bad("workload.mix gives every request weight 0: nothing would run".into());
            }
            if w.kind == WorkloadKind::Kv && sum(&w.kv.weights()) == 0 {
                return bad("workload.kv gives every request weight 0: nothing would run".into());
            }
            let leases = if w.kind == WorkloadKind::Kv { w.kv.lease } else { m.lease };
            if leases > 0 && w.lease_ttl < Duration::from_secs(2) {
                return bad(format!(
                    "workload.lease_ttl = {} is below 2s: etcd raises short TTLs, and the lease check needs the TTL it asked for",
                    humantime::format_duration(w.lease_ttl)
                ));
            }
        }
        Ok(())
    }

    /// Whether the tier may use op kind `k` at all (its `ops` list, when it has one).
    pub fn allows(&self, k: OpKind) -> bool {
        self.has_kind(k) && self.ops.as_ref().is_none_or(|ops| ops.contains(&k))
    }

    /// Whether this profile's stack can have op kind `k` at all, whatever `ops` and the weights
    /// say: its stack draws it ([`OpKind::drawn_for`]), and `failpoint` needs `[etcd]
    /// failpoints = true`. Plans' weights name exactly these kinds.
    pub fn has_kind(&self, k: OpKind) -> bool {
        k.drawn_for(self.stack) && (k != OpKind::Failpoint || self.etcd.failpoints)
    }

    /// max_down as configured, or the most that keeps quorum.
    pub fn max_down(&self) -> usize {
        self.max_down.unwrap_or(self.members as usize - (self.members as usize / 2 + 1))
    }

    /// The model of a freshly started stack for this profile.
    pub fn initial_model(&self) -> Model {
        let mut model = Model::new(self.sites, self.members, self.versions.clone(), self.max_down());
        model.failpoints = self.etcd.reachable_failpoints();
        model
    }
}

/// serde for durations written the human way: "500ms", "10s", "2m".
mod human {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("invalid duration {s:?}: {e}")))
    }
}

/// serde for optional durations written the human way.
mod human_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map(Some).map_err(|e| serde::de::Error::custom(format!("invalid duration {s:?}: {e}")))
    }
}
