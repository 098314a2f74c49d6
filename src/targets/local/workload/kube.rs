//! The `kube` workload: kube-apiserver's storage traffic in miniature.
//!
//! - Object clients (`clients` of them) share `keyspace` keys under `<prefix>o/`. A key a client
//!   believes absent is created with `If(ModRevision(key) == 0) Then(Put) Else(Get)`; one it
//!   believes present is updated or deleted with `If(ModRevision(key) == rev) Then(Put | Delete)
//!   Else(Get)`, and a refused update is retried with the revision the `Else` returned (like
//!   kube-apiserver's GuaranteedUpdate), a few times.
//! - Each client also attaches keys under `<prefix>l/` to a lease it reuses for a few keys, then
//!   revokes or abandons to expire; and now and then lists the object keys page by page at the
//!   revision of the first page.
//! - `watches` watchers follow the object keys ([`super::watch`]).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use shakedown_faults::Workload as Config;
use shakedown_history::format::{Kv as HistoryKv, ReadAnswer, Request, Then, TxnAnswer};
use shakedown_invariants::{Ack, LeaseRecord, Revoke, Unknown};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{member_hex, pause, unix_ms, ClientBugs, Recorder, Rng, MAX_LEASE_RECORDS, RECONNECT_PAUSE, WRITE_BEHIND_DELAY};
use crate::targets::local::etcd::{bounded, connect};

/// How long a `kv` workload's watch session lasts before its watcher starts another from a
/// drawn revision.
const KV_WATCH_SESSION: std::time::Duration = std::time::Duration::from_secs(4);
/// How often a refused update is retried with the revision the refusal returned.
const CONFLICT_RETRIES: u32 = 3;
/// Keys attached to one lease before the client moves on to a new lease.
const KEYS_PER_LEASE: u32 = 8;
/// How often a client writes a key of its own share of the keyspace rather than any key.
const OWN_KEYS_PERCENT: u64 = 90;
/// Page size of a paginated read.
const PAGE: i64 = 100;
/// Lists whose first page is a serializable read (answered by whichever member the endpoint
/// picks, from its own store), and whose every page goes into the history: the checker judges
/// each against the state at the revision it claims (the others record only their first page:
/// with the default mix the history holds about three gets per other request, against two
/// before serializable lists).
const SERIALIZABLE_LIST_PERCENT: u64 = 10;

pub(super) fn object_prefix(prefix: &str) -> String {
    format!("{prefix}o/")
}

pub(super) fn lease_prefix(prefix: &str) -> String {
    format!("{prefix}l/")
}

/// What the `kube` and `kv` workloads' tasks start from.
pub(super) struct Start<'a> {
    pub(super) endpoint: &'a str,
    /// The members' own URLs: watcher `i` prefers member `members[i % members.len()]`.
    pub(super) members: &'a [String],
    /// The run's keys (`/shakedown/<run>/w/`).
    pub(super) prefix: &'a str,
    pub(super) cfg: &'a Config,
    pub(super) bugs: ClientBugs,
    pub(super) rec: &'a Arc<Recorder>,
    pub(super) stopped: &'a watch::Receiver<bool>,
}

/// Starts the object clients, the compactor and the watchers.
pub(super) fn start(s: &Start) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..s.cfg.clients {
        let c = ObjectClient::new(i, s);
        tasks.push(tokio::spawn(c.run(s.stopped.clone())));
    }
    tasks.extend(compactor_and_watchers(s));
    tasks
}

/// The compactor (when the profile compacts) and the `watches` watchers.
pub(super) fn compactor_and_watchers(s: &Start) -> Vec<JoinHandle<()>> {
    let Start { endpoint, members, prefix, cfg, bugs, rec, stopped } = *s;
    let mut tasks = Vec::new();
    if !cfg.compact_interval.is_zero() {
        tasks.push(tokio::spawn(compactor(endpoint.to_string(), cfg.compact_interval, cfg.timeout, rec.clone(), stopped.clone())));
    }
    for i in 0..cfg.watches {
        let local = (!members.is_empty()).then(|| members[i as usize % members.len()].clone());
        tasks.push(tokio::spawn(super::watch::run(
            i,
            local,
            endpoint.to_string(),
            object_prefix(prefix),
            cfg.timeout,
            cfg.watch_progress,
            bugs.resume_from_now,
            (cfg.kind == shakedown_faults::WorkloadKind::Kv).then_some(super::watch::Sessions { every: KV_WATCH_SESSION }),
            rec.clone(),
            stopped.clone(),
        )));
    }
    tasks
}

