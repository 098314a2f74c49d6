//! Long-lived watches of the object keys, the way an informer watches: `prev_kv`, progress
//! notifications requested every `watch_progress` of the profile (as kube-apiserver's watch
//! cache does before a consistent read), and after any error a resumption from the last delivered revision + 1 (or
//! from the compacted revision, declared, when etcd says the history is gone). A restore of the
//! stack starts a new session from the current revision. Every response is recorded as it came:
//! which member's stream, which response an event arrived in, each put's create revision and
//! version, each progress notification and how many events preceded it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use shakedown_invariants::{CompactedGap, WatchEvent, WatchProgress, WatchSession, WatchStream};
use tokio::sync::watch;

use super::{pause, Recorder, Rng, WatchState, RECONNECT_PAUSE};
use crate::targets::local::etcd::{bounded, connect};

/// The longest a watch stream may stay silent before it is treated as broken and resumed (a
/// stream whose member was paused or cut off never errors on its own).
const SILENCE: Duration = Duration::from_secs(3);
/// How far below the current revision a session drawn to start in the past starts, at most.
const PAST: u64 = 300;
/// How far above the current revision a session drawn to start in the future starts, at most.
const FUTURE: u64 = 30;

/// A watcher that starts a new session every `every` (the `kv` workload's): each from a
/// revision drawn among the current one + 1, one in the past (compacted away, sometimes: etcd
/// must then cancel the watch and say so, never skip silently) and one in the future (nothing
/// until the store gets there). Each session is judged from its own first revision, every
/// write acknowledged at or above it, whenever it was sent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sessions {
    pub(super) every: Duration,
}

