//! The simulated target (`--target sim`): the model's expected stack played in memory, for
//! shakedown's own tests. It runs in microseconds, needs no root and depends on no timing, so the
//! engine and everything above it — session, record, replay and its matching, shrink, soak, the
//! skip cascade, healing, liveness, interrupts, exit codes, JUnit, the HTML report — are tested
//! on it in milliseconds.
//!
//! It is a stack that does exactly what the model says — members answer when the model says they
//! answer, one leader when quorum holds, every acknowledged write readable, backups and restores
//! bringing back what they held — unless a test switches on a misbehaviour ([`SimBug`]): a
//! write it acknowledged dropped, a stale read, a member serving a stale store, slow convergence, a check that
//! never converges, an op that fails, a panic, a missing observation.
//!
//! It says nothing about a real stack: every real target is still tested against its real
//! components. Its one IO is what every run writes: `history.jsonl` at teardown.

mod spec;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;
use shakedown_faults::{Answers, BackupId, Model, Op, OpKind};
use shakedown_history::format::{Kv as HistoryKv, ReadAnswer, Request, WriteAnswer};
use shakedown_history::{Incremental, Operation};
use shakedown_invariants::{
    Ack, ChunkedLog, Durability, HistoryView, InvariantId, Leader, ListedMember, Marks, MemberStatus, Observation, Probe,
};
use std::sync::{Arc, Mutex};

pub use spec::{SimBug, SimBugKind, SimOptions, SimSpec, Trigger};

use super::{Coverage, StartContext, Started, Target, TargetError};
use crate::exit::Fatal;

/// Writes the simulated workload acknowledges per step while the service is up.
pub const WRITES_PER_STEP: usize = 3;

/// How many observations a `slow-converge` step shows its member down before it answers.
pub const SLOW_OBSERVATIONS: u32 = 3;

/// How long the first observation of a `slow-observation` step takes.
pub const SLOW_OBSERVATION: std::time::Duration = std::time::Duration::from_millis(1500);

/// How long an op of a `slow-op` trigger takes.
pub const SLOW_OP: std::time::Duration = std::time::Duration::from_millis(300);

/// The keys the simulated workload writes (round robin), so later writes overwrite earlier ones.
const KEYS: usize = 5;

/// One store state: key → value, the revisions that wrote them, and the revision it is at.
#[derive(Debug, Clone, Default)]
struct Store {
    kv: BTreeMap<String, String>,
    mods: BTreeMap<String, i64>,
    revision: i64,
}

/// The simulated workload's requests, for `linearizability`: its writes and the reads of every
/// key at each observation, on a logical clock (10 µs per event), one epoch per restore.
struct Requests {
    log: ChunkedLog<Operation>,
    memo: Arc<Mutex<Incremental>>,
    clock: u64,
    epoch: u32,
}

impl Requests {
    fn tick(&mut self) -> u64 {
        self.clock += 10;
        self.clock
    }

    fn push(&mut self, request: Request) {
        let call = self.tick();
        let ret = self.tick();
        self.log.push(Operation { client: 0, member: None, epoch: self.epoch, group: None, call, ret: Some(ret), request });
    }

    fn view(&self) -> HistoryView {
        HistoryView {
            ended: self.log.snapshot(),
            in_flight: vec![],
            horizon: self.clock + 1,
            memo: self.memo.clone(),
            members: Default::default(),
        }
    }
}