/// How soon the compactor tries a tick again whose read found no answer.
const COMPACTOR_RETRY: std::time::Duration = std::time::Duration::from_millis(200);

/// Compacts the store every `interval` to the revision it had one interval earlier, as
/// kube-apiserver's compactor does, and every third time to the revision it has now: whatever
/// a watch or a paginated read still needs from before that is gone, and etcd must say so.
async fn compactor(
    endpoint: String,
    interval: std::time::Duration,
    timeout: std::time::Duration,
    rec: Arc<Recorder>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut client: Option<Client> = None;
    // The revision seen at the previous tick: the next compaction's target.
    let mut seen: Option<i64> = None;
    let mut tick = 0u64;
    let mut compacted = 0i64;
    // A tick whose read found no answer (no leader during an election, a member just killed
    // behind the endpoint) is tried again soon rather than an interval later: under a plan
    // dense with crashes, most ticks would otherwise find the stack between two leaders.
    let retry = interval.min(COMPACTOR_RETRY);
    let mut wait = interval;
    while !*stopped.borrow() {
        pause(wait, &mut stopped).await;
        if *stopped.borrow() {
            return;
        }
        wait = retry;
        if client.is_none() {
            client = connect(&endpoint, timeout).await.ok();
        }
        let Some(c) = client.as_mut() else {
            tracing::debug!("compactor: no connection to {endpoint}");
            continue;
        };
        let now = match bounded("compaction point", timeout, c.get("compaction point", None)).await {
            Ok(r) => r.header().map(|h| h.revision()),
            Err(e) => {
                tracing::debug!("compaction point unread: {e}");
                client = None;
                continue;
            }
        };
        wait = interval;
        tick += 1;
        // Every third compaction goes to the revision just read: ahead of what a watch about to
        // resume or a list in progress still holds, which etcd must then refuse, declared.
        let target = if tick.is_multiple_of(3) { now } else { seen };
        // Not again to where a previous tick compacted (after a tick that compacted to the
        // revision it read, the next one's target is that same revision).
        if let Some(target) = target.filter(|&r| r > 1 && r > compacted) {
            // No transaction with a range at an older revision is drawn or in flight meanwhile.
            let _gate = rec.compaction_gate.write().await;
            rec.compaction_requested(target);
            match bounded("compact", timeout, c.compact(target, None)).await {
                Ok(_) => {
                    compacted = target;
                    rec.stats.compactions.fetch_add(1, Ordering::Relaxed);
                }
                // Already compacted past it (a restore brought an older store back, or another
                // compactor), or the endpoint failed: the next tick tries again.
                Err(e) => tracing::debug!("compaction to revision {target} failed: {e}"),
            }
        }
        seen = now;
    }
}

/// What one request did.
pub(super) enum Outcome {
    Done,
    /// The connection is suspect: reconnect before the next request.
    Reconnect,
}

pub(super) struct ObjectClient {
    pub(super) id: u32,
    endpoint: String,
    objects: String,
    leases: String,
    pub(super) cfg: Config,
    bugs: ClientBugs,
    pub(super) rec: Arc<Recorder>,
    /// What this client last saw of a key: its mod revision, or 0 when absent.
    known: HashMap<u32, i64>,
    pub(super) seq: u64,
    /// The lease in use: (id, keys attached so far).
    lease: Option<(i64, u32)>,
    pub(super) rng: Rng,
    /// The member this client would call its own (planted bug serializable-reads) and its
    /// connection.
    own_member: Option<String>,
    own: Option<Client>,
}

impl ObjectClient {
    /// Client `i` of the object keys.
    pub(super) fn new(i: u32, s: &Start) -> ObjectClient {
        let Start { endpoint, members, prefix, cfg, bugs, rec, .. } = *s;
        ObjectClient {
            id: i,
            endpoint: endpoint.to_string(),
            objects: object_prefix(prefix),
            leases: lease_prefix(prefix),
            cfg: cfg.clone(),
            bugs,
            rec: rec.clone(),
            known: HashMap::new(),
            seq: 0,
            lease: None,
            rng: Rng::new(u64::from(i) << 32 | u64::from(std::process::id())),
            own_member: (!members.is_empty()).then(|| members[i as usize % members.len()].clone()),
            own: None,
        }
    }

