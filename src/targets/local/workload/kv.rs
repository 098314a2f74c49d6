//! The `kv` workload: etcd's whole key-value API on the `kube` workload's object keys.
//!
//! Each client draws its next request from `[workload.kv]`: a plain put, get (linearizable or
//! serializable) or delete of one key; a range over up to 20 consecutive keys (linearizable,
//! serializable, with a limit, keys-only, at an older revision, or read whole, keys-only and
//! count-only in one transaction); a delete-range with `prev_kv`; a transaction over several keys
//! (compares on value, version, create and mod revision, puts and deletes, the compared keys
//! read in both branches, sometimes a range at an older revision); or what a `kube` client does
//! (guarded writes, lease puts and keep-alives, paginated lists). The compactor and the watchers
//! are `kube`'s, except that each watcher starts a new session every few seconds from a drawn
//! revision: the current one, one in the past (sometimes compacted away: etcd must say so) or
//! one in the future (`watch.rs`).
//!
//! Into the history (`history/src/format.rs`) a request over several keys goes as one line per
//! key it covers, the lines sharing a group:
//!
//! - a range: a get per key of the keyspace it covers, at its header revision (linearizable or
//!   serializable), or a get-at for a keys-only range or one at an older revision;
//! - a delete-range: a delete per key it covers (deleted 1 or 0), and for each deleted key a
//!   get-at of its `prev_kv` at the revision before;
//! - a transaction: its writes at its revision, its reads of the keys it compares as gets at the
//!   revision before its own write (the branch's ranges come first, and etcd serves a
//!   transaction's ranges from the store as it was before the transaction's first change), its
//!   range at an older revision as a get-at.
//!
//! What an answer says about itself is checked here and reported as an anomaly (`durability`):
//! a transaction whose reads of the keys it compared contradict the branch it took, a
//! delete-range whose count is not its `prev_kv`s, a limited range past its limit or out of
//! order, and the three views of one range at one revision disagreeing.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, GetOptions, GetResponse, Txn, TxnOp, TxnOpResponse};
use shakedown_faults::KvMix;
use shakedown_history::format::{DeleteAnswer, Kv as HistoryKv, ReadAnswer, Request, WriteAnswer};
use shakedown_invariants::{Ack, Unknown};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::kube::{compactor_and_watchers, history_kv, ObjectClient, Outcome, Start};
use super::{member_hex, pause, unix_ms, Recorder, RECONNECT_PAUSE};
use crate::targets::local::etcd::{bounded, connect, EtcdError};

/// The most keys one range covers.
const RANGE_KEYS: u64 = 20;
/// The most keys one delete-range covers.
const DELETE_RANGE_KEYS: u64 = 10;
/// The most keys a transaction compares, and the most it writes.
const TXN_KEYS: u64 = 3;
/// How far below the highest revision it has seen a read at an older revision goes, at most.
const OLDER_BY: u64 = 200;

/// Starts the clients, the compactor and the watchers.
pub(super) fn start(s: &Start) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for i in 0..s.cfg.clients {
        let c = KvClient { inner: ObjectClient::new(i, s), mix: s.cfg.kv, epoch_seen: (0, 0, 0), seen: HashMap::new() };
        tasks.push(tokio::spawn(c.run(s.stopped.clone())));
    }
    tasks.extend(compactor_and_watchers(s));
    tasks
}

struct KvClient {
    /// The `kube` client whose keys, counters and requests this one shares.
    inner: ObjectClient,
    mix: KvMix,
    /// The history's epoch (restores from a backup) and the lowest and highest header revision
    /// this client has seen in it: a transaction's range at an older revision stays between
    /// them, where the restored store has neither compacted nor not yet reached it; a plain
    /// range at an older revision goes below the highest (not below one seen before a restore,
    /// which the restored store may not have reached).
    epoch_seen: (u32, i64, i64),
    /// What this client last saw of each key (`None`: absent): its compares are drawn from it.
    seen: HashMap<u32, Option<HistoryKv>>,
}

/// What a compare looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Value,
    Version,
    Create,
    Mod,
}

/// One compare of a transaction, as sent.
#[derive(Debug, Clone)]
struct Cmp {
    k: u32,
    target: Target,
    op: CompareOp,
    /// The value compared with (`Target::Value`).
    value: String,
    /// The number compared with (the other targets).
    n: i64,
}

impl Cmp {
    fn etcd(&self, key: &str) -> Compare {
        match self.target {
            Target::Value => Compare::value(key, self.op, self.value.as_str()),
            Target::Version => Compare::version(key, self.op, self.n),
            Target::Create => Compare::create_revision(key, self.op, self.n),
            Target::Mod => Compare::mod_revision(key, self.op, self.n),
        }
    }

