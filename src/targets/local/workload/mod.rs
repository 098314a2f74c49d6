//! The workload: clients that load the stack through the endpoint for the whole run and record
//! what etcd acknowledged, for the invariants to judge.
//!
//! - [`kube`] (the default): the shape of kube-apiserver's storage traffic — concurrent clients
//!   creating, updating and deleting shared keys with transactions guarded by a `ModRevision`
//!   compare (conflicts retried with the revision the `Else` branch returned), keys attached to
//!   reused leases that are revoked or left to expire, paginated reads at a pinned revision, and
//!   long-lived watches ([`watch`]) resumed from their last revision + 1.
//! - [`kv`]: etcd's whole key-value API on the same keys — plain puts, gets and deletes, ranges
//!   of every kind, delete-ranges, multi-key transactions — beside everything `kube` sends.
//! - [`puts`]: one client writing unique keys with plain puts (the original workload).
//!
//! Both write into one [`Recorder`] (`targets/recorder.rs`, shared with the Kubernetes API
//! workload): acknowledged writes with the revision etcd gave them, writes
//! whose outcome is unknown, leases, watch sessions and anomalies of paginated reads.

mod kube;
mod kv;
mod puts;
mod watch;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shakedown_faults::{Workload as Config, WorkloadKind};
use shakedown_invariants::{Acked, LeaseRecord, Unknown, WatchSession};

pub(crate) use crate::targets::recorder::{pause, unix_ms, Clients, Recorder, Rng, StatsSnapshot, WatchState};

/// Pause before reconnecting after the endpoint could not be reached.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);
/// The planted write-behind bug's delay between acknowledging a write and sending it.
const WRITE_BEHIND_DELAY: Duration = Duration::from_millis(100);
/// How long stopping waits for the requests in flight.
const STOP_BOUND: Duration = Duration::from_secs(3);
/// An etcd member id as the history names it until the member list gives its name.
pub(super) fn member_hex(id: u64) -> String {
    format!("{id:x}")
}

/// The most lease records kept (the newest): older leases expired long ago.
const MAX_LEASE_RECORDS: usize = 256;

/// Planted bugs that live in the workload's client code (see `bugs.rs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientBugs {
    /// Acknowledge a write when it is queued, send it 100 ms later.
    pub ack_before_write: bool,
    /// Count a transaction whose compare failed as a successful write.
    pub ignore_conflict: bool,
    /// Resume a broken watch from the current revision instead of the last one + 1.
    pub resume_from_now: bool,
    /// Put the lease client's keys without attaching the lease.
    pub lease_keys_unattached: bool,
    /// Send the lists to a member of the client's own as serializable reads.
    pub serializable_reads: bool,
}

pub struct Workload {
    /// The keys of this run (`/shakedown/<run>/w/`).
    pub prefix: String,
    kind: WorkloadKind,
    /// How many long-lived watches run (0 for `puts`).
    watchers: u32,
    rec: Arc<Recorder>,
    clients: Clients,
}

impl Workload {
    /// Starts the workload of `cfg` against `endpoint`, writing under `prefix`; watchers prefer
    /// the `members`' own URLs. Every request's outcome is appended to `samples`, streamed so
    /// memory stays flat.
    pub fn start(endpoint: String, members: &[String], prefix: String, cfg: &Config, bugs: ClientBugs, samples: Option<&Path>) -> Workload {
        let rec = Arc::new(Recorder::new(samples));
        let (mut clients, stopped) = Clients::new();
        match cfg.kind {
            WorkloadKind::Puts => {
                clients.spawn(puts::run(endpoint, prefix.clone(), cfg.interval, cfg.timeout, bugs.ack_before_write, rec.clone(), stopped))
            }
            WorkloadKind::Kube | WorkloadKind::Kv => {
                let s = kube::Start { endpoint: &endpoint, members, prefix: &prefix, cfg, bugs, rec: &rec, stopped: &stopped };
                clients.extend(if cfg.kind == WorkloadKind::Kv { kv::start(&s) } else { kube::start(&s) })
            }
        };
        let watchers = match cfg.kind {
            WorkloadKind::Puts => 0,
            WorkloadKind::Kube | WorkloadKind::Kv => cfg.watches,
        };
        Workload { prefix, kind: cfg.kind, watchers, rec, clients }
    }

    /// How many long-lived watches this workload runs.
    pub fn watchers(&self) -> u32 {
        self.watchers
    }

