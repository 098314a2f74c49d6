//! The serving sampler: while a step runs, every member is polled every few milliseconds (one
//! watcher per member) and the membership every 100 ms, so `quorum` can judge every instant of
//! the step, not only its end.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shakedown_invariants::ServingSample;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{etcd, testbed};

/// A member that does not accept a TCP connection within this is not counted either way.
const CONNECT_BOUND: Duration = Duration::from_millis(100);
/// One status (or member list) request of the sampler.
const SAMPLE_REQUEST_BOUND: Duration = Duration::from_millis(250);
/// How often the membership is read during a step.
const MEMBERSHIP_EVERY: Duration = Duration::from_millis(100);
/// How long the sampler may take to stop at the end of a step before it is aborted.
const FINISH_BOUND: Duration = Duration::from_secs(2);
/// A member that has answered nothing for this long (every status timed out, or no connection
/// completed: paused, or cut off) is not serving, from its first unanswered attempt on. Shorter
/// silences are a slow machine's, not an outage: on 2 loaded cores a live member's first status
/// of a step once took 440 ms (nightly soak, 2026-12-06).
const SILENT_AFTER: Duration = Duration::from_secs(1);

/// One member's serving state changes, as (ms since the step began, serving).
type Flips = Arc<Mutex<Vec<(u64, bool)>>>;