    /// Whether it holds for a key in state `kv` (`None`: absent), as etcd evaluates it: a value
    /// compare of an absent key never holds; the other targets read 0 for an absent key.
    fn holds(&self, kv: Option<&HistoryKv>) -> bool {
        let ord = match (self.target, kv) {
            (Target::Value, None) => return false,
            (Target::Value, Some(kv)) => kv.value.as_bytes().cmp(self.value.as_bytes()),
            (Target::Version, kv) => kv.and_then(|k| k.version).unwrap_or(0).cmp(&self.n),
            (Target::Create, kv) => kv.and_then(|k| k.create_revision).unwrap_or(0).cmp(&self.n),
            (Target::Mod, kv) => kv.map_or(0, |k| k.mod_revision).cmp(&self.n),
        };
        match self.op {
            CompareOp::Equal => ord.is_eq(),
            CompareOp::NotEqual => ord.is_ne(),
            CompareOp::Greater => ord.is_gt(),
            CompareOp::Less => ord.is_lt(),
        }
    }

    fn text(&self) -> String {
        let op = match self.op {
            CompareOp::Equal => "=",
            CompareOp::NotEqual => "!=",
            CompareOp::Greater => ">",
            CompareOp::Less => "<",
        };
        match self.target {
            Target::Value => format!("value {op} {:?}", self.value),
            Target::Version => format!("version {op} {}", self.n),
            Target::Create => format!("create revision {op} {}", self.n),
            Target::Mod => format!("mod revision {op} {}", self.n),
        }
    }
}

/// A write of a transaction: a put of a value, or a delete.
struct TxnWrite {
    k: u32,
    key: String,
    value: Option<String>,
}

/// Whether etcd refused a read at a revision it no longer has (compacted) or does not have yet
/// (a store restored from an older backup): declared, nothing done, the connection fine.
fn refused_revision(e: &EtcdError) -> bool {
    let text = e.to_string();
    text.contains("required revision has been compacted") || text.contains("required revision is a future revision")
}

fn header_of(h: Option<&etcd_client::ResponseHeader>) -> (i64, Option<String>) {
    (h.map_or(0, |h| h.revision()), h.map(|h| member_hex(h.member_id())))
}

impl KvClient {
    async fn run(mut self, mut stopped: watch::Receiver<bool>) {
        let mut client: Option<Client> = None;
        let weights = self.mix.weights();
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        while !*stopped.borrow() {
            if client.is_none() {
                client = connect(self.inner.endpoint(), self.inner.cfg.timeout).await.ok();
            }
            let Some(c) = client.as_mut() else {
                self.inner.rec.stats.failed.fetch_add(1, Ordering::Relaxed);
                pause(RECONNECT_PAUSE, &mut stopped).await;
                continue;
            };
            let mut pick = self.inner.rng.below(total);
            let mut which = 0;
            while pick >= u64::from(weights[which]) {
                pick -= u64::from(weights[which]);
                which += 1;
            }
            self.inner.rec.stats.kv_draws.fetch_add(1, Ordering::Relaxed);
            if which < 7 {
                self.inner.rec.stats.kv_requests.fetch_add(1, Ordering::Relaxed);
            }
            let outcome = match which {
                0 => self.put(c).await,
                1 => self.get(c).await,
                2 => self.delete(c).await,
                3 => self.range(c).await,
                4 => self.delete_range(c).await,
                5 => self.txn(c, false).await,
                6 => self.txn(c, true).await,
                7 => {
                    let pick = self.inner.rng.next();
                    self.inner.write(c, pick).await
                }
                // One lease request in three renews the lease in use.
                8 if self.inner.rng.below(3) == 0 => self.inner.keep_alive(c).await,
                8 => self.inner.lease_put(c).await,
                _ => self.inner.list(c).await,
            };
            if matches!(outcome, Outcome::Reconnect) {
                client = None;
            }
            pause(self.inner.cfg.interval, &mut stopped).await;
        }
    }

    fn id(&self) -> u64 {
        u64::from(self.inner.id)
    }

    fn rec(&self) -> Arc<Recorder> {
        self.inner.rec.clone()
    }

    /// A value nobody else writes.
    fn value(&mut self) -> String {
        self.inner.seq += 1;
        format!("c{}-{}", self.inner.id, self.inner.seq)
    }

