//! The workload: clients that load the stack through the endpoint for the whole run and record
//! what etcd acknowledged, for the invariants to judge.
//!
//! - [`kube`] (the default): the shape of kube-apiserver's storage traffic — concurrent clients
//!   creating, updating and deleting shared keys with transactions guarded by a `ModRevision`
//!   compare (conflicts retried with the revision the `Else` branch returned), keys attached to
//!   reused leases that are revoked or left to expire, paginated reads at a pinned revision, and
//!   long-lived watches ([`watch`]) resumed from their last revision + 1.
//! - [`puts`]: one client writing unique keys with plain puts (the original workload).
//!
//! Both write into one [`Recorder`]: acknowledged writes with the revision etcd gave them, writes
//! whose outcome is unknown, leases, watch sessions and anomalies of paginated reads.

mod kube;
mod puts;
mod watch;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shakedown_faults::{Workload as Config, WorkloadKind};
use shakedown_invariants::{Ack, Acked, ChunkedLog, LeaseRecord, Unknown, WatchSession};
use tokio::sync::watch as signal;
use tokio::task::JoinHandle;

/// Pause before reconnecting after the endpoint could not be reached.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);
/// The planted write-behind bug's delay between acknowledging a write and sending it.
const WRITE_BEHIND_DELAY: Duration = Duration::from_millis(100);
/// How long stopping waits for the requests in flight.
const STOP_BOUND: Duration = Duration::from_secs(3);
/// The most lease records kept (the newest): older leases expired long ago.
const MAX_LEASE_RECORDS: usize = 256;
/// The most paginated-read anomalies kept (one is enough to fail; a few help).
const MAX_ANOMALIES: usize = 16;

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
}

#[derive(Debug, Default)]
pub struct Stats {
    pub attempted: AtomicU64,
    pub acked: AtomicU64,
    pub failed: AtomicU64,
    /// Transactions refused by their compare (another client wrote the key first).
    pub conflicts: AtomicU64,
    pub lease_puts: AtomicU64,
    pub lists: AtomicU64,
    pub watch_events: AtomicU64,
    pub watch_resumptions: AtomicU64,
}

/// A snapshot of the workload's counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StatsSnapshot {
    pub attempted: u64,
    pub acked: u64,
    pub failed: u64,
    pub conflicts: u64,
    pub lease_puts: u64,
    pub lists: u64,
    pub watch_events: u64,
    pub watch_resumptions: u64,
}

/// One watcher's current session, written by its task.
#[derive(Default)]
struct WatchState {
    session: WatchSession,
    log: ChunkedLog<shakedown_invariants::WatchEvent>,
}

/// The writes: acknowledged, of unknown outcome, and in flight (by ticket).
#[derive(Default)]
struct Writes {
    acks: ChunkedLog<Ack>,
    unknown: Vec<Unknown>,
    in_flight: HashMap<u64, Unknown>,
    next_ticket: u64,
}

/// Everything the clients record, shared with the checks.
pub struct Recorder {
    t0: Instant,
    /// One lock over every write's state, so a snapshot never sees a write between two of
    /// them (answered but not yet acknowledged, or neither in flight nor failed).
    writes: Mutex<Writes>,
    anomalies: Mutex<Vec<String>>,
    leases: Mutex<Vec<LeaseRecord>>,
    watches: Mutex<Vec<WatchState>>,
    sink: Mutex<Option<BufWriter<File>>>,
    stats: Stats,
    /// Bumped when the stack is restored: watches start new sessions, leases are forgotten.
    generation: signal::Sender<u64>,
}

impl Recorder {
    fn new(samples: Option<&Path>) -> Recorder {
        let sink = samples.and_then(|p| match File::create(p) {
            Ok(f) => {
                let mut w = BufWriter::new(f);
                let _ = w.write_all(b"unix_ms,latency_us,ok\n");
                Some(w)
            }
            Err(e) => {
                tracing::warn!("cannot write workload samples to {}: {e}; going on without them", p.display());
                None
            }
        });
        Recorder {
            t0: Instant::now(),
            writes: Mutex::default(),
            anomalies: Mutex::default(),
            leases: Mutex::default(),
            watches: Mutex::default(),
            sink: Mutex::new(sink),
            stats: Stats::default(),
            generation: signal::channel(0).0,
        }
    }

    /// How many writes have been acknowledged: the position of a write sent now.
    pub fn position(&self) -> usize {
        self.writes.lock().expect("writes lock").acks.len()
    }

    /// A write is about to be sent: until it is answered, a read may reflect it.
    fn send(&self, w: Unknown) -> u64 {
        let mut s = self.writes.lock().expect("writes lock");
        s.next_ticket += 1;
        let ticket = s.next_ticket;
        s.in_flight.insert(ticket, w);
        ticket
    }

