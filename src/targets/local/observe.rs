//! What the local target observes after a step: every member's status, etcd's member list,
//! HashKV at a common revision, probes through the endpoint, the workload's read-back, and the
//! run's resources on the machine.

use std::collections::HashMap;

use etcd_client::GetOptions;
use shakedown_faults::{MemberId, Model};
use shakedown_invariants::{Durability, InvariantId, Leader, Leases, ListedMember, MemberStatus, Observation, Probe, Revoke};
use tokio::time::Instant;

use super::disk::DiskMode;
use super::{etcd, futures_join_all, reap, LocalTarget, PROBE_ROUNDS, READ_BACK_MIN_BOUND};

impl LocalTarget {
    /// Linearizable reads through the endpoint, each on a fresh connection, `n` at a time (`n`:
    /// the servers of HAProxy's backend). Its round robin spreads a round over the members, so
    /// one the endpoint should have routed around is hit — unless other connections take turns
    /// in between: the read-back and the lease read of the same check, which run beside the
    /// probes, or a workload client reconnecting (seen: the lease read alone drew the paused
    /// member, check after check, and `reachability` passed with the endpoint's health check
    /// planted away). So rounds go on until every member has answered one (the answer's header
    /// names the member), a read failed, or `PROBE_ROUNDS` ran: a member that is down and
    /// routed around never answers, and costs two more rounds of reads that do.
    pub(super) async fn probes(&self) -> Vec<Probe> {
        let n = self.testbed.members.len().max(1);
        let endpoint = self.testbed.endpoint_url();
        let limit = self.bounds.probe;
        let key = format!("/shakedown/{}/probe", self.testbed.cfg.run_id);
        let mut out = Vec::with_capacity(n);
        let mut answered = std::collections::HashSet::new();
        for _ in 0..PROBE_ROUNDS {
            let futs = (0..n).map(|_| {
                let (endpoint, key) = (endpoint.clone(), key.clone());
                async move {
                    let t0 = Instant::now();
                    let res = async {
                        let mut c = etcd::connect(&endpoint, limit).await?;
                        etcd::bounded("linearizable read", limit, c.get(key.as_str(), None)).await
                    }
                    .await;
                    let member = res.as_ref().ok().and_then(|r| r.header()).map(|h| h.member_id());
                    (Probe { latency_ms: t0.elapsed().as_millis() as u64, error: res.err().map(|e| e.to_string()) }, member)
                }
            });
            for (probe, member) in futures_join_all(futs).await {
                answered.extend(member);
                out.push(probe);
            }
            if answered.len() >= n || out.iter().any(|p| p.error.is_some()) {
                break;
            }
        }
        out
    }

    /// The read first, then the history: every write the read can reflect was sent before it
    /// returned, so it is acknowledged, failed or still in flight by the time the history is
    /// taken.
    pub(super) async fn durability(&self) -> Durability {
        let limit = self.bounds.probe;
        let prefix = self.workload.object_prefix();
        let res = async {
            let mut c = etcd::connect(&self.testbed.endpoint_url(), limit).await?;
            etcd::bounded("read back", limit.max(READ_BACK_MIN_BOUND), c.get(prefix.as_str(), Some(GetOptions::new().with_prefix()))).await
        }
        .await;
        let (read, read_revision, read_error) = match res {
            Ok(resp) => (
                resp.kvs()
                    .iter()
                    .map(|kv| (String::from_utf8_lossy(kv.key()).to_string(), String::from_utf8_lossy(kv.value()).to_string()))
                    .collect(),
                resp.header().map_or(0, |h| h.revision()),
                None,
            ),
            Err(e) => (HashMap::new(), 0, Some(e.to_string())),
        };
        let (acked, unknown) = self.workload.history();
        let list_anomalies = self.workload.list_anomalies();
        let refused_write_txns = self.workload.refused_write_txns();
        let unanswered_compacted_txns = self.workload.unanswered_compacted_txns();
        Durability {
            acked,
            unknown,
            marks: self.marks.clone(),
            read,
            read_revision,
            read_error,
            list_anomalies,
            refused_write_txns,
            unanswered_compacted_txns,
            read_sent_at: None,
        }
    }