    /// `n` distinct keys from the client's picks (fewer when the keyspace is smaller).
    fn distinct_keys(&mut self, n: u64) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for _ in 0..n * 3 {
            if out.len() as u64 == n {
                break;
            }
            let k = self.inner.pick_key();
            if !out.contains(&k) {
                out.push(k);
            }
        }
        out
    }

    /// Up to `most` consecutive keys from a random one: `[lo, hi)`.
    fn window(&mut self, least: u64, most: u64) -> (u32, u32) {
        let n = self.inner.cfg.keyspace;
        let lo = self.inner.rng.below(u64::from(n)) as u32;
        let w = least + self.inner.rng.below(most - least + 1);
        (lo, (u64::from(lo) + w).min(u64::from(n)) as u32)
    }

    fn saw(&mut self, revision: i64) {
        let epoch = self.inner.rec.requests.epoch();
        let (e, lo, hi) = &mut self.epoch_seen;
        if *e != epoch || *lo == 0 {
            *e = epoch;
            *lo = revision;
            *hi = revision;
        }
        *lo = (*lo).min(revision);
        *hi = (*hi).max(revision);
    }

    /// A revision for a transaction's range at an older revision: at or above every compaction
    /// asked for and the lowest revision seen since the last restore, at most the highest seen
    /// since (`None`: no such revision yet). With `compacted`, one below the last compaction
    /// asked for instead (etcd must refuse the transaction).
    fn older_for_txn(&mut self, compacted: bool) -> Option<i64> {
        let floor = self.inner.rec.compaction_floor.load(Ordering::SeqCst);
        let (epoch, lo, hi) = self.epoch_seen;
        if epoch != self.inner.rec.requests.epoch() || hi == 0 {
            return None;
        }
        if compacted {
            return (floor > 1).then(|| (floor - 1 - self.inner.rng.below(OLDER_BY) as i64).max(1));
        }
        let lo = lo.max(floor).max(hi - OLDER_BY as i64);
        (lo <= hi).then(|| lo + self.inner.rng.below((hi - lo + 1) as u64) as i64)
    }

    /// A key's state as an answer gave it, for the compares to come.
    fn learn(&mut self, k: u32, kv: Option<HistoryKv>) {
        self.seen.insert(k, kv);
    }

    async fn put(&mut self, c: &mut Client) -> Outcome {
        let rec = self.rec();
        let k = self.inner.pick_key();
        let key = self.inner.key(k);
        let value = self.value();
        self.inner.forget(k);
        let start = rec.position();
        rec.stats.attempted.fetch_add(1, Ordering::Relaxed);
        // No compare on the key guards it: without an answer it may apply after any later write
        // of the key (a proposal still queued in raft when the client gave up).
        let ticket = rec.send(Unknown { key: key.clone(), value: Some(value.clone()), start, any_time: true });
        let request = |answer| Request::Put { key: key.clone(), value: value.clone(), answer };
        let sent = rec.requests.send(self.id(), request(None));
        let (at, t) = (unix_ms(), Instant::now());
        let res = bounded("put", self.inner.cfg.timeout, c.put(key.as_str(), value.as_str(), None)).await;
        rec.sample(at, t.elapsed(), res.is_ok());
        match res {
            Ok(r) => {
                let (revision, member) = header_of(r.header());
                rec.requests.end(sent, request(Some(WriteAnswer { revision })), member);
                rec.answered(ticket, Some(Ack { key: key.clone(), value: Some(value.clone()), revision, start }));
                self.saw(revision);
                self.learn(k, Some(HistoryKv { value, mod_revision: revision, create_revision: None, version: None }));
                Outcome::Done
            }
            Err(e) => {
                tracing::trace!("kv put of {key} failed: {e}");
                rec.requests.end(sent, request(None), None);
                rec.failed(ticket);
                Outcome::Reconnect
            }
        }
    }

    async fn get(&mut self, c: &mut Client) -> Outcome {
        let rec = self.rec();
        let k = self.inner.pick_key();
        let key = self.inner.key(k);
        let serializable = self.inner.rng.below(4) == 0;
        let sent = rec.requests.read_sent();
        let opts = serializable.then(|| GetOptions::new().with_serializable());
        match bounded("get", self.inner.cfg.timeout, c.get(key.as_str(), opts)).await {
            Ok(r) => {
                let (revision, member) = header_of(r.header());
                let kv = r.kvs().first().map(history_kv);
                self.saw(revision);
                self.learn(k, kv.clone());
                rec.requests.reads(
                    self.id(),
                    sent,
                    member,
                    vec![Request::Get { key, serializable, answer: Some(ReadAnswer { revision, kv }) }],
                );
                Outcome::Done
            }
            Err(_) => Outcome::Reconnect,
        }
    }

    async fn delete(&mut self, c: &mut Client) -> Outcome {
        let rec = self.rec();
        let k = self.inner.pick_key();
        let key = self.inner.key(k);
        self.inner.forget(k);
        let start = rec.position();
        rec.stats.attempted.fetch_add(1, Ordering::Relaxed);
        let ticket = rec.send(Unknown { key: key.clone(), value: None, start, any_time: true });
        let request = |answer| Request::Delete { key: key.clone(), answer };
        let sent = rec.requests.send(self.id(), request(None));
        let (at, t) = (unix_ms(), Instant::now());
        let res = bounded("delete", self.inner.cfg.timeout, c.delete(key.as_str(), None)).await;
        rec.sample(at, t.elapsed(), res.is_ok());
        match res {
            Ok(r) => {
                let (revision, member) = header_of(r.header());
                let deleted = r.deleted();
                rec.requests.end(sent, request(Some(DeleteAnswer { revision, deleted })), member);
                rec.answered(ticket, (deleted > 0).then(|| Ack { key: key.clone(), value: None, revision, start }));
                self.saw(revision);
                self.learn(k, None);
                Outcome::Done
            }
            Err(e) => {
                tracing::trace!("kv delete of {key} failed: {e}");
                rec.requests.end(sent, request(None), None);
                rec.failed(ticket);
                Outcome::Reconnect
            }
        }
    }

    /// One line per key of `[lo, hi)`: what `kvs` held for it (absent when not there), as
    /// `line` makes it; only the keys up to `upto` (the last key returned, when more remain).
    fn lines(
        &self,
        lo: u32,
        hi: u32,
        kvs: &[etcd_client::KeyValue],
        upto: Option<&[u8]>,
        line: impl Fn(String, Option<HistoryKv>) -> Request,
    ) -> Vec<Request> {
        let found: HashMap<&[u8], &etcd_client::KeyValue> = kvs.iter().map(|kv| (kv.key(), kv)).collect();
        (lo..hi)
            .map(|k| self.inner.key(k))
            .filter(|key| upto.is_none_or(|u| key.as_bytes() <= u))
            .map(|key| {
                let kv = found.get(key.as_bytes()).map(|kv| history_kv(kv));
                line(key, kv)
            })
            .collect()
    }

    /// What a range's answer says about itself: keys in order and inside the range, no more
    /// than the limit, a count at least what it returned (equal when nothing more remains).
    fn range_anomalies(&self, what: &str, r: &GetResponse, lo: u32, hi: u32, limit: i64) {
        let (lo_key, hi_key) = (self.inner.key(lo), self.inner.key(hi));
        let mut last: Option<&[u8]> = None;
        for kv in r.kvs() {
            if last.is_some_and(|l| kv.key() <= l) || kv.key() < lo_key.as_bytes() || kv.key() >= hi_key.as_bytes() {
                self.inner.rec.anomaly(format!(
                    "{what} [{lo_key}, {hi_key}): key {} out of order or outside the range",
                    String::from_utf8_lossy(kv.key())
                ));
            }
            last = Some(kv.key());
        }
        let n = r.kvs().len() as i64;
        if limit > 0 && n > limit {
            self.inner.rec.anomaly(format!("{what} [{lo_key}, {hi_key}) with limit {limit} returned {n} keys"));
        }
        if r.count() < n || (!r.more() && r.count() != n) {
            self.inner.rec.anomaly(format!("{what} [{lo_key}, {hi_key}): count {} with {n} keys returned (more: {})", r.count(), r.more()));
        }
    }

    async fn range(&mut self, c: &mut Client) -> Outcome {
        let rec = self.rec();
        let (lo, hi) = self.window(1, RANGE_KEYS);
        let (from, end) = (self.inner.key(lo), self.inner.key(hi));
        let timeout = self.inner.cfg.timeout;
        let variant = self.inner.rng.below(6);
        if variant == 5 {
            return self.three_views(c, lo, hi).await;
        }
        let mut opts = GetOptions::new().with_range(end.as_str());
        let mut limit = 0;
        let mut older = 0;
        let what = match variant {
            0 => "range",
            1 => {
                opts = opts.with_serializable();
                "serializable range"
            }
            2 => {
                limit = 1 + self.inner.rng.below(u64::from(hi - lo)) as i64;
                opts = opts.with_limit(limit);
                "limited range"
            }
            3 => {
                opts = opts.with_keys_only();
                "keys-only range"
            }
            _ => {
                let (epoch, _, highest) = self.epoch_seen;
                let highest = if epoch == self.inner.rec.requests.epoch() { highest } else { 0 };
                older = (highest - 1 - self.inner.rng.below(OLDER_BY) as i64).max(1);
                opts = opts.with_revision(older);
                "range at an older revision"
            }
        };
        let sent = rec.requests.read_sent();
        let r = match bounded("range", timeout, c.get(from.as_str(), Some(opts))).await {
            Ok(r) => r,
            Err(e) if older > 0 && refused_revision(&e) => {
                rec.stats.compacted_reads.fetch_add(1, Ordering::Relaxed);
                return Outcome::Done;
            }
            Err(_) => return Outcome::Reconnect,
        };
        let (revision, member) = header_of(r.header());
        self.saw(revision);
        self.range_anomalies(what, &r, lo, hi, limit);
        let upto = (limit > 0 && r.more()).then(|| r.kvs().last().map(|kv| kv.key().to_vec())).flatten();
        let lines = match variant {
            0 | 2 => self.lines(lo, hi, r.kvs(), upto.as_deref(), |key, kv| Request::Get {
                key,
                serializable: false,
                answer: Some(ReadAnswer { revision, kv }),
            }),
            1 => self.lines(lo, hi, r.kvs(), None, |key, kv| Request::Get {
                key,
                serializable: true,
                answer: Some(ReadAnswer { revision, kv }),
            }),
            3 => self.lines(lo, hi, r.kvs(), None, |key, kv| Request::GetAt {
                key,
                at: revision,
                keys_only: true,
                answer: Some(ReadAnswer { revision, kv }),
            }),
            _ => self.lines(lo, hi, r.kvs(), None, |key, kv| Request::GetAt {
                key,
                at: older,
                keys_only: false,
                answer: Some(ReadAnswer { revision, kv }),
            }),
        };
        if variant == 0 {
            for (k, line) in (lo..hi).zip(&lines) {
                if let Request::Get { answer: Some(a), .. } = line {
                    self.learn(k, a.kv.clone());
                }
            }
        }
        rec.requests.reads(self.id(), sent, member, lines);
        Outcome::Done
    }

    /// One read-only transaction that reads `[lo, hi)` whole, keys-only and count-only: three
    /// views of the store at one revision, which must agree.
    async fn three_views(&mut self, c: &mut Client, lo: u32, hi: u32) -> Outcome {
        let rec = self.rec();
        let (from, end) = (self.inner.key(lo), self.inner.key(hi));
        let range = || GetOptions::new().with_range(end.as_str());
        let txn = Txn::new().and_then([
            TxnOp::get(from.as_str(), Some(range())),
            TxnOp::get(from.as_str(), Some(range().with_keys_only())),
            TxnOp::get(from.as_str(), Some(range().with_count_only())),
        ]);
        let sent = rec.requests.read_sent();
        let r = match bounded("txn", self.inner.cfg.timeout, c.txn(txn)).await {
            Ok(r) => r,
            Err(_) => return Outcome::Reconnect,
        };
        let (revision, member) = header_of(r.header());
        self.saw(revision);
        let gets: Vec<GetResponse> = r
            .op_responses()
            .into_iter()
            .filter_map(|o| match o {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let [whole, keys, count] = gets.as_slice() else {
            rec.anomaly(format!("a read-only transaction of three ranges at revision {revision} answered {} of them", gets.len()));
            return Outcome::Done;
        };
        self.range_anomalies("range in a transaction", whole, lo, hi, 0);
        let shape = |g: &GetResponse| g.kvs().iter().map(|kv| (kv.key().to_vec(), kv.mod_revision(), kv.version())).collect::<Vec<_>>();
        if shape(keys) != shape(whole) || keys.kvs().iter().any(|kv| !kv.value().is_empty()) {
            rec.anomaly(format!(
                "transaction at revision {revision}: the keys-only range of [{from}, {end}) returned {} keys, the whole range {} (or their revisions or values differ)",
                keys.kvs().len(),
                whole.kvs().len()
            ));
        }
        if count.count() != whole.kvs().len() as i64 || !count.kvs().is_empty() {
            rec.anomaly(format!(
                "transaction at revision {revision}: the count-only range of [{from}, {end}) counted {} keys, the whole range returned {}",
                count.count(),
                whole.kvs().len()
            ));
        }
        let lines = self.lines(lo, hi, whole.kvs(), None, |key, kv| Request::Get {
            key,
            serializable: false,
            answer: Some(ReadAnswer { revision, kv }),
        });
        rec.requests.reads(self.id(), sent, member, lines);
        Outcome::Done
    }

    async fn delete_range(&mut self, c: &mut Client) -> Outcome {
        let rec = self.rec();
        let (lo, hi) = self.window(2, DELETE_RANGE_KEYS);
        let (from, end) = (self.inner.key(lo), self.inner.key(hi));
        let keys: Vec<String> = (lo..hi).map(|k| self.inner.key(k)).collect();
        let start = rec.position();
        rec.stats.attempted.fetch_add(1, Ordering::Relaxed);
        let tickets: Vec<u64> = keys.iter().map(|key| rec.send(Unknown { key: key.clone(), value: None, start, any_time: true })).collect();
        for k in lo..hi {
            self.inner.forget(k);
        }
        let unanswered: Vec<Request> = keys.iter().map(|key| Request::Delete { key: key.clone(), answer: None }).collect();
        let sent = rec.requests.send_group(self.id(), unanswered.clone());
        let (at, t) = (unix_ms(), Instant::now());
        let opts = DeleteOptions::new().with_range(end.as_str()).with_prev_key();
        let res = bounded("delete range", self.inner.cfg.timeout, c.delete(from.as_str(), Some(opts))).await;
        rec.sample(at, t.elapsed(), res.is_ok());
        let r = match res {
            Ok(r) => r,
            Err(e) => {
                tracing::trace!("kv delete-range [{from}, {end}) failed: {e}");
                rec.requests.end_group(sent, unanswered, vec![], None);
                for t in tickets {
                    rec.failed(t);
                }
                return Outcome::Reconnect;
            }
        };
        let (revision, member) = header_of(r.header());
        self.saw(revision);
        let prev: HashMap<&[u8], &etcd_client::KeyValue> = r.prev_kvs().iter().map(|kv| (kv.key(), kv)).collect();
        if r.deleted() != prev.len() as i64 || prev.keys().any(|k| *k < from.as_bytes() || *k >= end.as_bytes()) {
            rec.anomaly(format!(
                "delete-range of [{from}, {end}) at revision {revision} deleted {} keys but returned {} prev_kvs (or one outside the range)",
                r.deleted(),
                prev.len()
            ));
        }
        let mut writes = Vec::new();
        let mut reads = Vec::new();
        for ((k, key), ticket) in (lo..hi).zip(&keys).zip(tickets) {
            let before = prev.get(key.as_bytes());
            writes
                .push(Request::Delete { key: key.clone(), answer: Some(DeleteAnswer { revision, deleted: i64::from(before.is_some()) }) });
            if let Some(kv) = before {
                reads.push(Request::GetAt {
                    key: key.clone(),
                    at: revision - 1,
                    keys_only: false,
                    answer: Some(ReadAnswer { revision, kv: Some(history_kv(kv)) }),
                });
            }
            rec.answered(ticket, before.map(|_| Ack { key: key.clone(), value: None, revision, start }));
            self.learn(k, None);
        }
        rec.requests.end_group(sent, writes, reads, member);
        Outcome::Done
    }

    /// A compare of key `k`, drawn against what the client last saw of it (so it holds about as
    /// often as not).
    fn draw_compare(&mut self, k: u32) -> Cmp {
        let seen = self.seen.get(&k).cloned().flatten();
        let target = [Target::Value, Target::Version, Target::Create, Target::Mod][self.inner.rng.below(4) as usize];
        let op = match (target, self.inner.rng.below(4)) {
            (Target::Value, n) => [CompareOp::Equal, CompareOp::NotEqual][n as usize % 2],
            (_, n) => [CompareOp::Equal, CompareOp::NotEqual, CompareOp::Greater, CompareOp::Less][n as usize],
        };
        let s = seen.as_ref();
        Cmp {
            k,
            target,
            op,
            value: s.map_or_else(|| "absent".to_string(), |kv| kv.value.clone()),
            n: match target {
                Target::Value => 0,
                Target::Version => s.and_then(|kv| kv.version).unwrap_or(0),
                Target::Create => s.and_then(|kv| kv.create_revision).unwrap_or(0),
                Target::Mod => s.map_or(0, |kv| kv.mod_revision),
            },
        }
    }

    /// A transaction over several keys; with `compacted` its range reads below the last
    /// compaction (`txn_compacted`).
    async fn txn(&mut self, c: &mut Client, compacted: bool) -> Outcome {
        let rec = self.rec();
        // No compaction is asked for while the range's revision is drawn and the transaction is
        // in flight (one asked for earlier is in the floor the revision is drawn above).
        let _gate = rec.compaction_gate.read().await;
        let n = 1 + self.inner.rng.below(TXN_KEYS);
        let compared = self.distinct_keys(n);
        let cmps: Vec<Cmp> = compared.iter().map(|&k| self.draw_compare(k)).collect();
        let n = 1 + self.inner.rng.below(TXN_KEYS);
        let written = self.distinct_keys(n);
        let mut writes = Vec::new();
        for k in written {
            let value = (self.inner.rng.below(4) != 0).then(|| self.value());
            writes.push(TxnWrite { k, key: self.inner.key(k), value });
        }
        // Now and then a range of one key at an older revision, in both branches.
        let older = if compacted || self.inner.rng.below(3) == 0 {
            self.older_for_txn(compacted).map(|at| (self.inner.pick_key(), at))
        } else {
            None
        };
        if compacted && older.is_none() {
            // Nothing compacted yet: nothing to ask for.
            return Outcome::Done;
        }
        let mut reads: Vec<TxnOp> = cmps.iter().map(|c| TxnOp::get(self.inner.key(c.k), None)).collect();
        if let Some((k, at)) = older {
            reads.push(TxnOp::get(self.inner.key(k), Some(GetOptions::new().with_revision(at))));
        }
        let mut then = reads.clone();
        for w in &writes {
            then.push(match &w.value {
                Some(v) => TxnOp::put(w.key.as_str(), v.as_str(), None),
                None => TxnOp::delete(w.key.as_str(), None),
            });
        }
        let txn = Txn::new().when(cmps.iter().map(|c| c.etcd(&self.inner.key(c.k))).collect::<Vec<_>>()).and_then(then).or_else(reads);
        let start = rec.position();
        rec.stats.attempted.fetch_add(1, Ordering::Relaxed);
        let tickets: Vec<u64> =
            writes.iter().map(|w| rec.send(Unknown { key: w.key.clone(), value: w.value.clone(), start, any_time: true })).collect();
        for w in &writes {
            self.inner.forget(w.k);
        }
        let line = |w: &TxnWrite, revision: Option<(i64, i64)>| match &w.value {
            Some(v) => {
                Request::Put { key: w.key.clone(), value: v.clone(), answer: revision.map(|(revision, _)| WriteAnswer { revision }) }
            }
            None => Request::Delete { key: w.key.clone(), answer: revision.map(|(revision, deleted)| DeleteAnswer { revision, deleted }) },
        };
        let unanswered: Vec<Request> = writes.iter().map(|w| line(w, None)).collect();
        let sent = rec.requests.send_group(self.id(), unanswered.clone());
        let (at, t) = (unix_ms(), Instant::now());
        let res = bounded("txn", self.inner.cfg.timeout, c.txn(txn)).await;
        rec.sample(at, t.elapsed(), res.is_ok());
        let r = match res {
            Ok(r) => r,
            Err(e) => {
                tracing::trace!("kv txn failed: {e}");
                let refused = refused_revision(&e);
                if refused {
                    rec.stats.compacted_reads.fetch_add(1, Ordering::Relaxed);
                    let keys: Vec<&str> = writes.iter().map(|w| w.key.as_str()).collect();
                    let at = older.map_or(0, |(_, at)| at);
                    let asked = if compacted { " (asked for: txn_compacted)" } else { "" };
                    rec.refused_txns.lock().expect("refused transactions lock").push(format!(
                        "a transaction writing {} with a range at revision {at}{asked}, refused by the member that received it ({e}) {:.3} s into the run",
                        keys.join(", "),
                        rec.t0.elapsed().as_secs_f64()
                    ));
                } else if let Some((_, at)) = older.filter(|_| !writes.is_empty()) {
                    let keys: Vec<&str> = writes.iter().map(|w| w.key.as_str()).collect();
                    rec.unanswered_txns.lock().expect("unanswered transactions lock").push((
                        at,
                        format!(
                            "a transaction writing {} with a range at revision {at}, unanswered ({e}) {:.3} s into the run",
                            keys.join(", "),
                            rec.t0.elapsed().as_secs_f64()
                        ),
                    ));
                }
                // Refused for its older range, it did nothing; judged as of unknown outcome all
                // the same (the most lenient reading).
                rec.requests.end_group(sent, unanswered, vec![], None);
                for t in tickets {
                    rec.failed(t);
                }
                return if refused { Outcome::Done } else { Outcome::Reconnect };
            }
        };
        let (revision, member) = header_of(r.header());
        self.saw(revision);
        let succeeded = r.succeeded();
        let responses = r.op_responses();
        let got = |i: usize| match responses.get(i) {
            Some(TxnOpResponse::Get(g)) => Some(g.kvs().first().map(history_kv)),
            _ => None,
        };
        let states: Vec<Option<Option<HistoryKv>>> = (0..cmps.len()).map(got).collect();
        let older_kv = older.map(|_| got(cmps.len()));
        let deleted: Vec<i64> = (0..writes.len())
            .map(|i| match responses.get(cmps.len() + usize::from(older.is_some()) + i) {
                Some(TxnOpResponse::Delete(d)) => d.deleted(),
                _ => 0,
            })
            .collect();
        let expected = cmps.len() + usize::from(older.is_some()) + if succeeded { writes.len() } else { 0 };
        let shown = |c: &Cmp| format!("{} {}", self.inner.key(c.k), c.text());
        if responses.len() != expected || states.iter().any(Option::is_none) || older_kv.as_ref().is_some_and(Option::is_none) {
            rec.anomaly(format!(
                "transaction at revision {revision} ({}) answered {} operations of its {} branch, which has {expected}",
                if succeeded { "succeeded" } else { "refused" },
                responses.len(),
                if succeeded { "then" } else { "else" }
            ));
        } else {
            let holds = cmps.iter().zip(&states).all(|(c, s)| c.holds(s.as_ref().and_then(|s| s.as_ref())));
            if holds != succeeded {
                let read: Vec<String> = cmps
                    .iter()
                    .zip(&states)
                    .map(|(c, s)| match s.as_ref().and_then(|s| s.as_ref()) {
                        Some(kv) => format!(
                            "{} = {:?} (mod {}, create {:?}, version {:?})",
                            self.inner.key(c.k),
                            kv.value,
                            kv.mod_revision,
                            kv.create_revision,
                            kv.version
                        ),
                        None => format!("{} absent", self.inner.key(c.k)),
                    })
                    .collect();
                rec.anomaly(format!(
                    "transaction at revision {revision} {} with compares [{}], but its own reads of those keys say [{}]",
                    if succeeded { "took its then branch" } else { "took its else branch" },
                    cmps.iter().map(shown).collect::<Vec<_>>().join(", "),
                    read.join("; ")
                ));
            }
        }
        let wrote = succeeded && writes.iter().zip(&deleted).any(|(w, &d)| w.value.is_some() || d > 0);
        let before = if wrote { revision - 1 } else { revision };
        let mut lines = Vec::new();
        for (c, s) in cmps.iter().zip(&states) {
            if let Some(kv) = s {
                lines.push(Request::Get {
                    key: self.inner.key(c.k),
                    serializable: false,
                    answer: Some(ReadAnswer { revision: before, kv: kv.clone() }),
                });
            }
        }
        if let (Some((k, at)), Some(Some(kv))) = (older, &older_kv) {
            lines.push(Request::GetAt {
                key: self.inner.key(k),
                at,
                keys_only: false,
                answer: Some(ReadAnswer { revision, kv: kv.clone() }),
            });
        }
        for (c, s) in cmps.iter().zip(states) {
            if let Some(kv) = s {
                self.learn(c.k, kv);
            }
        }
        let answered: Vec<Request> =
            if succeeded { writes.iter().zip(&deleted).map(|(w, &d)| line(w, Some((revision, d)))).collect() } else { vec![] };
        rec.requests.end_group(sent, answered, lines, member);
        for ((w, ticket), &d) in writes.iter().zip(tickets).zip(&deleted) {
            let ack = succeeded && (w.value.is_some() || d > 0);
            rec.answered(ticket, ack.then(|| Ack { key: w.key.clone(), value: w.value.clone(), revision, start }));
            if succeeded {
                let kv = w.value.clone().map(|value| HistoryKv { value, mod_revision: revision, create_revision: None, version: None });
                self.learn(w.k, kv);
            }
        }
        if !succeeded {
            rec.stats.conflicts.fetch_add(1, Ordering::Relaxed);
        }
        Outcome::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(value: &str, mod_revision: i64, create: i64, version: i64) -> HistoryKv {
        HistoryKv { value: value.into(), mod_revision, create_revision: Some(create), version: Some(version) }
    }

    fn cmp(target: Target, op: CompareOp, value: &str, n: i64) -> Cmp {
        Cmp { k: 0, target, op, value: value.into(), n }
    }

    #[test]
    fn compares_hold_as_etcd_evaluates_them() {
        let k = kv("b", 7, 3, 2);
        assert!(cmp(Target::Value, CompareOp::Equal, "b", 0).holds(Some(&k)));
        assert!(cmp(Target::Value, CompareOp::NotEqual, "a", 0).holds(Some(&k)));
        assert!(cmp(Target::Value, CompareOp::Greater, "a", 0).holds(Some(&k)), "values compare as bytes");
        assert!(cmp(Target::Mod, CompareOp::Equal, "", 7).holds(Some(&k)));
        assert!(cmp(Target::Mod, CompareOp::Less, "", 8).holds(Some(&k)));
        assert!(cmp(Target::Create, CompareOp::Equal, "", 3).holds(Some(&k)));
        assert!(cmp(Target::Version, CompareOp::Greater, "", 1).holds(Some(&k)));
        assert!(!cmp(Target::Version, CompareOp::Less, "", 2).holds(Some(&k)));
        // An absent key: a value compare never holds, not even `!=`; the others read 0.
        assert!(!cmp(Target::Value, CompareOp::NotEqual, "b", 0).holds(None));
        assert!(!cmp(Target::Value, CompareOp::Equal, "", 0).holds(None));
        assert!(cmp(Target::Mod, CompareOp::Equal, "", 0).holds(None));
        assert!(cmp(Target::Create, CompareOp::Less, "", 1).holds(None));
        assert!(cmp(Target::Version, CompareOp::NotEqual, "", 1).holds(None));
        assert!(!cmp(Target::Version, CompareOp::Greater, "", 0).holds(None));
    }

    #[test]
    fn a_compare_says_what_it_compares() {
        assert_eq!(cmp(Target::Value, CompareOp::NotEqual, "c1-4", 0).text(), "value != \"c1-4\"");
        assert_eq!(cmp(Target::Create, CompareOp::Greater, "", 12).text(), "create revision > 12");
    }

    #[test]
    fn a_refused_revision_is_told_from_other_errors() {
        let call = |msg: &str| EtcdError::Call { what: "txn".into(), source: etcd_client::Error::InvalidArgs(msg.into()) };
        assert!(refused_revision(&call("etcdserver: mvcc: required revision has been compacted")));
        assert!(refused_revision(&call("etcdserver: mvcc: required revision is a future revision")));
        assert!(!refused_revision(&call("etcdserver: request timed out")));
        assert!(!refused_revision(&EtcdError::Timeout { what: "txn".into(), bound: std::time::Duration::from_secs(1) }));
    }
}
