//! A Kubernetes API under test, shared by the targets that have one (the local `control-plane`
//! stack, the kube target's workload cluster): the API workload ([`ApiWorkload`]: kube-rs
//! clients and watches recording every acknowledgement) and the probes of `api-reachability`
//! ([`probe`]).
//!
//! Objects are ConfigMaps labelled with the run id in the run's namespace, named
//! `sd-<client>-<n>`, holding one value (`data.v`). Each object has one writer, so the order in
//! which a client's writes were acknowledged is the order the API applied them (a DELETE answers
//! with the object as it was, so a delete's revision is not known; `api-durability` judges such
//! keys in acknowledgement order). A create, an update (`metadata.resourceVersion` as the
//! precondition; a 409 re-reads the object and retries, within a budget) and a delete (the
//! `resourceVersion` precondition) are acknowledged with the revision the API answered, which is
//! etcd's revision.
//!
//! Every request also goes into the workload's history (`api-history.jsonl`), judged by
//! `api-linearizability` with etcd's model: a resourceVersion is a mod revision, so a create is a
//! transaction guarded by "absent", an update and a delete are guarded by the object's
//! resourceVersion. What the API does not tell is left out rather than guessed: a delete's
//! revision (so an acknowledged delete is of unknown outcome to the checker, and `api-durability`
//! judges it), a refusal's reason beyond "the precondition failed" (a refused write leaves the
//! history), and a GET's revision (GETs are not recorded). Each quorum LIST of the checks is, at
//! its resourceVersion, a read of every object the writers have touched.

pub mod probe;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::Client;
use shakedown_faults::{ApiLoad, BackupId, Model};
use shakedown_history::format::{Kv, ReadAnswer, Request, Then, TxnAnswer};
use shakedown_invariants::{Ack, ApiObservation, Durability, HistoryView, InvariantId, Marks, Unknown, WatchSession};
use tokio::sync::watch as signal;

use crate::targets::recorder::{pause, unix_ms, Clients, Recorder, Rng, StatsSnapshot};
use crate::targets::requests::Sent;

/// The label every object of the workload carries, with the run id (the kube target's
/// `RUN_LABEL`: `reap --kube` finds them by it).
pub const RUN_LABEL: &str = "shakedown.dev/run-id";
/// How often an update that met a conflict re-reads the object and tries again.
const CONFLICT_RETRIES: u32 = 3;
/// Pause after a request that got no answer (the load balancer, the apiserver down).
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// How long stopping waits for the requests in flight.
const STOP_BOUND: Duration = Duration::from_secs(3);
/// Items per page of the read-back LIST.
const PAGE: u32 = 500;
/// The history's client id of the checks' LISTs (writers are 0 and up).
const LIST_CLIENT: u64 = 1_000_000;

/// The API workload: clients and watchers in one namespace, and what they recorded.
pub struct ApiWorkload {
    api: Api<ConfigMap>,
    selector: String,
    rec: Arc<Recorder>,
    timeout: Duration,
    clients: Clients,
    /// Where backups and restores that act on this API's data fall in the acknowledged writes.
    marks: Marks,
}

impl ApiWorkload {
    /// Starts `cfg.clients` writers and `cfg.watches` watchers on ConfigMaps of `namespace`
    /// (which must exist), labelled `RUN_LABEL=run_id`. Each request's outcome is appended to
    /// `samples` (CSV, as the etcd workload's).
    pub fn start(client: Client, namespace: &str, run_id: &str, cfg: &ApiLoad, samples: Option<&Path>) -> ApiWorkload {
        let rec = Arc::new(Recorder::new(samples));
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let selector = format!("{RUN_LABEL}={run_id}");
        let (mut clients, stopped) = Clients::new();
        for i in 0..cfg.clients {
            let w = Writer {
                i,
                api: api.clone(),
                run_id: run_id.to_string(),
                objects: cfg.objects,
                interval: cfg.interval,
                timeout: cfg.timeout,
                rec: rec.clone(),
            };
            clients.spawn(w.run(stopped.clone()));
        }
        for i in 0..cfg.watches {
            clients.spawn(watch::run(i, api.clone(), selector.clone(), cfg.timeout, rec.clone(), stopped.clone()));
        }
        ApiWorkload { api, selector, rec, timeout: cfg.timeout, clients, marks: Marks::default() }
    }