/// The simulated stack.
pub struct SimTarget {
    spec: SimSpec,
    model: Model,
    store: Store,
    acked: Vec<Ack>,
    marks: Marks,
    backups: BTreeMap<BackupId, Store>,
    writes: usize,
    /// How many ops this target executed (heal ops included; an op the engine skipped is not
    /// executed), and the last one's kind.
    step: usize,
    kind: Option<OpKind>,
    /// Observations taken since the step's op ran.
    observed: u32,
    /// A `stale-member` fired: this member serves the store as it was before the step's writes.
    stale: Option<(shakedown_faults::MemberId, i64)>,
    /// `never-converge` fired: this member does not answer for the rest of the run.
    deaf: Option<shakedown_faults::MemberId>,
    /// `slow-converge` fired at the current step.
    slow: Option<shakedown_faults::MemberId>,
    /// The member the step's first observation sees down before it takes its time (`slow-observation`).
    slow_observation: Option<shakedown_faults::MemberId>,
    /// `unobserved` fired: observations leave out the data read-back from now on.
    blind: bool,
    /// `dead-endpoint` fired: reads through the endpoint fail from now on.
    dead_endpoint: bool,
    /// `late-leaderless` fired at the current step.
    leaderless: bool,
    /// `stale-read` fired: the key last written and what it held before (value, mod revision).
    stale_read: Option<(String, Option<(String, i64)>)>,
    requests: Requests,
    /// Where the history goes at teardown (`history.jsonl`, as every run writes it).
    run_dir: PathBuf,
}

impl SimTarget {
    pub fn start_spec(spec: &SimSpec, ctx: &StartContext<'_>) -> Result<SimTarget, Fatal> {
        let mut t = SimTarget {
            spec: spec.clone(),
            model: ctx.model.clone(),
            // An empty etcd store is at revision 1: its first write takes 2.
            store: Store { revision: 1, ..Store::default() },
            acked: vec![],
            marks: Marks::default(),
            backups: BTreeMap::new(),
            writes: 0,
            step: 0,
            kind: None,
            observed: 0,
            stale: None,
            deaf: None,
            slow: None,
            slow_observation: None,
            blind: false,
            dead_endpoint: false,
            leaderless: false,
            stale_read: None,
            requests: Requests {
                log: ChunkedLog::default(),
                memo: Arc::new(Mutex::new(Incremental::new(shakedown_invariants::linearizability::BOUND))),
                clock: 0,
                epoch: 0,
            },
            run_dir: ctx.run_dir.to_path_buf(),
        };
        // The workload's first write, before the bring-up check.
        t.write();
        Ok(t)
    }

    /// The bugs that fire at the current step.
    fn firing(&self) -> impl Iterator<Item = SimBugKind> + '_ {
        let (step, kind) = (self.step, self.kind);
        self.spec.bugs.iter().filter(move |b| b.at.fires(step, kind)).map(|b| b.kind)
    }

    /// One acknowledged write of the simulated workload.
    fn write(&mut self) {
        let key = format!("k{}", self.writes % KEYS);
        let value = format!("v{}", self.writes);
        self.store.revision += 1;
        self.store.kv.insert(key.clone(), value.clone());
        self.store.mods.insert(key.clone(), self.store.revision);
        let revision = self.store.revision;
        self.requests.push(Request::Put { key: key.clone(), value: value.clone(), answer: Some(WriteAnswer { revision }) });
        let start = self.acked.len();
        self.acked.push(Ack::put(key, value, self.store.revision, start));
        self.writes += 1;
    }

    /// A member the model says answers (the first), for bugs that need one.
    fn answering_member(&self) -> Option<shakedown_faults::MemberId> {
        self.model.members.values().find(|m| self.model.answers(m) == Answers::Yes).map(|m| m.id)
    }

    fn etcd_id(m: shakedown_faults::MemberId) -> u64 {
        100 + u64::from(m.0)
    }

    /// A deterministic hash of a store (what HashKV stands for).
    fn hash(kv: &BTreeMap<String, String>) -> u32 {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        for (k, v) in kv {
            h.update(k.as_bytes());
            h.update([0]);
            h.update(v.as_bytes());
            h.update([0]);
        }
        let d = h.finalize();
        u32::from_be_bytes([d[0], d[1], d[2], d[3]])
    }
}

#[async_trait::async_trait]
impl Target for SimTarget {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn component_versions(&self) -> BTreeMap<String, String> {
        BTreeMap::from([("sim".to_string(), env!("CARGO_PKG_VERSION").to_string())])
    }