    /// The workload's leases, then etcd's live leases, then the lease-attached keys — in that
    /// order (see the `leases` invariant), all from one member behind the endpoint.
    pub(super) async fn leases(&self, prefix: &str) -> Leases {
        let records = self.workload.leases();
        let limit = self.bounds.probe;
        let res = async {
            let mut c = etcd::connect(&self.testbed.endpoint_url(), limit).await?;
            // LeaseLeases answers from the member's own lease table, which may not have applied
            // the latest grants yet: a linearizable read on the same connection (the same member
            // behind the endpoint) first makes it apply everything committed so far.
            etcd::bounded("lease sync read", limit, c.get(prefix, Some(GetOptions::new().with_prefix().with_count_only()))).await?;
            let alive = etcd::bounded("lease list", limit, c.leases()).await?;
            let read = etcd::bounded(
                "lease keys",
                limit.max(READ_BACK_MIN_BOUND),
                c.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())),
            )
            .await?;
            Ok::<_, etcd::EtcdError>((alive, read, self.workload.now_ms()))
        }
        .await;
        match res {
            Ok((alive, read, read_done_ms)) => Leases {
                revoking: self.workload.leases().iter().filter(|r| r.revoke != Revoke::No).map(|r| r.id).collect(),
                records,
                alive: alive.leases().iter().map(|l| l.id()).collect(),
                read: read.kvs().iter().map(|kv| (String::from_utf8_lossy(kv.key()).to_string(), kv.lease())).collect(),
                read_done_ms,
                error: None,
            },
            Err(e) => Leases { records, error: Some(e.to_string()), ..Leases::default() },
        }
    }

    pub(super) async fn observation(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        let wants = |i: InvariantId| invariants.contains(&i);
        let request = self.bounds.request;
        let members: Vec<(String, String)> = self.testbed.members.values().map(|m| (m.name(), m.client_url())).collect();
        let status_futs = members.iter().cloned().map(|(name, url)| async move {
            let r = etcd::status(&url, request).await;
            (name, url, r)
        });
        let statuses = futures_join_all(status_futs).await;
        let mut obs = Observation::default();
        if let Some(s) = &self.sampler {
            obs.serving_samples = s.samples();
            obs.samples_until_ms = s.t0.elapsed().as_millis() as u64;
        }
        let mut leader_url = None;
        for (name, url, r) in &statuses {
            let member = name.parse::<MemberId>().ok();
            obs.members.push(match r {
                Ok(s) => {
                    let me = s.header().map(|h| h.member_id());
                    if s.leader() != 0 && me == Some(s.leader()) {
                        leader_url = Some(url.clone());
                    }
                    MemberStatus {
                        name: name.clone(),
                        member,
                        reachable: true,
                        leader: (s.leader() != 0).then_some(Leader::Id(s.leader())),
                        etcd_id: me,
                        revision: s.header().map(|h| h.revision()).unwrap_or(0),
                        raft_index: s.raft_index(),
                        applied_index: s.raft_applied_index(),
                        raft_term: Some(s.raft_term()),
                        revision_after: None,
                        settled: None,
                        version: Some(s.version().to_string()),
                        hash: None,
                        hash_from: 0,
                        error: None,
                    }
                }
                Err(e) => MemberStatus { error: Some(e.to_string()), ..MemberStatus::without_status(name.clone(), member) },
            });
        }
        let any_url = leader_url.or_else(|| statuses.iter().find(|(_, _, r)| r.is_ok()).map(|(_, u, _)| u.clone()));
        let answered: Vec<(String, String)> =
            statuses.iter().filter(|(_, _, r)| r.is_ok()).map(|(n, u, _)| (n.clone(), u.clone())).collect();
        let lowest = obs.members.iter().filter(|m| m.reachable && m.revision > 0).map(|m| m.revision).min();
        let up = model.service_expected_up();
        // Everything after the statuses at once: under load each request waits behind the
        // workload's, and the check's cost is the longest chain, not the sum.
        let member_list = async {
            let url = any_url.as_ref().filter(|_| wants(InvariantId::Membership) || wants(InvariantId::Quorum))?;
            let mut c = etcd::connect(url, request).await.ok()?;
            let list = etcd::bounded("member list", request, c.member_list()).await.ok()?;
            Some(
                list.members()
                    .iter()
                    .map(|m| ListedMember { id: Some(m.id()), name: m.name().to_string(), peer_urls: m.peer_urls().to_vec() })
                    .collect::<Vec<_>>(),
            )
        };
        let consistency = async {
            if !wants(InvariantId::Consistency) {
                return (vec![], vec![]);
            }
            // More status answers per member, sent after the first answered: the second's
            // revision reflects at least every entry up to the applied index the first reported,
            // and two answers in a row that agree are a quiet point.
            let again = answered.iter().cloned().map(|(name, url)| {
                let first = statuses.iter().find(|(n, _, _)| *n == name).and_then(|(_, _, r)| r.as_ref().ok()).map(revision_and_applied);
                async move { (name, settle(&url, first, request).await) }
            });
            let hashes = answered.iter().filter(|&_| lowest.is_some()).cloned().map(|(name, url)| async move {
                let rev = lowest.unwrap_or(0);
                let r = async {
                    let mut c = etcd::connect(&url, request).await?;
                    etcd::bounded("hash kv", request, c.hash_kv(rev)).await
                }
                .await;
                (name, r.ok().map(|h| ((rev, h.hash()), h.compact_version())))
            });
            tokio::join!(futures_join_all(again), futures_join_all(hashes))
        };
        let probes = async {
            if wants(InvariantId::Reachability) && up {
                self.probes().await
            } else {
                vec![]
            }
        };
        let durability = async {
            if (wants(InvariantId::Durability) || wants(InvariantId::Watch)) && up {
                Some(self.durability().await)
            } else {
                None
            }
        };
        let leases = async {
            match self.workload.lease_prefix().filter(|_| wants(InvariantId::Leases) && up) {
                Some(prefix) => Some(self.leases(&prefix).await),
                None => None,
            }
        };
        let inventory = async {
            if wants(InvariantId::Leaks) {
                Some(shakedown_invariants::Inventory::Local(
                    reap::inventory(
                        &self.testbed.cfg.run_dir,
                        &self.testbed.nft_table(),
                        self.testbed.cfg.disks == DiskMode::Loop,
                        self.testbed.api.is_some(),
                    )
                    .await,
                ))
            } else {
                None
            }
        };
        let (list, (again, hashes), probes, durability, leases, inventory) =
            tokio::join!(member_list, consistency, probes, durability, leases, inventory);
        let names: std::collections::HashMap<String, String> = list
            .iter()
            .flatten()
            .filter_map(|m| m.id.filter(|_| !m.name.is_empty()).map(|id| (format!("{id:x}"), m.name.clone())))
            .collect();
        self.workload.name_members(&names);
        obs.member_list = list;
        if wants(InvariantId::Linearizability) {
            obs.history = Some(self.workload.requests_view());
        }
        fill_consistency(&mut obs, again, hashes);
        obs.probes = probes;
        obs.durability = durability;
        obs.leases = leases;
        obs.inventory = inventory;
        if wants(InvariantId::Watch) {
            obs.watches = Some(self.workload.watch_sessions());
        }
        if let Some(api) = &self.api {
            if InvariantId::API.iter().any(|i| invariants.contains(i)) {
                obs.api = Some(api.observe(&self.testbed, model, invariants, self.bounds.probe).await);
            }
        }
        obs
    }
}