/// Watcher `i` watches through `local` (its "local member", the way a stacked kube-apiserver
/// talks to the etcd member on its machine) when that answers, else through the endpoint. With
/// `resume_from_now` (a planted bug) a broken watch resumes from the current revision instead of
/// its last revision + 1.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    i: u32,
    local: Option<String>,
    endpoint: String,
    prefix: String,
    timeout: Duration,
    progress_every: Duration,
    resume_from_now: bool,
    sessions: Option<Sessions>,
    rec: Arc<Recorder>,
    mut stopped: watch::Receiver<bool>,
) {
    let slot = {
        let mut w = rec.watches.lock().expect("watches lock");
        w.push(WatchState::default());
        w.len() - 1
    };
    let name = format!("w{i}");
    let mut rng = Rng::new(u64::from(i) << 40 ^ u64::from(std::process::id()) ^ 0x5e55);
    // Sessions started (named `w<i>.<n>` when the watcher starts them on its own), and when the
    // current one ends.
    let mut count = 0u32;
    let far = || tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600);
    let mut session_end = far();
    let mut generation = rec.generation();
    // Revision to watch from next; 0 = start a new session from the current revision.
    let mut next = 0i64;
    let mut failed_last = false;
    // Responses that carried events in this session: each event records which one.
    let mut responses = 0u64;
    while !*stopped.borrow() {
        if generation.has_changed().unwrap_or(false) {
            generation.borrow_and_update();
            next = 0;
        }
        let mut c = None;
        // The member that answered the status and its release: the stream's, when the stream's
        // first answer comes from the same member (one connection carries both).
        let mut serving: Option<(u64, String)> = None;
        // After a failed attempt the endpoint goes first: the local member may answer a status
        // and still refuse watches (a learner being re-added).
        let order: Vec<&String> =
            if failed_last { [&endpoint].into_iter().chain(local.iter()).collect() } else { local.iter().chain([&endpoint]).collect() };
        for url in order {
            if let Ok(mut client) = connect(url, timeout).await {
                // The connection is lazy: a status request shows whether the member answers.
                if let Ok(s) = bounded("status", timeout, client.status()).await {
                    serving = s.header().map(|h| (h.member_id(), s.version().to_string()));
                    c = Some(client);
                    break;
                }
            }
        }
        let Some(mut c) = c else {
            pause(RECONNECT_PAUSE, &mut stopped).await;
            continue;
        };
        if next == 0 {
            let start_ack = rec.position();
            let Some(now) = current_revision(&mut c, &prefix, timeout).await else {
                pause(RECONNECT_PAUSE, &mut stopped).await;
                continue;
            };
            next = now + 1;
            let mut start_ack = start_ack;
            let mut name = name.clone();
            if let Some(s) = sessions {
                match rng.below(3) {
                    0 => {}
                    1 => {
                        // Every write at or above it is expected, whenever it was acknowledged.
                        next = (now - rng.below(PAST) as i64).max(1);
                        start_ack = 0;
                    }
                    _ => next = now + 1 + rng.below(FUTURE) as i64,
                }
                count += 1;
                name = format!("{name}.{count}");
                session_end = tokio::time::Instant::now() + s.every;
            }
            responses = 0;
            // Compactions asked for before the session: an event at or below one may come
            // without its prev_kv (etcd-io/etcd#10681), a delete at one may never come
            // (etcd-io/etcd#18089).
            let compactions = rec.compactions.lock().expect("compactions lock").clone();
            let mut w = rec.watches.lock().expect("watches lock");
            w[slot] = WatchState {
                session: WatchSession {
                    name,
                    start_revision: next,
                    start_ack,
                    range: Some(prefix.clone()),
                    compactions,
                    ..WatchSession::default()
                },
                log: Default::default(),
            };
        } else {
            rec.watches.lock().expect("watches lock")[slot].session.resumptions += 1;
            rec.stats.watch_resumptions.fetch_add(1, Ordering::Relaxed);
            if resume_from_now {
                // Planted bug: the informer resumes from "now", skipping what happened while
                // its stream was down.
                if let Some(now) = current_revision(&mut c, &prefix, timeout).await {
                    next = now + 1;
                }
            }
        }
        let opts = WatchOptions::new().with_prefix().with_prev_key().with_progress_notify().with_start_revision(next);
        let Ok(Ok(stream)) = tokio::time::timeout(timeout, c.watch(prefix.as_str(), Some(opts))).await else {
            failed_last = true;
            pause(RECONNECT_PAUSE, &mut stopped).await;
            continue;
        };
        failed_last = false;
        let (mut requests, mut stream) = stream.split();
        // Never, with a period of zero: an interval of a year is never due in a run.
        let every = if progress_every.is_zero() { Duration::from_secs(365 * 24 * 3600) } else { progress_every };
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let msg = tokio::select! {
                m = tokio::time::timeout(SILENCE, stream.message()) => m,
                _ = progress.tick() => {
                    // A request that cannot be sent is a broken stream: the silence rule resumes.
                    let _ = tokio::time::timeout(timeout, requests.request_progress()).await;
                    continue;
                }
                _ = stopped.changed() => return,
                _ = generation.changed() => {
                    // Restored: a new session from the restored store's revision.
                    next = 0;
                    break;
                }
                _ = tokio::time::sleep_until(session_end) => {
                    // Kept for the checks; the next session starts from a new drawn revision.
                    rec.end_watch_session(slot);
                    session_end = far();
                    next = 0;
                    break;
                }
            };
            let resp = match msg {
                Ok(Ok(Some(r))) => r,
                // An error, the end of the stream, or silence: resume.
                _ => break,
            };
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    // Declared, not silent: the events before the compacted revision are gone.
                    let mut w = rec.watches.lock().expect("watches lock");
                    let at = w[slot].log.len();
                    w[slot].session.compacted.push(CompactedGap { from: next, to: resp.compact_revision(), at });
                    rec.stats.watch_compacted.fetch_add(1, Ordering::Relaxed);
                    next = resp.compact_revision();
                }
                break;
            }
            let mut w = rec.watches.lock().expect("watches lock");
            if resp.created() {
                // The stream's first answer: which member serves it.
                let id = resp.header().map(|h| h.member_id());
                let member = id.map(|id| format!("{id:x}")).unwrap_or_else(|| "unknown member".into());
                let version = serving.as_ref().filter(|(m, _)| Some(*m) == id).map(|(_, v)| v.clone());
                let first = w[slot].log.len();
                w[slot].session.streams.push(WatchStream { first, member, version });
                continue;
            }
            if resp.events().is_empty() {
                // A progress notification: every event up to its revision has been delivered.
                if let Some(h) = resp.header() {
                    let delivered = w[slot].log.len();
                    w[slot].session.progress.push(WatchProgress { revision: h.revision(), delivered });
                    rec.stats.watch_progress.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            responses += 1;
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                let put = e.event_type() == EventType::Put;
                let value = put.then(|| String::from_utf8_lossy(kv.value()).to_string());
                let prev = e.prev_kv().map(|p| String::from_utf8_lossy(p.value()).to_string());
                w[slot].log.push(WatchEvent {
                    revision: kv.mod_revision(),
                    key: String::from_utf8_lossy(kv.key()).to_string(),
                    value,
                    prev,
                    response: responses,
                    created: put.then(|| (kv.create_revision(), kv.version())),
                });
                next = next.max(kv.mod_revision() + 1);
                rec.stats.watch_events.fetch_add(1, Ordering::Relaxed);
            }
        }
        pause(RECONNECT_PAUSE, &mut stopped).await;
    }
}

/// The store's current revision, from a linearizable read of one key of the range (`None`: no
/// answer, or one without a header; the caller tries again later).
async fn current_revision(c: &mut Client, prefix: &str, timeout: Duration) -> Option<i64> {
    let r = bounded("revision", timeout, c.get(prefix, Some(GetOptions::new().with_prefix().with_count_only()))).await.ok()?;
    r.header().map(|h| h.revision())
}