    /// The keys whose values `durability` reads back.
    pub fn object_prefix(&self) -> String {
        match self.kind {
            WorkloadKind::Puts => self.prefix.clone(),
            WorkloadKind::Kube | WorkloadKind::Kv => kube::object_prefix(&self.prefix),
        }
    }

    /// The lease-attached keys (`None`: this workload has no leases).
    pub fn lease_prefix(&self) -> Option<String> {
        (self.kind != WorkloadKind::Puts).then(|| kube::lease_prefix(&self.prefix))
    }

    /// Every acknowledged write so far, in order, and the writes whose outcome is unknown
    /// (failed without an answer, or still in flight) — one consistent snapshot.
    pub fn history(&self) -> (Acked, Vec<Unknown>) {
        self.rec.history()
    }

    /// Every request the clients sent and what it got: the run's history (`history.jsonl`).
    pub fn requests(&self) -> shakedown_history::History {
        self.rec.requests.history()
    }

    /// The history as a check sees it (`linearizability`), judged incrementally.
    pub fn requests_view(&self) -> shakedown_invariants::HistoryView {
        self.rec.requests.view()
    }

    /// Member ids (hexadecimal, as answers' headers give them) and the members' names.
    pub fn name_members(&self, names: &std::collections::HashMap<String, String>) {
        self.rec.requests.name_members(names);
    }

    /// The old store is gone and a restored one is about to serve: a new epoch of the history.
    pub fn store_replaced(&self) {
        self.rec.requests.new_epoch();
    }

    /// What paginated reads found wrong.
    pub fn list_anomalies(&self) -> Vec<String> {
        self.rec.anomalies()
    }

    /// The transactions with writes a member refused for a range at a compacted (or future)
    /// revision, in words (etcd-io/etcd#18667).
    pub fn refused_write_txns(&self) -> Vec<String> {
        self.rec.refused_txns.lock().expect("refused transactions lock").clone()
    }

    /// The transactions with writes and a range at an older revision that got no answer, whose
    /// revision a compaction has since been asked to pass: the member that received one may have
    /// refused it on apply while the others applied its writes (etcd-io/etcd#18667).
    pub fn unanswered_compacted_txns(&self) -> Vec<String> {
        let floor = self.rec.compaction_floor.load(std::sync::atomic::Ordering::SeqCst);
        let txns = self.rec.unanswered_txns.lock().expect("unanswered transactions lock");
        txns.iter().filter(|(at, _)| *at < floor).map(|(_, t)| t.clone()).collect()
    }

    /// How many writes have been acknowledged so far (a position in `acked()`).
    pub fn acked_len(&self) -> usize {
        self.rec.position()
    }

    /// The leases granted since the last restore.
    pub fn leases(&self) -> Vec<LeaseRecord> {
        self.rec.leases.lock().expect("leases lock").clone()
    }

    /// Milliseconds since the workload started (the leases' clock).
    pub fn now_ms(&self) -> u64 {
        self.rec.now_ms()
    }

    /// Held by whoever asks for a compaction, from choosing its revision to the answer: the
    /// `kv` workload's transactions with a range at an older revision wait meanwhile (see
    /// `Recorder::compaction_gate`).
    pub async fn compaction_gate(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.rec.compaction_gate.write().await
    }

    /// A compaction to `revision` is about to be asked for by an op (see
    /// [`Recorder::compaction_requested`]).
    pub fn compaction_requested(&self, revision: i64) {
        self.rec.compaction_requested(revision);
    }

    /// Every watcher's current session.
    pub fn watch_sessions(&self) -> Vec<WatchSession> {
        self.rec.watch_sessions()
    }

    /// The stack is being (or has been) restored from a backup: revisions start again from the
    /// backup's, another lease table is back. Watches start new sessions; leases granted so far
    /// are no longer judged.
    ///
    /// With `keep_watches` (the planted bug restore-keeps-watches) the watches are not told: they
    /// resume from their last revision + 1, which the restored store reaches again only after
    /// reusing revisions they have already seen.
    pub fn restored(&self, keep_watches: bool) {
        self.rec.leases.lock().expect("leases lock").clear();
        if keep_watches {
            return;
        }
        // Sessions end now, not when each watcher notices.
        self.rec.end_watch_sessions();
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.rec.stats()
    }

    /// Stops every client; waits (bounded) for the requests in flight.
    pub async fn stop(&mut self) {
        self.clients.stop(STOP_BOUND).await;
        self.rec.flush();
    }
}