/// Each member's second status answer and quiet point (`again`) and its hash at the common
/// revision with the compaction it starts from (`hashes`), by member name, into `obs`: what
/// `consistency` reads, as the local and kube targets gather it.
pub(crate) type Settled = (Option<i64>, Option<(i64, u64)>);
/// ((revision, hash), the compacted revision the hash starts from).
pub(crate) type Hashed = Option<((i64, u32), i64)>;
pub(crate) fn fill_consistency(obs: &mut Observation, again: Vec<(String, Settled)>, hashes: Vec<(String, Hashed)>) {
    for (name, (after, settled)) in again {
        if let Some(m) = obs.members.iter_mut().find(|m| m.name == name) {
            m.revision_after = after;
            m.settled = settled;
        }
    }
    for (name, h) in hashes {
        if let Some(m) = obs.members.iter_mut().find(|m| m.name == name) {
            m.hash = h.map(|(h, _)| h);
            m.hash_from = h.map_or(0, |(_, from)| from);
        }
    }
}

/// How many status answers after the first one [`settle`] asks for at most.
const SETTLE_TRIES: usize = 6;

#[cfg(test)]
mod quiet_point_tests {
    use super::is_quiet_point;

    #[test]
    fn a_quiet_point_is_two_agreeing_answers_with_nothing_committed_beyond_the_applied_index() {
        assert!(is_quiet_point(Some((12517, 14588)), (12517, 14588), 14588));
        // An entry handed to the applier (committed 14589): its transaction may have bumped the
        // revision already while the applied index still says 14588.
        assert!(!is_quiet_point(Some((12517, 14588)), (12517, 14588), 14589));
        assert!(!is_quiet_point(Some((12516, 14588)), (12517, 14588), 14588));
        assert!(!is_quiet_point(None, (12517, 14588), 14588));
        assert!(!is_quiet_point(Some((0, 0)), (0, 0), 0));
    }
}