    /// A quorum LIST of the run's objects (paginated at the first page's revision), then the
    /// history: every write the list can reflect is acknowledged, failed or in flight by then.
    pub async fn read(&self) -> Durability {
        let read_sent_at = self.rec.position();
        let sent = self.rec.requests.read_sent();
        let (read, read_revision, read_error) = match self.list_all().await {
            Ok((read, rev)) => (read, rev, None),
            Err(e) => (HashMap::new(), 0, Some(e.to_string())),
        };
        let (acked, unknown) = self.rec.history();
        if read_error.is_none() {
            // The LIST, at its resourceVersion, is a read of every object any writer touched:
            // those it did not return were absent.
            let keys: std::collections::BTreeSet<&str> =
                acked.iter().map(|a| a.key.as_str()).chain(unknown.iter().map(|u| u.key.as_str())).collect();
            let gets = keys
                .into_iter()
                .map(|k| Request::Get {
                    key: k.to_string(),
                    serializable: false,
                    answer: Some(ReadAnswer {
                        revision: read_revision,
                        kv: read.get(k).map(|(value, mod_revision)| Kv {
                            value: value.clone(),
                            mod_revision: *mod_revision,
                            create_revision: None,
                            version: None,
                        }),
                    }),
                })
                .collect();
            self.rec.requests.reads(LIST_CLIENT, sent, None, gets);
        }
        let read = read.into_iter().map(|(k, (v, _))| (k, v)).collect();
        Durability {
            acked,
            unknown,
            marks: self.marks.clone(),
            read,
            read_revision,
            read_error,
            list_anomalies: self.rec.anomalies(),
            refused_write_txns: vec![],
            unanswered_compacted_txns: vec![],
            read_sent_at: Some(read_sent_at),
        }
    }

