//! What a workload's clients acknowledged: the history every workload writes into (the local
//! stack's etcd clients, the Kubernetes API clients) and the checks read in consistent
//! snapshots — acknowledged writes with their revisions, writes in flight and of unknown
//! outcome, watch sessions, leases, anomalies — plus the per-request samples file.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::samples::Samples;

use shakedown_invariants::{Ack, Acked, ChunkedLog, LeaseRecord, Unknown, WatchSession};
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

/// The most anomalies kept (one is enough to fail; a few help).
const MAX_ANOMALIES: usize = 16;

#[derive(Debug, Default)]
pub struct Stats {
    pub attempted: AtomicU64,
    pub acked: AtomicU64,
    pub failed: AtomicU64,
    /// Transactions refused by their compare (another client wrote the key first).
    pub conflicts: AtomicU64,
    pub lease_puts: AtomicU64,
    /// Lease keep-alives sent (the `kv` workload's; whether etcd renewed the lease is the lease
    /// record's `kept_alive_at_ms`).
    pub keep_alives: AtomicU64,
    pub lists: AtomicU64,
    pub watch_events: AtomicU64,
    pub watch_resumptions: AtomicU64,
    /// Progress notifications the watches received (each one a promise the check holds them to).
    pub watch_progress: AtomicU64,
    /// Watches that were told their resourceVersion is too old and relisted (the API workload).
    pub relists: AtomicU64,
    /// Compactions the compactor had acknowledged.
    pub compactions: AtomicU64,
    /// Watch resumptions etcd answered with "compacted" (the events below it are gone,
    /// declared).
    pub watch_compacted: AtomicU64,
    /// Requests of the `kv` workload's own kinds (plain puts, gets and deletes, ranges,
    /// delete-ranges, multi-key transactions).
    pub kv_requests: AtomicU64,
    /// Requests the `kv` workload's clients drew, of every kind (its own and `kube`'s guarded
    /// writes, lease requests and lists; a lease put or a paginated list counts once, though it
    /// is several requests to etcd).
    pub kv_draws: AtomicU64,
    /// Reads at an older revision etcd refused as compacted (or not reached yet), declared.
    pub compacted_reads: AtomicU64,
}

/// A snapshot of the workload's counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StatsSnapshot {
    pub attempted: u64,
    pub acked: u64,
    pub failed: u64,
    pub conflicts: u64,
    pub lease_puts: u64,
    pub keep_alives: u64,
    pub lists: u64,
    pub watch_events: u64,
    pub watch_resumptions: u64,
    pub watch_progress: u64,
    pub relists: u64,
    pub compactions: u64,
    pub watch_compacted: u64,
    pub kv_requests: u64,
    pub kv_draws: u64,
    pub compacted_reads: u64,
}

/// One watcher's current session, written by its task.
#[derive(Default)]
pub(crate) struct WatchState {
    pub(crate) session: WatchSession,
    pub(crate) log: ChunkedLog<shakedown_invariants::WatchEvent>,
}

/// The writes: acknowledged, of unknown outcome, and in flight (by ticket).
#[derive(Default)]
pub(crate) struct Writes {
    pub(crate) acks: ChunkedLog<Ack>,
    pub(crate) unknown: Vec<Unknown>,
    pub(crate) in_flight: HashMap<u64, Unknown>,
    pub(crate) next_ticket: u64,
}

/// Ended watch sessions kept for the checks (see [`Recorder::ended_watches`]).
pub(crate) const ENDED_WATCH_SESSIONS: usize = 12;

/// Everything the clients record, shared with the checks.
pub struct Recorder {
    pub(crate) t0: Instant,
    /// One lock over every write's state, so a snapshot never sees a write between two of
    /// them (answered but not yet acknowledged, or neither in flight nor failed).
    pub(crate) writes: Mutex<Writes>,
    pub(crate) anomalies: Mutex<Vec<String>>,
    /// Transactions with writes refused for a range at a compacted or future revision.
    pub(crate) refused_txns: Mutex<Vec<String>>,
    /// Transactions with writes and a range at an older revision that got no answer: each with
    /// that revision. Once a compaction passes it, the member that received one may have
    /// refused it on apply while the others applied its writes (etcd-io/etcd#18667).
    pub(crate) unanswered_txns: Mutex<Vec<(i64, String)>>,
    /// The highest revision a compaction has been asked for since the workload started.
    pub(crate) compaction_floor: std::sync::atomic::AtomicI64,
    /// Every revision a compaction has been asked for (a new watch session starts with them).
    pub(crate) compactions: Mutex<Vec<i64>>,
    /// Held (shared) by a transaction with writes and a range at an older revision while it is
    /// drawn and sent, and (exclusive) by the compactor while a compaction is asked for: the
    /// range is never below a compaction racing it (etcd-io/etcd#18667 would make the members
    /// diverge).
    pub(crate) compaction_gate: tokio::sync::RwLock<()>,
    pub(crate) leases: Mutex<Vec<LeaseRecord>>,
    pub(crate) watches: Mutex<Vec<WatchState>>,
    /// The last sessions of watchers that start new ones on their own (the `kv` workload's),
    /// still judged after they ended: the newest [`ENDED_WATCH_SESSIONS`].
    pub(crate) ended_watches: Mutex<std::collections::VecDeque<WatchSession>>,
    pub(crate) sink: Samples,
    pub(crate) stats: Stats,
    /// Bumped when the stack is restored: watches start new sessions, leases are forgotten.
    pub(crate) generation: signal::Sender<u64>,
    /// Every request of the clients that record theirs, with its answer: the history.
    pub(crate) requests: crate::targets::requests::Requests,
}