    /// The client's endpoint.
    pub(super) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A key of this client's object keys was written or read by a request `write` does not
    /// know of: what it believes of the key's mod revision goes (the next write re-learns it).
    pub(super) fn forget(&mut self, k: u32) {
        self.known.remove(&k);
    }

    async fn run(mut self, mut stopped: watch::Receiver<bool>) {
        let mut client: Option<Client> = None;
        let m = self.cfg.mix;
        let w = |x: u32| u64::from(x);
        let total = w(m.create) + w(m.update) + w(m.delete) + w(m.lease) + w(m.list);
        while !*stopped.borrow() {
            if client.is_none() {
                client = connect(&self.endpoint, self.cfg.timeout).await.ok();
            }
            let Some(c) = client.as_mut() else {
                self.rec.stats.failed.fetch_add(1, Ordering::Relaxed);
                pause(RECONNECT_PAUSE, &mut stopped).await;
                continue;
            };
            let mut pick = self.rng.below(total);
            let outcome = if pick < w(m.create) + w(m.update) + w(m.delete) {
                self.write(c, pick).await
            } else {
                pick -= w(m.create) + w(m.update) + w(m.delete);
                if pick < w(m.lease) {
                    self.lease_put(c).await
                } else {
                    self.list(c).await
                }
            };
            if matches!(outcome, Outcome::Reconnect) {
                // A fresh connection lets the endpoint route around a dead member.
                client = None;
            }
            pause(self.cfg.interval, &mut stopped).await;
        }
    }

    /// Mostly a key of the client's own share of the keyspace (a controller writes the objects
    /// it owns), sometimes any key: conflicts happen, but not on every request.
    pub(super) fn pick_key(&mut self) -> u32 {
        let (n, clients) = (self.cfg.keyspace, self.cfg.clients);
        let own = (n / clients).max(1);
        if self.rng.below(100) < OWN_KEYS_PERCENT && n >= clients {
            (self.rng.below(u64::from(own)) as u32) * clients + self.id
        } else {
            self.rng.below(u64::from(n)) as u32
        }
    }

    pub(super) fn key(&self, k: u32) -> String {
        format!("{}{k:06}", self.objects)
    }