    /// The objects (name → value and resourceVersion) and the list's resourceVersion.
    async fn list_all(&self) -> Result<(HashMap<String, (String, i64)>, i64), ListError> {
        let mut out = HashMap::new();
        let mut lp = ListParams::default().labels(&self.selector).limit(PAGE);
        let mut revision = 0;
        // At most as many pages as the objects need, plus one.
        for _ in 0..=(64 * 1000 / PAGE) {
            let page = tokio::time::timeout(self.timeout, self.api.list(&lp))
                .await
                .map_err(|_| ListError::Timeout { bound: self.timeout })?
                .map_err(ListError::Api)?;
            if revision == 0 {
                revision = rv(page.metadata.resource_version.as_deref());
            }
            for cm in page.items {
                if let Some(name) = cm.metadata.name.clone() {
                    let v = rv(cm.metadata.resource_version.as_deref());
                    out.insert(name, (value_of(&cm).unwrap_or_default(), v));
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => return Ok((out, revision)),
            }
        }
        Err(ListError::TooManyPages)
    }

    /// Every request of the writers and every LIST of the checks: the history, as a check sees it.
    pub fn history_view(&self) -> HistoryView {
        self.rec.requests.view()
    }

    /// The whole history, for `api-history.jsonl`.
    pub fn history(&self) -> shakedown_history::History {
        self.rec.requests.history()
    }

    /// Writes the whole history to `path` (`api-history.jsonl`, checked by `shakedown
    /// check-history`); a failure to write is a warning.
    pub fn write_history(&self, path: &Path) {
        if let Err(e) = std::fs::write(path, self.history().to_jsonl()) {
            tracing::warn!("cannot write the API workload's history to {}: {e}", path.display());
        }
    }

    /// The store behind the API is being replaced by a restore (every etcd member is down):
    /// what answers from now on is the restored store, a new epoch of the history.
    pub fn store_replaced(&self) {
        self.rec.requests.new_epoch();
    }

    /// A restore begins to replace the store behind the API at an instant it does not report
    /// (the kube target's restore hook): until [`ApiWorkload::store_replaced`], answers hold
    /// nothing (an epoch of the history in which they are unknown, and reads are left out).
    pub fn store_being_replaced(&self) {
        self.rec.requests.replacing();
    }

    /// Every watcher's current session.
    pub fn watch_sessions(&self) -> Vec<WatchSession> {
        self.rec.watch_sessions()
    }

    /// How many writes have been acknowledged so far.
    pub fn acked_len(&self) -> usize {
        self.rec.position()
    }

    /// Backup `b` of the API's data was taken while writes from `start` (an `acked_len()`) on
    /// were acknowledged: the write in flight as it ended may be in it too.
    pub fn backup_taken(&mut self, b: BackupId, start: usize) {
        let end = self.acked_len() + 1;
        self.marks.backup_taken(b, start, end);
    }

    /// A restore of the API's data from `b` begins (`ends` later). With `restart_watches` every
    /// watch starts a new session from a fresh LIST, now and when it ends, as its client does
    /// once the apiservers were restarted around the restore.
    pub fn restore_begins(&mut self, b: BackupId, restart_watches: bool) {
        let start = self.acked_len();
        self.marks.restore_begins(b, start);
        if restart_watches {
            self.rec.end_watch_sessions();
        }
    }

    /// The restore begun last is over (or failed): revisions start again from the backup's.
    pub fn restore_ends(&mut self, restart_watches: bool) {
        let end = self.acked_len();
        self.marks.restore_ends(end);
        if restart_watches {
            self.rec.end_watch_sessions();
        }
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

/// What the API invariants among `invariants` need: the workload's read-back and watch sessions,
/// `endpoint_requests` requests through the load balancer and the `/readyz` of `apiservers`
/// (those the target reaches on its own), each bounded by `timeout`.
pub async fn observe(
    workload: &ApiWorkload,
    probes: &probe::ApiProbes,
    model: &Model,
    invariants: &[InvariantId],
    endpoint_requests: usize,
    apiservers: &[probe::ApiServer],
    timeout: Duration,
) -> ApiObservation {
    let wanted = |i: InvariantId| invariants.contains(&i);
    let up = model.service_expected_up();
    let reach = wanted(InvariantId::ApiReachability);
    let durability = async {
        if (wanted(InvariantId::ApiDurability) || wanted(InvariantId::ApiWatch) || wanted(InvariantId::ApiLinearizability)) && up {
            Some(workload.read().await)
        } else {
            None
        }
    };
    let endpoint = async {
        if reach && up {
            probes.through_endpoint(endpoint_requests, timeout).await
        } else {
            vec![]
        }
    };
    let readyz = async {
        if reach {
            probes.readyz(apiservers, timeout).await
        } else {
            vec![]
        }
    };
    let (durability, endpoint, apiservers) = tokio::join!(durability, endpoint, readyz);
    ApiObservation {
        durability,
        watches: if wanted(InvariantId::ApiWatch) { workload.watch_sessions() } else { vec![] },
        // Taken after the LIST (in `read`): every request the LIST can reflect is in it.
        history: wanted(InvariantId::ApiLinearizability).then(|| workload.history_view()),
        endpoint,
        apiservers,
    }
}

/// An object's value.
fn value_of(cm: &ConfigMap) -> Option<String> {
    cm.data.as_ref().and_then(|d| d.get("v")).cloned()
}

/// A resourceVersion as etcd's revision (0 when it is not a number: never, with etcd3 storage).
pub(crate) fn rv(v: Option<&str>) -> i64 {
    v.and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The API's answer (status code and message) or the transport's error, with its causes.
/// Why the read back of the run's ConfigMaps (the durability check's LIST) has no answer.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error("LIST of the run's ConfigMaps: no answer within {}ms", bound.as_millis())]
    Timeout { bound: Duration },
    #[error("LIST of the run's ConfigMaps: {}", describe(.0))]
    Api(#[source] kube::Error),
    #[error("LIST of the run's ConfigMaps did not end within its page budget")]
    TooManyPages,
}

pub(crate) fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} {}", s.code, s.message),
        other => crate::targets::kube::command::error_chain(other),
    }
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// What a writer believes of one of its objects.
#[derive(Debug, Clone)]
enum Known {
    Absent,
    /// Present at this resourceVersion.
    Present(String),
    /// A write of unknown outcome, or a refusal: read it before the next write.
    Unsure,
}

/// One client: writes its own objects, one request at a time.
struct Writer {
    i: u32,
    api: Api<ConfigMap>,
    run_id: String,
    objects: u32,
    interval: Duration,
    timeout: Duration,
    rec: Arc<Recorder>,
}

/// Why a request did not succeed.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// The API answered with an error (a refusal: nothing was written).
    Refused(u16),
    /// No answer, or a transport error: it may or may not have been applied.
    Unknown,
}

impl Writer {
    async fn run(self, mut stopped: signal::Receiver<bool>) {
        let mut rng = Rng::new(u64::from(self.i) + 1);
        let mut known: Vec<Known> = vec![Known::Unsure; self.objects as usize];
        let mut seq = 0u64;
        while !*stopped.borrow() {
            pause(self.interval, &mut stopped).await;
            if *stopped.borrow() {
                break;
            }
            let k = rng.below(u64::from(self.objects)) as usize;
            let name = format!("sd-{}-{k}", self.i);
            seq += 1;
            let value = format!("{}-{seq}", self.i);
            let ok = match known[k].clone() {
                Known::Unsure => {
                    known[k] = self.read(&name).await;
                    !matches!(known[k], Known::Unsure)
                }
                Known::Absent => {
                    known[k] = self.create(&name, &value).await;
                    matches!(known[k], Known::Present(_))
                }
                Known::Present(v) if rng.below(4) == 0 => {
                    known[k] = self.delete(&name, &v).await;
                    matches!(known[k], Known::Absent)
                }
                Known::Present(v) => {
                    known[k] = self.update(&name, v, &value).await;
                    matches!(known[k], Known::Present(_))
                }
            };
            if !ok {
                pause(RETRY_PAUSE, &mut stopped).await;
            }
        }
    }