    /// The write of `ticket` was acknowledged as `a` (or refused, `None`).
    fn answered(&self, ticket: u64, a: Option<Ack>) {
        let mut s = self.writes.lock().expect("writes lock");
        s.in_flight.remove(&ticket);
        if let Some(a) = a {
            s.acks.push(a);
            self.stats.acked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The write of `ticket` got no answer: its outcome is unknown for the rest of the run.
    fn failed(&self, ticket: u64) {
        let mut s = self.writes.lock().expect("writes lock");
        if let Some(u) = s.in_flight.remove(&ticket) {
            s.unknown.push(u);
        }
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Acknowledged without being sent (the planted write-behind bug).
    fn ack_unsent(&self, a: Ack) {
        self.writes.lock().expect("writes lock").acks.push(a);
        self.stats.acked.fetch_add(1, Ordering::Relaxed);
    }

    fn anomaly(&self, text: String) {
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
    fn sample(&self, started_unix_ms: u64, latency: Duration, ok: bool) {
        if let Some(w) = self.sink.lock().expect("sink lock").as_mut() {
            let _ = writeln!(w, "{started_unix_ms},{},{}", latency.as_micros(), u8::from(ok));
        }
    }

    fn flush(&self) {
        if let Some(w) = self.sink.lock().expect("sink lock").as_mut() {
            let _ = w.flush();
        }
    }

    fn generation(&self) -> signal::Receiver<u64> {
        self.generation.subscribe()
    }
}

pub struct Workload {
    /// The keys of this run (`/shakedown/<run>/w/`).
    pub prefix: String,
    kind: WorkloadKind,
    rec: Arc<Recorder>,
    stop: signal::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Workload {
    /// Starts the workload of `cfg` against `endpoint`, writing under `prefix`; watchers prefer
    /// the `members`' own URLs. Every request's outcome is appended to `samples`, streamed so
    /// memory stays flat.
    pub fn start(endpoint: String, members: &[String], prefix: String, cfg: &Config, bugs: ClientBugs, samples: Option<&Path>) -> Workload {
        let rec = Arc::new(Recorder::new(samples));
        let (stop, stopped) = signal::channel(false);
        let tasks = match cfg.kind {
            WorkloadKind::Puts => vec![tokio::spawn(puts::run(endpoint, prefix.clone(), cfg.interval, cfg.timeout, bugs.ack_before_write, rec.clone(), stopped))],
            WorkloadKind::Kube => kube::start(&endpoint, members, &prefix, cfg, bugs, &rec, &stopped),
        };
        Workload { prefix, kind: cfg.kind, rec, stop, tasks }
    }

    /// The keys whose values `durability` reads back.
    pub fn object_prefix(&self) -> String {
        match self.kind {
            WorkloadKind::Puts => self.prefix.clone(),
            WorkloadKind::Kube => kube::object_prefix(&self.prefix),
        }
    }

    /// The lease-attached keys (`None`: this workload has no leases).
    pub fn lease_prefix(&self) -> Option<String> {
        (self.kind == WorkloadKind::Kube).then(|| kube::lease_prefix(&self.prefix))
    }

    /// Every acknowledged write so far, in order, and the writes whose outcome is unknown
    /// (failed without an answer, or still in flight) — one consistent snapshot.
    pub fn history(&self) -> (Acked, Vec<Unknown>) {
        let s = self.rec.writes.lock().expect("writes lock");
        let mut unknown = s.unknown.clone();
        unknown.extend(s.in_flight.values().cloned());
        (s.acks.snapshot(), unknown)
    }

    /// What paginated reads found wrong.
    pub fn list_anomalies(&self) -> Vec<String> {
        self.rec.anomalies.lock().expect("anomalies lock").clone()
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

    /// Every watcher's current session.
    pub fn watch_sessions(&self) -> Vec<WatchSession> {
        let w = self.rec.watches.lock().expect("watches lock");
        w.iter().filter(|s| s.session.start_revision > 0).map(|s| WatchSession { events: s.log.snapshot(), ..s.session.clone() }).collect()
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
        // Sessions end now, not when each watcher notices: a check right after the restore
        // must not judge a session that straddles two numberings.
        for w in self.rec.watches.lock().expect("watches lock").iter_mut() {
            *w = WatchState::default();
        }
        self.rec.generation.send_modify(|g| *g += 1);
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.rec.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsSnapshot {
            attempted: l(&s.attempted),
            acked: l(&s.acked),
            failed: l(&s.failed),
            conflicts: l(&s.conflicts),
            lease_puts: l(&s.lease_puts),
            lists: l(&s.lists),
            watch_events: l(&s.watch_events),
            watch_resumptions: l(&s.watch_resumptions),
        }
    }

    /// Stops every client; waits (bounded) for the requests in flight.
    pub async fn stop(&mut self) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::Instant::now() + STOP_BOUND;
        for t in self.tasks.drain(..) {
            let abort = t.abort_handle();
            if tokio::time::timeout_at(deadline, t).await.is_err() {
                abort.abort();
            }
        }
        self.rec.flush();
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Sleeps `d`, or less when the workload is stopped.
async fn pause(d: Duration, stopped: &mut signal::Receiver<bool>) {
    if !d.is_zero() {
        tokio::select! { _ = tokio::time::sleep(d) => {}, _ = stopped.changed() => {} }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A small fast generator for the clients' choices (not part of the seed: the load is not
/// replayed request by request, the plan is).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