    /// A create, update or delete of a random key, decided by what the client knows of it:
    /// absent → create (when the mix creates), present → update or delete by their weights.
    pub(super) async fn write(&mut self, c: &mut Client, pick: u64) -> Outcome {
        let m = self.cfg.mix;
        let k = self.pick_key();
        let known = self.known.get(&k).copied().unwrap_or(0);
        if known == 0 && m.create == 0 {
            return Outcome::Done;
        }
        let both = u64::from(m.update) + u64::from(m.delete);
        let delete = known != 0 && both > 0 && pick % both >= u64::from(m.update);
        let key = self.key(k);
        let mut rev = known;
        for attempt in 0..=CONFLICT_RETRIES {
            self.seq += 1;
            let value = (!delete).then(|| format!("c{}-{}", self.id, self.seq));
            let create = rev == 0;
            let then = match &value {
                Some(v) => TxnOp::put(key.as_str(), v.as_str(), None),
                None => TxnOp::delete(key.as_str(), None),
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                .and_then([then])
                .or_else([TxnOp::get(key.as_str(), None)]);
            let start = self.rec.position();
            self.rec.stats.attempted.fetch_add(1, Ordering::Relaxed);
            if self.bugs.ack_before_write {
                // Planted bug: write-behind (see the puts workload), on keys of its own (a
                // write-behind cache creates; its revision is not known).
                let key = format!("{}b{}-{}", self.objects, self.id, self.seq);
                let value = format!("c{}-{}", self.id, self.seq);
                self.rec.ack_unsent(Ack { key: key.clone(), value: Some(value.clone()), revision: 0, start });
                let txn = Txn::new().when([Compare::mod_revision(key.as_str(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
                    key.as_str(),
                    value.as_str(),
                    None,
                )]);
                let mut c = c.clone();
                let timeout = self.cfg.timeout;
                tokio::spawn(async move {
                    tokio::time::sleep(WRITE_BEHIND_DELAY).await;
                    let _ = bounded("txn", timeout, c.txn(txn)).await;
                });
                self.known.remove(&k);
                return Outcome::Done;
            }
            let (at, t) = (unix_ms(), std::time::Instant::now());
            let ticket = self.rec.send(Unknown { key: key.clone(), value: value.clone(), start, any_time: create });
            let then = match &value {
                Some(v) => Then::Put(v.clone()),
                None => Then::Delete,
            };
            let request = |answer| Request::Txn { key: key.clone(), if_mod_revision: rev, then: then.clone(), answer };
            let sent = self.rec.requests.send(u64::from(self.id), request(None));
            let res = bounded("txn", self.cfg.timeout, c.txn(txn)).await;
            self.rec.sample(at, t.elapsed(), res.is_ok());
            let (answer, member) = match &res {
                Ok(r) => {
                    let header = r.header();
                    let revision = header.map_or(0, |h| h.revision());
                    // With the planted bug ignore-conflict the client reports a refused compare
                    // as a success: the history holds what the client was told to believe.
                    let succeeded = r.succeeded() || self.bugs.ignore_conflict;
                    let kv = (!succeeded).then(|| else_kv(r)).flatten();
                    (Some(TxnAnswer { succeeded, revision, kv }), header.map(|h| member_hex(h.member_id())))
                }
                Err(_) => (None, None),
            };
            self.rec.requests.end(sent, request(answer), member);
            let resp = match res {
                Ok(r) => r,
                Err(e) => {
                    tracing::trace!("workload txn on {key} failed: {e}");
                    self.rec.failed(ticket);
                    self.known.remove(&k);
                    return Outcome::Reconnect;
                }
            };
            let revision = resp.header().map_or(0, |h| h.revision());
            if resp.succeeded() || self.bugs.ignore_conflict {
                if self.bugs.serializable_reads {
                    self.read_own(&key).await;
                }
                // With the planted bug ignore-conflict a refused compare counts as written too.
                self.rec.answered(ticket, Some(Ack { key, value: value.clone(), revision, start }));
                if value.is_some() {
                    self.known.insert(k, revision);
                } else {
                    self.known.remove(&k);
                }
                return Outcome::Done;
            }
            self.rec.answered(ticket, None);
            self.rec.stats.conflicts.fetch_add(1, Ordering::Relaxed);
            // Refused: the Else branch says where the key stands now.
            rev = resp
                .op_responses()
                .into_iter()
                .find_map(|r| match r {
                    TxnOpResponse::Get(g) => Some(g.kvs().first().map_or(0, |kv| kv.mod_revision())),
                    _ => None,
                })
                .unwrap_or(0);
            if rev == 0 {
                self.known.remove(&k);
            } else {
                self.known.insert(k, rev);
            }
            // An update retries against the new revision; a create or a delete of a key that
            // changed under it gives up (the next write decides again).
            if create || delete || rev == 0 || attempt == CONFLICT_RETRIES {
                return Outcome::Done;
            }
        }
        Outcome::Done
    }

    /// Puts a key attached to the client's lease, granting one when it has none; after
    /// [`KEYS_PER_LEASE`] keys the lease is revoked (every other lease) or abandoned to expire.
    pub(super) async fn lease_put(&mut self, c: &mut Client) -> Outcome {
        let timeout = self.cfg.timeout;
        let (id, n) = match self.lease {
            Some(l) => l,
            None => {
                let at = self.rec.now_ms();
                let ttl = self.cfg.lease_ttl.as_secs().max(1) as i64;
                match bounded("lease grant", timeout, c.lease_grant(ttl, None)).await {
                    Ok(g) => {
                        let mut leases = self.rec.leases.lock().expect("leases lock");
                        if leases.len() >= MAX_LEASE_RECORDS {
                            leases.remove(0);
                        }
                        leases.push(LeaseRecord {
                            id: g.id(),
                            ttl_ms: g.ttl().max(0) as u64 * 1000,
                            granted_at_ms: at,
                            keys: vec![],
                            revoke: Revoke::No,
                            kept_alive_at_ms: 0,
                        });
                        (g.id(), 0)
                    }
                    Err(e) => {
                        tracing::trace!("workload lease grant failed: {e}");
                        return Outcome::Reconnect;
                    }
                }
            }
        };
        if n >= KEYS_PER_LEASE {
            self.lease = None;
            if id % 2 == 0 {
                // In doubt from the moment it is sent, acknowledged once answered.
                self.set_lease(id, |r| r.revoke = Revoke::Unknown);
                let res = bounded("lease revoke", timeout, c.lease_revoke(id)).await;
                if res.is_ok() {
                    self.set_lease(id, |r| r.revoke = Revoke::Acked);
                }
                return if res.is_ok() { Outcome::Done } else { Outcome::Reconnect };
            }
            return Outcome::Done;
        }
        self.seq += 1;
        let key = format!("{}{id:x}/{n}", self.leases);
        let opts = (!self.bugs.lease_keys_unattached).then(|| PutOptions::new().with_lease(id));
        self.rec.stats.lease_puts.fetch_add(1, Ordering::Relaxed);
        match bounded("lease put", timeout, c.put(key.as_str(), format!("c{}-{}", self.id, self.seq), opts)).await {
            Ok(_) => {
                self.set_lease(id, |r| r.keys.push(key));
                self.lease = Some((id, n + 1));
                Outcome::Done
            }
            Err(e) => {
                // The lease may have expired (a long outage) or the connection broke: a new
                // lease next time.
                tracing::trace!("workload lease put failed: {e}");
                self.lease = None;
                Outcome::Reconnect
            }
        }
    }

    /// Renews the client's lease once (one request on etcd's keep-alive stream), or grants one
    /// and puts a key when it has none. Once etcd answers with a TTL the lease cannot expire
    /// before the request was sent + its TTL; a TTL of 0 says it expired: the next lease put
    /// grants another.
    pub(super) async fn keep_alive(&mut self, c: &mut Client) -> Outcome {
        let Some((id, _)) = self.lease else { return self.lease_put(c).await };
        let at = self.rec.now_ms();
        self.rec.stats.keep_alives.fetch_add(1, Ordering::Relaxed);
        let renew = async {
            let (_keeper, mut stream) = c.lease_keep_alive(id).await?;
            stream.message().await
        };
        match bounded("lease keep-alive", self.cfg.timeout, renew).await {
            Ok(Some(r)) if r.ttl() > 0 => {
                self.set_lease(id, |l| l.kept_alive_at_ms = l.kept_alive_at_ms.max(at));
                Outcome::Done
            }
            Ok(_) => {
                self.lease = None;
                Outcome::Done
            }
            Err(e) => {
                tracing::trace!("workload lease keep-alive failed: {e}");
                Outcome::Reconnect
            }
        }
    }

    /// Planted bug serializable-reads: reads `key` back from the client's own member, as a
    /// serializable read the history records as linearizable.
    async fn read_own(&mut self, key: &str) {
        let Some(mut c) = self.own_client().await else { return };
        let sent = self.rec.requests.read_sent();
        match bounded("get", self.cfg.timeout, c.get(key, Some(GetOptions::new().with_serializable()))).await {
            Ok(r) => {
                let kv = r.kvs().first().map(history_kv);
                let answer = ReadAnswer { revision: r.header().map_or(0, |h| h.revision()), kv };
                let member = r.header().map(|h| member_hex(h.member_id()));
                let get = Request::Get { key: key.to_string(), serializable: false, answer: Some(answer) };
                self.rec.requests.reads(u64::from(self.id), sent, member, vec![get]);
            }
            Err(_) => self.own = None,
        }
    }

    /// Planted bug serializable-reads: the connection to the client's own member (made when
    /// there is none; `None` when it cannot be).
    async fn own_client(&mut self) -> Option<Client> {
        if self.own.is_none() {
            self.own = connect(self.own_member.as_ref()?, self.cfg.timeout).await.ok();
        }
        self.own.clone()
    }

    /// The keys of the keyspace a list's page answered for (those after the previous page's
    /// last key `after`, all the rest or those up to its own last key when there are more pages),
    /// each with what the page held for it. `serializable`: the page is a read at `revision`
    /// (a serializable first page, or a later page pinned to the first one's revision), judged
    /// as the state at that revision rather than as a linearizable read.
    fn page_gets(&self, page: &etcd_client::GetResponse, after: Option<&[u8]>, revision: i64, serializable: bool) -> Vec<Request> {
        let found: HashMap<&[u8], &etcd_client::KeyValue> = page.kvs().iter().map(|kv| (kv.key(), kv)).collect();
        let last = page.kvs().last().map(|kv| kv.key().to_vec());
        (0..self.cfg.keyspace)
            .map(|k| self.key(k))
            .filter(|key| after.is_none_or(|a| key.as_bytes() > a))
            .filter(|key| !page.more() || last.as_deref().is_some_and(|l| key.as_bytes() <= l))
            .map(|key| {
                let kv = found.get(key.as_bytes()).map(|kv| history_kv(kv));
                Request::Get { key, serializable, answer: Some(ReadAnswer { revision, kv }) }
            })
            .collect()
    }

    fn set_lease(&self, id: i64, f: impl FnOnce(&mut LeaseRecord)) {
        if let Some(r) = self.rec.leases.lock().expect("leases lock").iter_mut().rev().find(|r| r.id == id) {
            f(r);
        }
    }

    /// Lists the object keys page by page at the revision of the first page, the way a paginated
    /// LIST does, and records what is inconsistent: a key out of order or repeated across pages,
    /// an entry newer than the pinned revision.
    pub(super) async fn list(&mut self, c: &mut Client) -> Outcome {
        self.rec.stats.lists.fetch_add(1, Ordering::Relaxed);
        let timeout = self.cfg.timeout;
        let end = prefix_end(&self.objects);
        let mut from = self.objects.clone().into_bytes();
        let mut pinned = 0;
        let mut last: Option<Vec<u8>> = None;
        // Planted bug serializable-reads: the list goes to the client's own member, which
        // answers from its own store.
        let planted = self.bugs.serializable_reads;
        let mut own = if planted { self.own_client().await } else { None };
        if planted && own.is_none() {
            return Outcome::Done;
        }
        // Otherwise some lists start with an honest serializable read, recorded as one.
        let honest = !planted && self.rng.below(100) < SERIALIZABLE_LIST_PERCENT;
        loop {
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if pinned > 0 {
                opts = opts.with_revision(pinned);
            } else if planted || honest {
                opts = opts.with_serializable();
            }
            let c = match own.as_mut() {
                Some(o) => o,
                None => &mut *c,
            };
            let sent = self.rec.requests.read_sent();
            let page = match bounded("list", timeout, c.get(from.clone(), Some(opts))).await {
                Ok(p) => p,
                // Compacted, a timeout, a dead member: the list is abandoned, like a client
                // would relist.
                Err(_) => {
                    self.own = None;
                    return Outcome::Reconnect;
                }
            };
            // Into the history, one get per key of the keyspace the page covers. The first page
            // is a linearizable read (or a serializable one); later pages read the state at the
            // first page's revision, which is what a serializable read is judged against too.
            let member = page.header().map(|h| member_hex(h.member_id()));
            if pinned == 0 {
                pinned = page.header().map_or(0, |h| h.revision());
                self.rec.requests.reads(u64::from(self.id), sent, member, self.page_gets(&page, None, pinned, honest));
            } else if honest {
                self.rec.requests.reads(u64::from(self.id), sent, member, self.page_gets(&page, last.as_deref(), pinned, true));
            }
            for kv in page.kvs() {
                if last.as_deref().is_some_and(|l| kv.key() <= l) {
                    self.rec.anomaly(format!(
                        "list at revision {pinned}: key {} after {}",
                        String::from_utf8_lossy(kv.key()),
                        String::from_utf8_lossy(last.as_deref().unwrap_or_default())
                    ));
                }
                if kv.mod_revision() > pinned {
                    self.rec.anomaly(format!(
                        "list at revision {pinned}: key {} has mod revision {}",
                        String::from_utf8_lossy(kv.key()),
                        kv.mod_revision()
                    ));
                }
                last = Some(kv.key().to_vec());
            }
            match (page.more(), &last) {
                (true, Some(l)) => {
                    from = l.clone();
                    from.push(0);
                }
                _ => return Outcome::Done,
            }
        }
    }
}

/// A key's value as etcd answered it, as the history records it.
pub(super) fn history_kv(kv: &etcd_client::KeyValue) -> HistoryKv {
    HistoryKv {
        value: String::from_utf8_lossy(kv.value()).into_owned(),
        mod_revision: kv.mod_revision(),
        create_revision: Some(kv.create_revision()),
        version: Some(kv.version()),
    }
}

/// The key the `Else` branch of a refused transaction read, as the history records it.
fn else_kv(r: &etcd_client::TxnResponse) -> Option<HistoryKv> {
    r.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().map(history_kv),
        _ => None,
    })
}

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}