    /// One request, bounded, sampled.
    async fn call<T>(&self, f: impl std::future::Future<Output = Result<T, kube::Error>>) -> Result<T, Failure> {
        self.rec.stats.attempted.fetch_add(1, Ordering::Relaxed);
        let (t0, unix) = (Instant::now(), unix_ms());
        let out = match tokio::time::timeout(self.timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => match code(&e) {
                // 5xx and 429: the apiserver may have applied it (a timeout talking to etcd).
                Some(c) if c < 500 && c != 429 => Err(Failure::Refused(c)),
                _ => Err(Failure::Unknown),
            },
            Err(_) => Err(Failure::Unknown),
        };
        self.rec.sample(unix, t0.elapsed(), out.is_ok());
        out
    }

    fn object(&self, name: &str, value: &str, resource_version: Option<String>) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(RUN_LABEL.to_string(), self.run_id.clone())])),
                resource_version,
                ..Default::default()
            },
            data: Some(BTreeMap::from([("v".to_string(), value.to_string())])),
            ..Default::default()
        }
    }

    async fn read(&self, name: &str) -> Known {
        match self.call(self.api.get_opt(name)).await {
            Ok(Some(cm)) => Known::Present(cm.metadata.resource_version.unwrap_or_default()),
            Ok(None) => Known::Absent,
            _ => Known::Unsure,
        }
    }

    async fn create(&self, name: &str, value: &str) -> Known {
        let start = self.rec.position();
        let ticket = self.rec.send(Unknown { key: name.into(), value: Some(value.into()), start, any_time: true });
        let sent = self.rec.requests.send(self.client(), self.txn(name, 0, Some(value), None));
        match self.call(self.api.create(&PostParams::default(), &self.object(name, value, None))).await {
            Ok(cm) => self.written(ticket, sent, name, value, 0, start, cm),
            Err(f) => self.not_written(ticket, sent, name, 0, Some(value), f),
        }
    }

    fn client(&self) -> u64 {
        u64::from(self.i)
    }

    /// The history's request for a write of `name` guarded by `if_mod_revision` (0: absent):
    /// a put of `value`, or a delete.
    fn txn(&self, name: &str, if_mod_revision: i64, value: Option<&str>, answer: Option<TxnAnswer>) -> Request {
        let then = value.map_or(Then::Delete, |v| Then::Put(v.to_string()));
        Request::Txn { key: name.into(), if_mod_revision, then, answer }
    }

    /// Replace with the resourceVersion precondition; on a conflict, read and try again.
    async fn update(&self, name: &str, mut version: String, value: &str) -> Known {
        for _ in 0..=CONFLICT_RETRIES {
            let start = self.rec.position();
            let ticket = self.rec.send(Unknown { key: name.into(), value: Some(value.into()), start, any_time: false });
            let guard = rv(Some(&version));
            let sent = self.rec.requests.send(self.client(), self.txn(name, guard, Some(value), None));
            match self.call(self.api.replace(name, &PostParams::default(), &self.object(name, value, Some(version.clone())))).await {
                Ok(cm) => return self.written(ticket, sent, name, value, guard, start, cm),
                Err(Failure::Refused(404)) => {
                    self.rec.answered(ticket, None);
                    self.rec.requests.forget(sent);
                    return Known::Absent;
                }
                Err(Failure::Refused(409)) => {
                    self.not_written(ticket, sent, name, guard, Some(value), Failure::Refused(409));
                    match self.read(name).await {
                        Known::Present(v) => version = v,
                        other => return other,
                    }
                }
                Err(f) => return self.not_written(ticket, sent, name, guard, Some(value), f),
            }
        }
        Known::Unsure
    }

    async fn delete(&self, name: &str, version: &str) -> Known {
        let start = self.rec.position();
        let ticket = self.rec.send(Unknown { key: name.into(), value: None, start, any_time: false });
        let guard = rv(Some(version));
        let sent = self.rec.requests.send(self.client(), self.txn(name, guard, None, None));
        let dp =
            DeleteParams { preconditions: Some(Preconditions { resource_version: Some(version.into()), uid: None }), ..Default::default() };
        match self.call(self.api.delete(name, &dp)).await {
            Ok(_) => {
                // The answer is the object as it was: the delete's own revision is not known,
                // so to the history checker it is of unknown outcome.
                self.rec.answered(ticket, Some(Ack { key: name.into(), value: None, revision: 0, start }));
                self.rec.requests.end(sent, self.txn(name, guard, None, None), None);
                Known::Absent
            }
            Err(f) => self.not_written(ticket, sent, name, guard, None, f),
        }
    }

    /// A create or replace the API acknowledged with `cm`.
    #[allow(clippy::too_many_arguments)]
    fn written(&self, ticket: u64, sent: Sent, name: &str, value: &str, guard: i64, start: usize, cm: ConfigMap) -> Known {
        let v = cm.metadata.resource_version.unwrap_or_default();
        let revision = rv(Some(&v));
        self.rec.answered(ticket, Some(Ack { key: name.into(), value: Some(value.into()), revision, start }));
        let answer = TxnAnswer { succeeded: true, revision, kv: None };
        self.rec.requests.end(sent, self.txn(name, guard, Some(value), Some(answer)), None);
        Known::Present(v)
    }

    /// A write that was refused (counted as a conflict on 409) or got no answer: the object
    /// must be read before the next write.
    fn not_written(&self, ticket: u64, sent: Sent, name: &str, guard: i64, value: Option<&str>, failure: Failure) -> Known {
        match failure {
            Failure::Refused(code) => {
                self.rec.answered(ticket, None);
                self.rec.requests.forget(sent);
                if code == 409 {
                    self.rec.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                }
            }
            Failure::Unknown => {
                self.rec.failed(ticket);
                self.rec.requests.end(sent, self.txn(name, guard, value, None), None);
            }
        }
        Known::Unsure
    }
}