fn revision_and_applied(s: &etcd_client::StatusResponse) -> (i64, u64) {
    (s.header().map(|h| h.revision()).unwrap_or(0), s.raft_applied_index())
}

/// Asks the member at `url` for its status until it answers a quiet point (see
/// [`settle_with`]).
async fn settle(url: &str, first: Option<(i64, u64)>, request: std::time::Duration) -> Settled {
    let Ok(c) = etcd::connect(url, request).await else { return (None, None) };
    settle_with(first, || {
        let mut c = c.clone();
        async move {
            let s = etcd::bounded("status", request, c.status()).await.ok()?;
            let (revision, applied) = revision_and_applied(&s);
            Some((revision, applied, s.raft_index()))
        }
    })
    .await
}

/// Asks `status` — a member's `(revision, applied index, committed index)`, `None` when it did
/// not answer — until it answers a quiet point, at most [`SETTLE_TRIES`] times after `first`.
/// Returns the next answer's revision after `first` (`revision_after`) and the quiet point,
/// `None` where there was none or no answer. The local and the kube target ask through their
/// own clients.
pub(crate) async fn settle_with<F, Fut>(first: Option<(i64, u64)>, mut status: F) -> Settled
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<(i64, u64, u64)>>,
{
    let mut after = None;
    let mut previous = first;
    for _ in 0..SETTLE_TRIES {
        let Some((revision, applied, committed)) = status().await else { break };
        let now = (revision, applied);
        after.get_or_insert(now.0);
        if is_quiet_point(previous, now, committed) {
            return (after, Some(now));
        }
        previous = Some(now);
    }
    (after, None)
}

/// Whether a status answer `now` — `(revision, applied index)`, with the committed index
/// `committed` it reported — makes a quiet point after the answer before it, `previous`: the
/// store then holds exactly the entries up to that applied index. etcd reads an answer's
/// revision first, then the committed and the applied index, and its applier bumps the revision
/// at the end of an entry's transaction, a moment before it records the entry as applied. Two
/// answers that agree pin the applied index `i` while the second's revision was read, so that
/// revision is `rev(i)`, or `rev(i) + 1` if entry `i + 1` was between its transaction and its
/// bookkeeping all that time (seen once in a soak on 3.4.23 under load: a member 4 revisions
/// ahead of another with 3 entries more, named a divergence). An entry in the applier's hands
/// is committed, so a committed index equal to the applied one rules that out.
fn is_quiet_point(previous: Option<(i64, u64)>, now: (i64, u64), committed: u64) -> bool {
    previous == Some(now) && now.0 > 0 && now.1 > 0 && committed == now.1
}

/// What etcd logs when a member has received a whole snapshot from the leader (3.4 and 3.5).
const SNAPSHOT_RECEIVED: &str = "received and saved database snapshot";

/// Per member log in `logs` (`<member>.log`), how many times the member caught up through a
/// snapshot the leader sent it rather than through raft entries: the path a member takes when it
/// was behind the leader's catch-up window. Logs that cannot be read count nothing.
pub(crate) fn snapshots_received(logs: &std::path::Path) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(logs).into_iter().flatten().flatten() {
        let path = e.path();
        let Some(member) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".log")) else { continue };
        let n = snapshots_received_in(&path);
        if n > 0 {
            out.insert(member.to_string(), n);
        }
    }
    out
}

/// How many snapshots the member whose log is `log` says it received (0 when it cannot be read).
pub(crate) fn snapshots_received_in(log: &std::path::Path) -> usize {
    lines_containing(log, SNAPSHOT_RECEIVED)
}