impl Recorder {
    pub(crate) fn new(samples: Option<&Path>) -> Recorder {
        let sink = Samples::create(samples);
        let t0 = Instant::now();
        Recorder {
            t0,
            requests: crate::targets::requests::Requests::new(t0, shakedown_history::ModelKind::Etcd),
            writes: Mutex::default(),
            anomalies: Mutex::default(),
            refused_txns: Mutex::default(),
            unanswered_txns: Mutex::default(),
            compaction_floor: std::sync::atomic::AtomicI64::new(0),
            compactions: Mutex::default(),
            compaction_gate: tokio::sync::RwLock::new(()),
            leases: Mutex::default(),
            watches: Mutex::default(),
            ended_watches: Mutex::default(),
            sink,
            stats: Stats::default(),
            generation: signal::channel(0).0,
        }
    }

    /// How many writes have been acknowledged: the position of a write sent now.
    pub fn position(&self) -> usize {
        self.writes.lock().expect("writes lock").acks.len()
    }

    /// A write is about to be sent: until it is answered, a read may reflect it.
    pub(crate) fn send(&self, w: Unknown) -> u64 {
        let mut s = self.writes.lock().expect("writes lock");
        s.next_ticket += 1;
        let ticket = s.next_ticket;
        s.in_flight.insert(ticket, w);
        ticket
    }