    fn started(&self) -> Started {
        let bugs: Vec<String> = self.spec.bugs.iter().map(|b| b.to_string()).collect();
        let line = if bugs.is_empty() { "simulated stack".to_string() } else { format!("simulated stack · bugs {}", bugs.join(", ")) };
        Started { line, fields: json!({"bugs": bugs}), notes: vec![] }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    fn coverage(&self, id: InvariantId) -> Coverage {
        match id {
            InvariantId::Membership
            | InvariantId::Members
            | InvariantId::Quorum
            | InvariantId::Consistency
            | InvariantId::Reachability
            | InvariantId::Durability
            | InvariantId::Linearizability => Coverage::Checked,
            InvariantId::Leaks => Coverage::Unchecked("the simulated stack holds no resources of its own".into()),
            InvariantId::Watch | InvariantId::Leases => {
                Coverage::Unchecked("the simulated workload runs no watches and grants no leases".into())
            }
            InvariantId::ApiReachability | InvariantId::ApiDurability | InvariantId::ApiWatch | InvariantId::ApiLinearizability => {
                Coverage::Unchecked("the simulated stack has no Kubernetes API".into())
            }
            InvariantId::AppReady | InvariantId::AppDurability | InvariantId::AppLinearizability => {
                Coverage::Unchecked("only the application target (--target app) checks an application".into())
            }
        }
    }

    #[deny(clippy::wildcard_enum_match_arm)]
    fn supports(&self, op: &Op) -> Result<(), super::Unsupported> {
        if self.spec.bugs.iter().any(|b| b.kind == SimBugKind::Unsupported && b.at.matches_kind(op.kind())) {
            return Err("the sim bug 'unsupported' refuses it".into());
        }
        match op.kind() {
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
            | OpKind::Failpoint => Ok(()),
            OpKind::PodKill
            | OpKind::OperatorRestart
            | OpKind::PvcLoss
            | OpKind::Partition
            | OpKind::PartitionHeal
            | OpKind::PodKillSelected
            | OpKind::NodeDrain
            | OpKind::PodFailure
            | OpKind::Switchover
            | OpKind::Taint
            | OpKind::RestorePitr
            | OpKind::PartitionGroups
            | OpKind::PartitionGroupsHeal => Err("an application op: it runs on --target app".into()),
        }
    }

    async fn execute(&mut self, op: &Op, _before: &Model, after: &Model) -> Result<(), TargetError> {
        // Ops executed so far (heal ops included, skipped ops not): what `@N` counts.
        self.step += 1;
        self.kind = Some(op.kind());
        self.observed = 0;
        self.slow = None;
        self.slow_observation = None;
        self.leaderless = false;
        self.model = after.clone();
        let firing: Vec<SimBugKind> = self.firing().collect();
        for bug in &firing {
            match bug {
                SimBugKind::Panic => panic!("sim bug panic at step {} ({op})", self.step),
                SimBugKind::OpFails => return Err(TargetError::Stack(format!("{op}: the sim bug op-fails made it fail"))),
                SimBugKind::EnvError => return Err(TargetError::Environment(format!("{op}: the sim bug env-error"))),
                SimBugKind::LoseWrite
                | SimBugKind::StaleRead
                | SimBugKind::StaleMember
                | SimBugKind::SlowConverge
                | SimBugKind::NeverConverge
                | SimBugKind::DeadEndpoint
                | SimBugKind::LateLeaderless
                | SimBugKind::Unobserved
                | SimBugKind::Unsupported
                | SimBugKind::Quiet
                | SimBugKind::SlowObservation => {}
                SimBugKind::SlowOp => tokio::time::sleep(SLOW_OP).await,
            }
        }
        match *op {
            Op::Backup => {
                let b = after.backups.last().copied().ok_or_else(|| TargetError::Stack("the model took no backup".into()))?;
                self.backups.insert(b, self.store.clone());
                let at = self.acked.len();
                self.marks.backup_taken(b, at, at);
            }
            Op::Restore { backup } => {
                let store = self.backups.get(&backup).cloned().ok_or_else(|| TargetError::Stack(format!("no backup {backup}")))?;
                self.marks.restore_begins(backup, self.acked.len());
                self.store = store;
                self.requests.epoch += 1;
                self.marks.restore_ends(self.acked.len());
            }
            Op::Crash { .. }
            | Op::Restart { .. }
            | Op::Pause { .. }
            | Op::Resume { .. }
            | Op::RollingUpgrade { .. }
            | Op::RollingReplace
            | Op::SiteOutage { .. }
            | Op::SiteRecover { .. }
            | Op::DiskDetach { .. }
            | Op::DiskReattach { .. }
            | Op::DiskReplace { .. }
            | Op::Defrag { .. }
            | Op::PartitionUntilSnapshot { .. }
            | Op::Failpoint { .. } => {}
            Op::PodKill { .. }
            | Op::OperatorRestart
            | Op::PvcLoss { .. }
            | Op::Partition { .. }
            | Op::PartitionHeal { .. }
            | Op::PodKillSelected { .. }
            | Op::NodeDrain { .. }
            | Op::PodFailure { .. }
            | Op::Switchover { .. }
            | Op::Taint { .. }
            | Op::RestorePitr { .. }
            | Op::PartitionGroups { .. }
            | Op::PartitionGroupsHeal { .. } => return Err(TargetError::Unsupported(format!("{op} is an application op (--target app)"))),
        }
        if self.model.service_expected_up() && !firing.contains(&SimBugKind::Quiet) {
            for _ in 0..WRITES_PER_STEP {
                self.write();
            }
        }
        for bug in firing {
            match bug {
                // The store loses the last acknowledged write (as if it were never applied).
                SimBugKind::LoseWrite => {
                    if let Some(last) = self.acked.last() {
                        self.store.kv.remove(&last.key);
                        self.store.mods.remove(&last.key);
                    }
                }
                SimBugKind::StaleRead => {
                    // The last write's key, and what the write before it left there.
                    if let Some(last) = self.acked.last() {
                        let before = self.acked.iter().rev().skip(1).find(|a| a.key == last.key);
                        self.stale_read = Some((last.key.clone(), before.map(|a| (a.value.clone().unwrap_or_default(), a.revision))));
                    }
                }
                SimBugKind::StaleMember => self.stale = self.answering_member().map(|m| (m, self.store.revision)),
                SimBugKind::SlowConverge => self.slow = self.answering_member(),
                SimBugKind::SlowObservation => self.slow_observation = self.answering_member(),
                SimBugKind::NeverConverge => self.deaf = self.answering_member(),
                SimBugKind::Unobserved => self.blind = true,
                SimBugKind::DeadEndpoint => self.dead_endpoint = true,
                SimBugKind::LateLeaderless => self.leaderless = true,
                SimBugKind::Panic
                | SimBugKind::OpFails
                | SimBugKind::EnvError
                | SimBugKind::Unsupported
                | SimBugKind::Quiet
                | SimBugKind::SlowOp => {}
            }
        }
        Ok(())
    }

    async fn end_step(&mut self) {}

    async fn observe(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        self.observed += 1;
        let wants = |id| invariants.contains(&id);
        let up = model.service_expected_up();
        let leader = model.members.values().find(|m| model.answers(m) == Answers::Yes).map(|m| Self::etcd_id(m.id));
        let leader = leader.filter(|_| !(self.leaderless && self.observed > SLOW_OBSERVATIONS));
        let hash = Self::hash(&self.store.kv);
        let rev = self.store.revision;
        let members = model
            .members
            .values()
            .map(|m| {
                let slow = (self.slow == Some(m.id) && self.observed <= SLOW_OBSERVATIONS)
                    || (self.slow_observation == Some(m.id) && self.observed == 1);
                let reachable = model.answers(m) == Answers::Yes && !slow && self.deaf != Some(m.id);
                let mut s = MemberStatus::without_status(m.id.to_string(), Some(m.id));
                if !reachable {
                    s.error = Some(if slow || self.deaf == Some(m.id) { "sim: not answering yet".into() } else { "sim: down".into() });
                    return s;
                }
                // A stale member reports the raft index of the others with the store of before.
                let stale = self.stale.filter(|(id, _)| *id == m.id).map(|(_, r)| r - WRITES_PER_STEP as i64);
                let revision = stale.unwrap_or(rev);
                MemberStatus {
                    reachable: true,
                    leader: leader.filter(|_| model.quorum_expected()).map(Leader::Id),
                    etcd_id: Some(Self::etcd_id(m.id)),
                    revision,
                    raft_index: rev as u64 + 10,
                    applied_index: rev as u64 + 10,
                    revision_after: Some(revision),
                    settled: Some((revision, rev as u64 + 10)),
                    version: Some(m.version.to_string()),
                    hash: Some((revision, if stale.is_some() { hash ^ 1 } else { hash })),
                    ..s
                }
            })
            .collect();
        let member_list = model.quorum_expected().then(|| {
            model
                .members
                .keys()
                .map(|&id| ListedMember { id: Some(Self::etcd_id(id)), name: id.to_string(), peer_urls: vec![format!("sim://{id}")] })
                .collect()
        });
        let error = self.dead_endpoint.then(|| "sim: the endpoint refuses every read".to_string());
        let probes = if wants(InvariantId::Reachability) && up { vec![Probe { latency_ms: 0, error }; 3] } else { vec![] };
        let durability = (wants(InvariantId::Durability) && up && !self.blind).then(|| Durability {
            acked: self.acked.clone().into(),
            unknown: vec![],
            marks: self.marks.clone(),
            read: self.store.kv.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            read_revision: rev,
            read_error: None,
            list_anomalies: vec![],
            refused_write_txns: vec![],
            unanswered_compacted_txns: vec![],
            read_sent_at: Some(self.acked.len()),
        });
        // While the service is up the workload reads every key back: into the history, one get
        // per key. The history is observed either way (it holds the writes).
        if up && !self.blind {
            for k in 0..KEYS {
                let key = format!("k{k}");
                let mut kv = self.store.kv.get(&key).map(|v| (v.clone(), self.store.mods.get(&key).copied().unwrap_or(0)));
                if let Some((stale, before)) = &self.stale_read {
                    if *stale == key {
                        kv = before.clone();
                    }
                }
                let kv = kv.map(|(value, mod_revision)| HistoryKv { value, mod_revision, create_revision: None, version: None });
                self.requests.push(Request::Get { key, serializable: false, answer: Some(ReadAnswer { revision: rev, kv }) });
            }
        }
        let history = wants(InvariantId::Linearizability).then(|| self.requests.view());
        if self.slow_observation.is_some() && self.observed == 1 {
            tokio::time::sleep(SLOW_OBSERVATION).await;
        }
        Observation { members, member_list, probes, durability, history, quorum_throughout: true, ..Default::default() }
    }

    fn log_files(&self) -> Vec<(String, PathBuf)> {
        vec![]
    }

    fn workload_stats(&self) -> serde_json::Value {
        json!({"acked": self.acked.len(), "revision": self.store.revision})
    }

    /// Nothing to tear down: the stack is this value.
    async fn teardown(&mut self) {
        let h = shakedown_history::History {
            model: shakedown_history::ModelKind::Etcd,
            ops: self.requests.log.snapshot().iter().cloned().collect(),
        };
        let path = self.run_dir.join("history.jsonl");
        if let Err(e) = std::fs::write(&path, h.to_jsonl()) {
            tracing::warn!("cannot write the history to {}: {e}", path.display());
        }
    }
}