/// How many lines of the log file at `log` contain `needle` (0 if it cannot be read).
pub(crate) fn lines_containing(log: &std::path::Path, needle: &str) -> usize {
    use std::io::BufRead;
    let Ok(f) = std::fs::File::open(log) else { return 0 };
    std::io::BufReader::new(f).split(b'\n').map_while(Result::ok).filter(|l| contains(l, needle.as_bytes())).count()
}

/// What etcd logs (3.4 and 3.5) when it has compacted its raft log after a snapshot, with the
/// index it compacted to as `"compact-index":N`.
const RAFT_LOG_COMPACTED: &str = "\"compacted Raft logs\"";

/// The raft log compactions etcd members logged from now on, read incrementally from their log
/// files: each poll reads only what was appended since the last one.
pub(crate) struct CompactionsInLogs {
    logs: Vec<(std::path::PathBuf, u64, u64)>,
}

impl CompactionsInLogs {
    /// From the logs' current ends. What a log holds already does not count: a member's log is
    /// kept across its restarts and across restores from a backup, which start the raft log
    /// again from a low index, so an old line's index says nothing of today's log (seen: a cut
    /// lifted at once after a restore, the others' logs holding a compaction to 1,018 from before
    /// it while their raft log was at index 314, and the member caught up through entries).
    pub(crate) fn from_now(logs: Vec<std::path::PathBuf>) -> CompactionsInLogs {
        let end = |p: &std::path::PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        CompactionsInLogs { logs: logs.into_iter().map(|p| (end(&p), p)).map(|(e, p)| (p, e, 0)).collect() }
    }

    /// The lowest, over the members, of the highest index each has compacted its raft log to
    /// (0 for one that has not compacted, or whose log cannot be read).
    pub(crate) fn poll(&mut self) -> u64 {
        use std::io::{BufRead, Seek};
        for (path, offset, highest) in &mut self.logs {
            let Ok(mut f) = std::fs::File::open(&*path) else { continue };
            if f.seek(std::io::SeekFrom::Start(*offset)).is_err() {
                continue;
            }
            let mut r = std::io::BufReader::new(f);
            let mut line = Vec::new();
            // Only whole lines: a line still being written is read at the next poll.
            while let Ok(n) = r.read_until(b'\n', &mut line) {
                if n == 0 || line.last() != Some(&b'\n') {
                    break;
                }
                *offset += n as u64;
                if contains(&line, RAFT_LOG_COMPACTED.as_bytes()) {
                    if let Some(i) = compact_index(&line) {
                        *highest = (*highest).max(i);
                    }
                }
                line.clear();
            }
        }
        self.logs.iter().map(|(_, _, h)| *h).min().unwrap_or(0)
    }
}

/// The `"compact-index":N` of a log line.
fn compact_index(line: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(line).ok()?;
    let rest = &text[text.find("\"compact-index\":")? + "\"compact-index\":".len()..];
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod compaction_tests {
    use super::*;

    #[test]
    fn raft_log_compactions_are_read_incrementally_from_now_and_the_lowest_member_counts() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("m0.log"), dir.path().join("m1.log"));
        let line = |i: u64| format!("{{\"level\":\"info\",\"msg\":\"compacted Raft logs\",\"compact-index\":{i}}}\n");
        let append = |p: &std::path::Path, text: &str| {
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(p)
                .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
                .unwrap()
        };
        // Before: a compaction far ahead of anything since (a log from before a restore).
        std::fs::write(&a, line(50_000)).unwrap();
        let mut c = CompactionsInLogs::from_now(vec![a.clone(), b.clone()]);
        assert_eq!(c.poll(), 0, "what the logs held before does not count");
        append(&a, &format!("{}{}", line(10), line(1010)));
        append(&b, "{\"msg\":\"triggering snapshot\"}\n");
        assert_eq!(c.poll(), 0, "m1 has not compacted");
        append(&b, &format!("{}{{\"msg\":\"compacted Raft logs\",\"compact-ind", line(2000)));
        assert_eq!(c.poll(), 1010, "the lowest of the highest: m0's 1010, m1's 2000; half a line waits");
        append(&a, &line(3000));
        assert_eq!(c.poll(), 2000);
        assert_eq!(CompactionsInLogs::from_now(vec![dir.path().join("gone.log")]).poll(), 0);
    }
}