    /// The write of `ticket` was acknowledged as `a` (or refused, `None`).
    pub(crate) fn answered(&self, ticket: u64, a: Option<Ack>) {
        let mut s = self.writes.lock().expect("writes lock");
        s.in_flight.remove(&ticket);
        if let Some(a) = a {
            s.acks.push(a);
            self.stats.acked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The write of `ticket` got no answer: its outcome is unknown for the rest of the run.
    pub(crate) fn failed(&self, ticket: u64) {
        let mut s = self.writes.lock().expect("writes lock");
        if let Some(u) = s.in_flight.remove(&ticket) {
            s.unknown.push(u);
        }
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Acknowledged without being sent (the planted write-behind bug).
    pub(crate) fn ack_unsent(&self, a: Ack) {
        self.writes.lock().expect("writes lock").acks.push(a);
        self.stats.acked.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn anomaly(&self, text: String) {
        let mut a = self.anomalies.lock().expect("anomalies lock");
        if a.len() < MAX_ANOMALIES {
            tracing::warn!("workload: {text}");
            a.push(text);
        }
    }

    /// Milliseconds since the workload started.
    pub fn now_ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// Appends one request's outcome to the samples file (CSV: unix ms at its start, latency µs,
    /// 1 = acknowledged / 0 = failed).
    pub(crate) fn sample(&self, started_unix_ms: u64, latency: Duration, ok: bool) {
        self.sink.sample(started_unix_ms, latency, ok);
    }

    pub(crate) fn flush(&self) {
        self.sink.flush();
    }

    pub(crate) fn generation(&self) -> signal::Receiver<u64> {
        self.generation.subscribe()
    }
}

impl Recorder {
    /// Every acknowledged write so far, in order, and the writes whose outcome is unknown
    /// (failed without an answer, or still in flight) — one consistent snapshot.
    pub fn history(&self) -> (Acked, Vec<Unknown>) {
        let s = self.writes.lock().expect("writes lock");
        let mut unknown = s.unknown.clone();
        unknown.extend(s.in_flight.values().cloned());
        (s.acks.snapshot(), unknown)
    }

    /// What the clients found wrong on their own (paginated reads, API answers).
    pub fn anomalies(&self) -> Vec<String> {
        self.anomalies.lock().expect("anomalies lock").clone()
    }

    /// Every watcher's current session (those that have started one), and the last sessions
    /// that ended on their own.
    pub fn watch_sessions(&self) -> Vec<WatchSession> {
        let ended: Vec<WatchSession> = self.ended_watches.lock().expect("ended watches lock").iter().cloned().collect();
        let w = self.watches.lock().expect("watches lock");
        ended
            .into_iter()
            .chain(
                w.iter().filter(|s| s.session.start_revision > 0).map(|s| WatchSession { events: s.log.snapshot(), ..s.session.clone() }),
            )
            .map(|mut session| {
                for stream in &mut session.streams {
                    stream.member = self.requests.member_name(&stream.member);
                }
                session
            })
            .collect()
    }

    /// Watcher `slot`'s session ends on its own (the watcher starts another): it is kept for
    /// the checks among the last [`ENDED_WATCH_SESSIONS`].
    pub(crate) fn end_watch_session(&self, slot: usize) {
        let ended = {
            let mut w = self.watches.lock().expect("watches lock");
            let s = std::mem::take(&mut w[slot]);
            WatchSession { events: s.log.snapshot(), ..s.session }
        };
        if ended.start_revision == 0 {
            return;
        }
        let mut e = self.ended_watches.lock().expect("ended watches lock");
        if e.len() == ENDED_WATCH_SESSIONS {
            e.pop_front();
        }
        e.push_back(ended);
    }

    /// A compaction to `revision` is about to be asked for (by the workload's compactor, or an
    /// op): every watch session notes it before it is sent, since one without an answer may
    /// still apply, so that an event whose `prev_kv` it removed is named as etcd-io/etcd#10681,
    /// not taken for a key that did not exist.
    pub fn compaction_requested(&self, revision: i64) {
        self.compaction_floor.fetch_max(revision, Ordering::SeqCst);
        self.compactions.lock().expect("compactions lock").push(revision);
        for w in self.watches.lock().expect("watches lock").iter_mut() {
            w.session.compactions.push(revision);
        }
    }

    /// Ends every watch session now (a restore brings back another numbering): a check right
    /// after must not judge a session that straddles two; each watcher starts a new one.
    pub fn end_watch_sessions(&self) {
        for w in self.watches.lock().expect("watches lock").iter_mut() {
            *w = WatchState::default();
        }
        // Ended before the restore: what they were promised is the old store's; so were the
        // compactions (the restored store's revisions start again from the backup's).
        self.ended_watches.lock().expect("ended watches lock").clear();
        self.compactions.lock().expect("compactions lock").clear();
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            attempted: l(&s.attempted),
            acked: l(&s.acked),
            failed: l(&s.failed),
            conflicts: l(&s.conflicts),
            lease_puts: l(&s.lease_puts),
            keep_alives: l(&s.keep_alives),
            lists: l(&s.lists),
            watch_events: l(&s.watch_events),
            watch_resumptions: l(&s.watch_resumptions),
            watch_progress: l(&s.watch_progress),
            relists: l(&s.relists),
            compactions: l(&s.compactions),
            watch_compacted: l(&s.watch_compacted),
            kv_requests: l(&s.kv_requests),
            kv_draws: l(&s.kv_draws),
            compacted_reads: l(&s.compacted_reads),
        }
    }
}

/// Sleeps `d`, or less when the workload is stopped.
pub(crate) async fn pause(d: Duration, stopped: &mut signal::Receiver<bool>) {
    if !d.is_zero() {
        tokio::select! { _ = tokio::time::sleep(d) => {}, _ = stopped.changed() => {} }
    }
}

pub(crate) use crate::clock::unix_ms;

/// A small fast generator for the clients' choices (not part of the seed: the load is not
/// replayed request by request, the plan is).
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub(crate) fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A workload's client tasks and the signal that stops them: stopped within a bound, aborted
/// when dropped.
pub struct Clients {
    stop: signal::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Clients {
    /// No tasks yet, and the receiver each task watches for the stop.
    pub fn new() -> (Clients, signal::Receiver<bool>) {
        let (stop, stopped) = signal::channel(false);
        (Clients { stop, tasks: vec![] }, stopped)
    }

    pub fn spawn(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.push(tokio::spawn(task));
    }

    pub fn extend(&mut self, tasks: Vec<JoinHandle<()>>) {
        self.tasks.extend(tasks);
    }

    /// Stops every task; waits until `bound` for the requests in flight, then aborts the rest.
    pub async fn stop(&mut self, bound: Duration) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + bound;
        for t in self.tasks.drain(..) {
            let abort = t.abort_handle();
            if tokio::time::timeout_at(deadline, t).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
