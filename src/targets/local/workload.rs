//! The workload: a client that keeps writing unique keys through the endpoint for the whole run
//! and records which writes etcd acknowledged.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use shakedown_invariants::Acked;

use super::etcd::{bounded, connect};

/// Pause before reconnecting after the endpoint could not be reached.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);
/// The planted write-behind bug's delay between acknowledging a write and sending it.
const WRITE_BEHIND_DELAY: Duration = Duration::from_millis(100);
/// How long stopping waits for the write in flight.
const STOP_BOUND: Duration = Duration::from_secs(3);

#[derive(Debug, Default)]
pub struct Stats {
    pub attempted: AtomicU64,
    pub acked: AtomicU64,
    pub failed: AtomicU64,
}

/// A snapshot of the workload's counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StatsSnapshot {
    pub attempted: u64,
    pub acked: u64,
    pub failed: u64,
}

/// The acknowledged writes: sealed chunks (shared with the snapshots checks take) and the open one.
#[derive(Default)]
struct AckLog {
    sealed: Vec<Arc<Vec<(String, String)>>>,
    open: Vec<(String, String)>,
    len: usize,
}

impl AckLog {
    fn push(&mut self, w: (String, String)) {
        self.open.push(w);
        self.len += 1;
        if self.open.len() == Acked::CHUNK {
            self.sealed.push(Arc::new(std::mem::take(&mut self.open)));
        }
    }
}

pub struct Workload {
    pub prefix: String,
    acked: Arc<Mutex<AckLog>>,
    stats: Arc<Stats>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Workload {
    /// Starts writing `<prefix><seq>` keys to `endpoint` every `interval`.
    /// With `ack_before_write` (a planted bug) a write counts as acknowledged when it is queued,
    /// 100 ms before it is sent to etcd.
    ///
    /// Every write's outcome is appended to `samples` (CSV: unix ms at the start of the write,
    /// latency µs, 1 = acknowledged / 0 = failed), streamed so memory stays flat.
    pub fn start(endpoint: String, prefix: String, interval: Duration, write_timeout: Duration, ack_before_write: bool, samples: Option<&Path>) -> Workload {
        let mut sink = samples.and_then(|p| match File::create(p) {
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
        let acked = Arc::new(Mutex::new(AckLog::default()));
        let stats = Arc::new(Stats::default());
        let (stop, mut stopped) = watch::channel(false);
        let (a, s, p) = (acked.clone(), stats.clone(), prefix.clone());
        let task = tokio::spawn(async move {
            let mut client: Option<Client> = None;
            for seq in 0u64.. {
                if *stopped.borrow() {
                    break;
                }
                if seq % 200 == 0 {
                    if let Some(w) = sink.as_mut() {
                        let _ = w.flush();
                    }
                }
                let key = format!("{p}{seq:010}");
                let value = format!("v{seq}");
                s.attempted.fetch_add(1, Ordering::Relaxed);
                if client.is_none() {
                    client = connect(&endpoint, write_timeout).await.ok();
                }
                let Some(c) = client.as_mut() else {
                    s.failed.fetch_add(1, Ordering::Relaxed);
                    tokio::select! { _ = tokio::time::sleep(RECONNECT_PAUSE) => {}, _ = stopped.changed() => {} }
                    continue;
                };
                if ack_before_write {
                    // Planted bug: write-behind. The write is acknowledged when queued and only
                    // reaches etcd 100 ms later, whatever happens in between.
                    a.lock().expect("acked lock").push((key.clone(), value.clone()));
                    s.acked.fetch_add(1, Ordering::Relaxed);
                    let mut c = c.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(WRITE_BEHIND_DELAY).await;
                        let _ = bounded("put", write_timeout, c.put(key.as_str(), value.as_str(), None)).await;
                    });
                    tokio::select! { _ = tokio::time::sleep(interval) => {}, _ = stopped.changed() => {} }
                    continue;
                }
                let (at, t) = (unix_ms(), std::time::Instant::now());
                let res = bounded("put", write_timeout, c.put(key.as_str(), value.as_str(), None)).await;
                if let Some(w) = sink.as_mut() {
                    let _ = writeln!(w, "{at},{},{}", t.elapsed().as_micros(), u8::from(res.is_ok()));
                }
                match res {
                    Ok(_) => {
                        a.lock().expect("acked lock").push((key, value));
                        s.acked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::trace!("workload write {seq} failed: {e}");
                        s.failed.fetch_add(1, Ordering::Relaxed);
                        // A fresh connection lets the endpoint route around a dead member.
                        client = None;
                    }
                }
                tokio::select! { _ = tokio::time::sleep(interval) => {}, _ = stopped.changed() => {} }
            }
            if let Some(w) = sink.as_mut() {
                let _ = w.flush();
            }
        });
        Workload { prefix, acked, stats, stop, task: Some(task) }
    }

    /// Every acknowledged write so far, in order.
    pub fn acked(&self) -> Acked {
        let log = self.acked.lock().expect("acked lock");
        Acked::from_chunks(&log.sealed, &log.open)
    }

    /// How many writes have been acknowledged so far (a position in `acked()`).
    pub fn acked_len(&self) -> usize {
        self.acked.lock().expect("acked lock").len
    }

    pub fn stats(&self) -> StatsSnapshot {
        StatsSnapshot {
            attempted: self.stats.attempted.load(Ordering::Relaxed),
            acked: self.stats.acked.load(Ordering::Relaxed),
            failed: self.stats.failed.load(Ordering::Relaxed),
        }
    }

    /// Stops writing; waits (bounded) for the write in flight.
    pub async fn stop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let abort = t.abort_handle();
            if tokio::time::timeout(STOP_BOUND, t).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