/// Watches one member every `every`. A refused connection marks it not serving (at the time of
/// the attempt); an answer marks it serving (at the time of the answer); a member silent for
/// [`SILENT_AFTER`] (paused, cut off) is not serving from its first unanswered attempt. Shorter
/// timeouts and error answers change nothing, so a slow machine cannot fake an outage.
async fn watch_member(url: String, t0: Instant, every: Duration, flips: Flips, mut stop: watch::Receiver<bool>) {
    let addr = url.trim_start_matches("http://").to_string();
    let mut client: Option<etcd_client::Client> = None;
    let mut last: Option<bool> = None;
    // The first attempt of the current run of unanswered ones.
    let mut silent_since: Option<Instant> = None;
    let push = |at: Instant, serving: bool, last: &mut Option<bool>| {
        if *last != Some(serving) {
            *last = Some(serving);
            flips.lock().expect("flips lock").push((at.duration_since(t0).as_millis() as u64, serving));
        }
    };
    while !*stop.borrow() {
        let tick = Instant::now();
        let connect = tokio::time::timeout(CONNECT_BOUND, tokio::net::TcpStream::connect(&addr)).await;
        let mut silent = false;
        match connect {
            Ok(Err(_)) => {
                silent_since = None;
                push(tick, false, &mut last);
            }
            Err(_) => silent = true,
            Ok(Ok(_)) => {
                if client.is_none() {
                    client = etcd::connect(&url, SAMPLE_REQUEST_BOUND).await.ok();
                }
                if let Some(c) = client.as_mut() {
                    match tokio::time::timeout(SAMPLE_REQUEST_BOUND, c.status()).await {
                        Ok(Ok(_)) => {
                            silent_since = None;
                            push(Instant::now(), true, &mut last);
                        }
                        // An error answer from a listening member is no evidence either way
                        // (a fresh channel may not be ready yet): try again on a new client.
                        Ok(Err(_)) => client = None,
                        Err(_) => silent = true,
                    }
                }
            }
        }
        if silent {
            let since = *silent_since.get_or_insert(tick);
            if since.elapsed() >= SILENT_AFTER {
                push(since, false, &mut last);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(tick + every) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Watches every member and the membership until `stop` fires; new members (a rolling replace
/// adds them) are watched as the member list shows them.
fn spawn_watcher(url: &str, t0: Instant, every: Duration, watched: &Arc<Mutex<BTreeMap<String, Flips>>>, stop: watch::Receiver<bool>) {
    let mut w = watched.lock().expect("watched lock");
    if !w.contains_key(url) {
        let flips: Flips = Arc::new(Mutex::new(Vec::new()));
        w.insert(url.to_string(), flips.clone());
        // Watchers end when `stop` fires; they are bounded by the step.
        tokio::spawn(watch_member(url.to_string(), t0, every, flips, stop));
    }
}

/// The membership the sampler saw, by instant: (ms since the step began, member name → URL).
type MembershipLog = Vec<(u64, BTreeMap<String, String>)>;

async fn sample_serving(
    initial: Vec<(String, String)>,
    t0: Instant,
    every: Duration,
    stop: watch::Receiver<bool>,
    membership: Arc<Mutex<MembershipLog>>,
    watched: Arc<Mutex<BTreeMap<String, Flips>>>,
) {
    let mut names: BTreeMap<String, String> = initial.iter().map(|(n, u)| (u.clone(), n.clone())).collect();
    let mut stop_rx = stop.clone();
    loop {
        for url in names.keys() {
            spawn_watcher(url, t0, every, &watched, stop.clone());
        }
        // The membership, from any member that answers.
        for url in names.keys().cloned().collect::<Vec<_>>() {
            let Ok(mut c) = etcd::connect(&url, SAMPLE_REQUEST_BOUND).await else { continue };
            if let Ok(list) = etcd::bounded("member list", SAMPLE_REQUEST_BOUND, c.member_list()).await {
                // A member added but not started yet has no client URL: on this testbed it is its
                // peer URL with the client port.
                let members: BTreeMap<String, String> = list
                    .members()
                    .iter()
                    .filter_map(|m| {
                        let client = m.client_urls().first().cloned().or_else(|| {
                            m.peer_urls()
                                .first()
                                .map(|p| p.replace(&format!(":{}", testbed::PEER_PORT), &format!(":{}", testbed::CLIENT_PORT)))
                        })?;
                        let name = if m.name().is_empty() { format!("unstarted {client}") } else { m.name().to_string() };
                        Some((client, name))
                    })
                    .collect();
                let view = members.clone();
                names.extend(members);
                membership.lock().expect("membership lock").push((t0.elapsed().as_millis() as u64, view));
                break;
            }
        }
        if *stop_rx.borrow() {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(MEMBERSHIP_EVERY) => {}
            _ = stop_rx.changed() => {}
        }
    }
}

/// Merges per-member flips and membership snapshots into samples: one per change, each listing
/// the members serving at that instant among the members of the cluster at that instant.
fn merge_samples(membership: &[(u64, BTreeMap<String, String>)], watched: &BTreeMap<String, Flips>) -> Vec<ServingSample> {
    let mut times: BTreeSet<u64> = membership.iter().map(|(t, _)| *t).collect();
    let flips: BTreeMap<&String, Vec<(u64, bool)>> = watched
        .iter()
        .map(|(u, f)| {
            let mut v = f.lock().expect("flips lock").clone();
            v.sort_by_key(|(t, _)| *t);
            (u, v)
        })
        .collect();
    times.extend(flips.values().flat_map(|v| v.iter().map(|(t, _)| *t)));
    let mut out = Vec::new();
    for t in times {
        // The membership as last seen at or before t.
        let Some((_, members)) = membership.iter().rev().find(|(mt, _)| *mt <= t) else { continue };
        // A member with no evidence yet at t (no answer, no refusal, not silent long enough)
        // is not counted down: its silence, once long enough, is dated from its first
        // unanswered attempt.
        let serving: Vec<String> = members
            .iter()
            .filter(|(u, _)| flips.get(u).and_then(|f| f.iter().rev().find(|(ft, _)| *ft <= t)).is_none_or(|(_, s)| *s))
            .map(|(_, n)| n.clone())
            .collect();
        out.push(ServingSample { at_ms: t, serving, cluster_size: members.len() });
    }
    out
}

/// The serving sampler of the current step: runs from the start of an op until the engine ends
/// the step (after its checks), so a quorum loss that outlives the op is seen too.
pub(super) struct Sampler {
    pub(super) t0: Instant,
    stop: watch::Sender<bool>,
    every: Duration,
    membership: Arc<Mutex<MembershipLog>>,
    watched: Arc<Mutex<BTreeMap<String, Flips>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub(super) fn start(members: Vec<(String, String)>, every: Duration) -> Sampler {
        let (stop, rx) = watch::channel(false);
        let membership = Arc::new(Mutex::new(Vec::new()));
        let watched = Arc::new(Mutex::new(BTreeMap::new()));
        let t0 = Instant::now();
        let task = tokio::spawn(sample_serving(members, t0, every, rx, membership.clone(), watched.clone()));
        Sampler { t0, stop, every, membership, watched, task }
    }

    /// Starts watching a member right away (a member the target is about to add).
    pub(super) fn watch(&self, url: &str) {
        spawn_watcher(url, self.t0, self.every, &self.watched, self.stop.subscribe());
    }

    /// The target itself just saw the member at `url` answer (its own wait for health): that is
    /// evidence too, and earlier than the watcher's next poll.
    pub(super) fn confirm(&self, url: &str) {
        if let Some(f) = self.watched.lock().expect("watched lock").get(url) {
            f.lock().expect("flips lock").push((self.t0.elapsed().as_millis() as u64, true));
        }
    }

    pub(super) fn samples(&self) -> Vec<ServingSample> {
        let membership = self.membership.lock().expect("membership lock").clone();
        let watched = self.watched.lock().expect("watched lock").clone();
        if tracing::enabled!(tracing::Level::TRACE) {
            for (u, f) in &watched {
                tracing::trace!(url = u.as_str(), flips = ?f.lock().expect("flips lock"), "serving flips");
            }
            tracing::trace!(?membership, "membership snapshots");
        }
        merge_samples(&membership, &watched)
    }

    pub(super) async fn finish(self) {
        let _ = self.stop.send(true);
        let abort = self.task.abort_handle();
        if tokio::time::timeout(FINISH_BOUND, self.task).await.is_err() {
            abort.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flips(v: &[(u64, bool)]) -> Flips {
        Arc::new(Mutex::new(v.to_vec()))
    }

    /// A member with no evidence yet is not counted down (a slow first answer on a loaded
    /// machine once failed `quorum` for 132 ms); a refusal, or a silence dated back to its first
    /// unanswered attempt, is.
    #[test]
    fn only_evidence_counts_a_member_down() {
        let members: BTreeMap<String, String> = (0..3).map(|i| (format!("u{i}"), format!("m{i}"))).collect();
        let membership = vec![(0, members)];
        // m0 answers at 5 ms; m1 answers only at 439 ms (slow, alive); m2 is silent from 10 ms
        // (its flip pushed a second later, dated back).
        let watched: BTreeMap<String, Flips> =
            [("u0".to_string(), flips(&[(5, true)])), ("u1".to_string(), flips(&[(439, true)])), ("u2".to_string(), flips(&[(10, false)]))]
                .into();
        let samples = merge_samples(&membership, &watched);
        let at = |t: u64| samples.iter().rev().find(|s| s.at_ms <= t).map(|s| s.serving.clone()).unwrap();
        assert_eq!(at(307), ["m0", "m1"], "m1 has not answered yet: no evidence it is down");
        assert_eq!(at(500), ["m0", "m1"]);
        // A refusal is evidence at once.
        watched["u1"].lock().unwrap().insert(0, (20, false));
        let samples = merge_samples(&membership, &watched);
        let down = samples.iter().find(|s| s.at_ms == 20).unwrap();
        assert_eq!(down.serving, ["m0"], "from 20 ms until m1 answers at 439 ms");
    }
}
