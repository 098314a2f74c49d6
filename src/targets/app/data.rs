//! The application's data-integrity workload: unique keys written with the app profile's write
//! command (exec'd in a Ready pod), each acknowledgement recorded; the read command's answer
//! compared with them by `app-durability`, and every write and read in the workload's history
//! (`app-history.jsonl`), judged by `app-linearizability` with the register model: each key a
//! register written once.
//!
//! A read enters the history as one register read per key the writer has sent (and per key it
//! returned that the writer never sent), less those that cannot constrain anything: a key whose
//! value in this epoch is already settled — its write acknowledged, or the same answer recorded,
//! before this read was sent — reads the same again by necessity (nothing rewrites a key; an
//! absent key is settled only once no write of it can take effect in the epoch). Without that,
//! every check would add one read per key ever written.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::Client;
use shakedown_faults::BackupId;
use shakedown_history::format::{Done, RegisterRead, Scalar};
use shakedown_history::{ModelKind, Request};
use shakedown_invariants::{AppData, HistoryView, Marks};

use super::spec::{fill, DataCommands, Session};
use crate::k8s::exec::{exec, ExecError};
use crate::targets::requests::Requests;
use crate::targets::samples::Samples;

/// Why the data workload did not start, or its read back has no answer.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The write command was not acknowledged once within the bound (`last`: what the last
    /// attempt answered).
    #[error("the data workload's write command was not acknowledged once within {bound:?} ({failures} attempts failed; the last: {last})")]
    NoAck { bound: Duration, failures: u64, last: String },
    #[error("no Ready pod of {selector} to read in")]
    NoReadyPod { selector: String },
    /// The read command could not run in its pod.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The read command exited non-zero.
    #[error("in {pod}: exit {code}: {stderr}")]
    Exit { pod: String, code: i32, stderr: String },
}

/// How long one write or read command may take.
pub const DATA_COMMAND_BOUND: Duration = Duration::from_secs(15);

/// The history's client numbers: the first writer, and the reads of the checks; writer `i > 0`
/// is `READER + i`.
const WRITER: u64 = 0;
const READER: u64 = 1;

fn writer_client(i: u32) -> u64 {
    if i == 0 {
        WRITER
    } else {
        READER + u64::from(i)
    }
}

#[derive(Debug, Default)]
struct Log {
    /// In the order acknowledged: key, value, and how many were acknowledged when it was sent.
    acked: Vec<(String, String, usize)>,
    /// When each of `acked` was acknowledged (this machine's clock), in the same order.
    acked_at: Vec<std::time::SystemTime>,
    marks: Marks,
    unknown: BTreeSet<String>,
    in_flight: BTreeSet<String>,
    failures: u64,
    /// What the last write that failed answered (pod, exit code, stderr), for an error that
    /// says why no write is acknowledged.
    last_failure: Option<String>,
    /// Why the last round found no pod to write in (kept apart: it is no attempt's answer).
    no_pod: Option<String>,
    /// Every key sent, in the order sent.
    sent: Vec<String>,
    /// Per key sent: whether its write was acknowledged, and the epoch it ended in (`None`:
    /// in flight).
    writes: HashMap<String, (bool, Option<u32>)>,
    /// The history's epoch: restores begun and ended.
    epoch: u32,
    /// A restore is under way: the data may be replaced at any instant, so reads answered now
    /// are not recorded (their epoch has no order to judge them by).
    restoring: bool,
    /// Per key: its value in the epoch, settled (no later read can differ without a violation
    /// already recorded), and when it was settled.
    settled: HashMap<String, (u32, Option<String>, Instant)>,
}

impl Log {
    /// The register reads a read sent at `sent` in `epoch` that returned `read` adds to the
    /// history: one per key sent so far and per key returned, less those already settled
    /// (see the module's documentation). Settles what it records.
    fn reads(&mut self, epoch: u32, sent: Instant, read: &BTreeMap<String, String>) -> Vec<Request> {
        let now = Instant::now();
        let unsent: Vec<String> = read.keys().filter(|k| !self.writes.contains_key(*k)).cloned().collect();
        let mut out = Vec::new();
        for key in self.sent.iter().chain(&unsent) {
            let got = read.get(key).cloned();
            if self.settled.get(key).is_some_and(|(e, v, at)| *e == epoch && *v == got && *at <= sent) {
                continue;
            }
            out.push(Request::Read { key: key.clone(), answer: Some(RegisterRead { value: got.clone().map(Scalar::Str) }) });
            // Nothing rewrites a key: once read, a value stays. Absence stays once the key's
            // write was acknowledged in an earlier epoch (the restored data decides it).
            let stays = got.is_some() || self.writes.get(key).is_some_and(|&(acked, ended)| acked && ended.is_some_and(|e| e < epoch));
            if stays && self.settled.get(key).is_none_or(|(e, ..)| *e != epoch) {
                self.settled.insert(key.clone(), (epoch, got, now));
            }
        }
        out
    }
}

/// The writer task and what it recorded.
pub struct Writer {
    log: Arc<Mutex<Log>>,
    requests: Arc<Requests>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    client: Client,
    namespace: String,
    commands: DataCommands,
    prefix: String,
}

/// A Ready pod of `selector` in `namespace` (the first by name), for exec.
pub async fn ready_pod(client: &Client, namespace: &str, selector: &str, skip: Option<&str>) -> Option<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = tokio::time::timeout(Duration::from_secs(10), pods.list(&ListParams::default().labels(selector))).await.ok()?.ok()?;
    list.items
        .into_iter()
        .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none() && p.metadata.name.as_deref() != skip)
        .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
}

pub fn is_ready(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn write(key: &str, value: &str, answer: Option<Done>) -> Request {
    Request::Write { key: key.to_string(), value: Scalar::Str(value.to_string()), answer }
}

impl Writer {
    /// `samples`: where each write's start, latency and outcome go (the run's `workload.csv`,
    /// which the report charts).
    pub fn start(client: Client, namespace: &str, commands: DataCommands, run_id: &str, samples: Samples) -> Writer {
        let log = Arc::new(Mutex::new(Log::default()));
        let requests = Arc::new(Requests::new(Instant::now(), ModelKind::Register).outliving());
        let prefix = format!("sd-{}-", run_id.trim_start_matches("sd-"));
        let (samples, numbered) = (Arc::new(samples), Arc::new(AtomicU64::new(0)));
        let tasks = (0..commands.writers.max(1))
            .map(|i| {
                let one = OneWriter {
                    client_id: writer_client(i),
                    log: log.clone(),
                    requests: requests.clone(),
                    client: client.clone(),
                    namespace: namespace.to_string(),
                    commands: commands.clone(),
                    prefix: prefix.clone(),
                    samples: samples.clone(),
                    numbered: numbered.clone(),
                };
                tokio::spawn(one.run())
            })
            .collect();
        Writer { log, requests, tasks, client, namespace: namespace.to_string(), commands, prefix }
    }

    /// Reads the data back: what was acknowledged before the read was sent must be in it; what
    /// was written after, or is of unknown outcome, may be.
    /// The read also enters the history (a read that fails, or that a restore overlaps,
    /// does not: with no answer to judge, it constrains nothing).
    pub async fn read(&self) -> AppData {
        let (sent_at, marks, epoch) = {
            let l = self.log.lock().unwrap();
            (l.acked.len(), l.marks.clone(), l.epoch)
        };
        let sent = Instant::now();
        let ticket = self.requests.read_sent();
        let read = self.read_command().await;
        let mut l = self.log.lock().unwrap();
        if let Ok((pod, answer)) = &read {
            if l.epoch == epoch && !l.restoring {
                let gets = l.reads(epoch, sent, answer);
                self.requests.reads(READER, ticket, Some(pod.clone()), gets);
            }
        }
        let mut unknown: BTreeSet<String> = l.unknown.clone();
        // Acknowledged while the read ran: may or may not be in it.
        unknown.extend(l.acked[sent_at..].iter().map(|(k, ..)| k.clone()));
        unknown.extend(l.in_flight.iter().cloned());
        AppData { acked: l.acked[..sent_at].to_vec(), marks, unknown, read: read.map(|(_, r)| r).map_err(|e| e.to_string()) }
    }

    /// Every write and read so far, as a check sees them.
    pub fn history_view(&self) -> HistoryView {
        self.requests.view()
    }

    /// Writes the whole history to `path` (`app-history.jsonl`, checked by `shakedown
    /// check-history`); a failure to write is a warning.
    pub fn write_history(&self, path: &std::path::Path) {
        if let Err(e) = std::fs::write(path, self.requests.history().to_jsonl()) {
            tracing::warn!("cannot write the data workload's history to {}: {e}", path.display());
        }
    }

    /// A restore is about to replace the data: a new epoch of the history, whose reads are not
    /// recorded until [`Writer::restore_ended`] (the data may change at any instant of it).
    pub fn restore_begins(&self) {
        let mut l = self.log.lock().unwrap();
        l.restoring = true;
        l.epoch += 1;
        self.requests.replacing();
    }

    /// The restore ended (done or not): from now on the data is what it left, a new epoch.
    pub fn restore_ended(&self) {
        let mut l = self.log.lock().unwrap();
        l.restoring = false;
        l.epoch += 1;
        self.requests.new_epoch();
    }

    /// Waits (up to `bound`) for the first acknowledged write: a run whose write command never
    /// succeeds would check the durability of nothing, so it does not start. The error says
    /// what the last attempt answered. When no attempt has ended by then (a loaded machine: the
    /// exec itself is slow), it waits for the first to end, within that attempt's own bound, so
    /// that a slow machine is not taken for a broken command and the error can say what the
    /// command answered.
    pub async fn first_ack(&self, bound: Duration) -> Result<(), DataError> {
        let deadline = tokio::time::Instant::now() + bound;
        let first_attempt_deadline = deadline + DATA_COMMAND_BOUND + Duration::from_secs(1);
        loop {
            {
                let l = self.log.lock().unwrap();
                if !l.acked.is_empty() {
                    return Ok(());
                }
                // Until an attempt has ended, one running (or a round still looking for a pod) is
                // waited for; with none running and the last round finding no Ready pod (or its
                // list failing), that is the answer.
                let waiting = l.failures == 0 && (!l.in_flight.is_empty() || l.no_pod.is_none());
                let now = tokio::time::Instant::now();
                if now >= deadline && (!waiting || now >= first_attempt_deadline) {
                    let why = l.last_failure.clone().or_else(|| l.no_pod.clone()).unwrap_or_else(|| "no attempt finished".into());
                    return Err(DataError::NoAck { bound, failures: l.failures, last: why });
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many writes have been acknowledged so far (a position for [`Marks`]).
    pub fn position(&self) -> usize {
        self.log.lock().unwrap().acked.len()
    }

    /// Backup `b` was asked for at position `start` and done at `end`.
    pub fn mark_backup(&self, b: BackupId, start: usize, end: usize) {
        self.log.lock().unwrap().marks.backup_taken(b, start, end);
    }

    /// Backup `b` was restored: asked for at position `start`, done at `end`.
    pub fn mark_restore(&self, b: BackupId, start: usize, end: usize) {
        let mut l = self.log.lock().unwrap();
        l.marks.restore_begins(b, start);
        l.marks.restore_ends(end);
    }

    /// Backup `b` was restored to an instant and recovered: asked for at position `start`, done
    /// at `end`; `acked` writes were acknowledged before the instant, and every write sent with
    /// `sent_after` or more acknowledged was sent after it.
    pub fn mark_pitr(&self, b: BackupId, start: usize, acked: usize, sent_after: usize, end: usize) {
        let mut l = self.log.lock().unwrap();
        l.marks.pitr_begins(b, start, acked, sent_after);
        l.marks.restore_ends(end);
    }

    /// How many writes were acknowledged before instant `t` (this machine's clock).
    pub fn acked_before(&self, t: std::time::SystemTime) -> usize {
        self.log.lock().unwrap().acked_at.partition_point(|&a| a < t)
    }

    /// The read command's answer, and the pod that gave it.
    async fn read_command(&self) -> Result<(String, BTreeMap<String, String>), DataError> {
        let pod = ready_pod(&self.client, &self.namespace, &self.commands.selector, None)
            .await
            .ok_or_else(|| DataError::NoReadyPod { selector: self.commands.selector.clone() })?;
        let name = pod.metadata.name.unwrap_or_default();
        let cmd = fill(&self.commands.read, &BTreeMap::from([("prefix", self.prefix.clone())]));
        let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let out = exec(&self.client, &self.namespace, &name, self.commands.container.as_deref(), &refs, DATA_COMMAND_BOUND).await?;
        if out.code != 0 {
            return Err(DataError::Exit { pod: name, code: out.code, stderr: out.stderr.trim().to_string() });
        }
        let read = out
            .stdout
            .lines()
            .filter_map(|l| l.trim().split_once(' '))
            .filter(|(k, _)| k.starts_with(&self.prefix))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect();
        Ok((name, read))
    }

    pub fn stats(&self) -> serde_json::Value {
        let l = self.log.lock().unwrap();
        let history = self.requests.view();
        serde_json::json!({
            "data_acked": l.acked.len(),
            "data_unknown": l.unknown.len(),
            "data_failed": l.failures,
            "data_history": history.ended.len() + history.in_flight.len(),
        })
    }

    pub fn stop(&self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One of the writers: its own exec per write (its own connection to the application), its own
/// client in the history; the keys are numbered across all of them.
struct OneWriter {
    client_id: u64,
    log: Arc<Mutex<Log>>,
    requests: Arc<Requests>,
    client: Client,
    namespace: String,
    commands: DataCommands,
    prefix: String,
    samples: Arc<Samples>,
    numbered: Arc<AtomicU64>,
}

/// What a session answered to one write.
enum Answer {
    /// `ok KEY`.
    Acked,
    /// `fail KEY …`: the line (the outcome is unknown: a failed write may still have been done).
    Failed(String),
    /// No answer: the session ended, broke or kept silent past the bound.
    Broken(String),
}

/// A write sent and not yet ended: what its end needs.
struct InFlight {
    key: String,
    value: String,
    ticket: crate::targets::requests::Sent,
    start: usize,
    at: std::time::SystemTime,
}

impl OneWriter {
    /// The next key and value, recorded as sent (in flight, in the history).
    fn send(&self) -> InFlight {
        let n = self.numbered.fetch_add(1, Ordering::Relaxed) + 1;
        let key = format!("{}{n:06}", self.prefix);
        let value = format!("v{n}");
        let mut l = self.log.lock().unwrap();
        let start = l.acked.len();
        l.in_flight.insert(key.clone());
        l.sent.push(key.clone());
        l.writes.insert(key.clone(), (false, None));
        let ticket = self.requests.send(self.client_id, write(&key, &value, None));
        InFlight { key, value, ticket, start, at: std::time::SystemTime::now() }
    }

    /// The write ended: acknowledged (`Ok`), or not (`Err(why)`: failed, or no answer; its
    /// outcome is unknown, as a write that failed may still have been done, or be done later).
    fn end(&self, w: InFlight, pod: &str, outcome: Result<(), String>) {
        let InFlight { key, value, ticket, start, at } = w;
        let acked = outcome.is_ok();
        self.samples.sample_since(at, acked);
        self.samples.flush();
        let mut l = self.log.lock().unwrap();
        l.in_flight.remove(&key);
        self.requests.end(ticket, write(&key, &value, acked.then_some(Done {})), Some(pod.to_string()));
        let epoch = l.epoch;
        l.writes.insert(key.clone(), (acked, Some(epoch)));
        match outcome {
            Ok(()) => {
                l.settled.insert(key.clone(), (epoch, Some(value.clone()), Instant::now()));
                l.acked.push((key, value, start));
                l.acked_at.push(std::time::SystemTime::now());
            }
            Err(why) => {
                l.failures += 1;
                l.unknown.insert(key);
                l.last_failure = Some(format!("in {pod}: {why}"));
            }
        }
    }

    /// A Ready pod of `selector` to exec in (none: said in the log, for the first ack's error).
    async fn pod(&self, selector: &str) -> Option<String> {
        let found = ready_pod(&self.client, &self.namespace, selector, None).await.and_then(|p| p.metadata.name);
        if found.is_none() {
            self.log.lock().unwrap().no_pod = Some(format!("no Ready pod matches {selector}"));
        }
        found
    }

    async fn run(self) {
        match self.commands.session.clone() {
            Some(session) => self.run_sessions(session).await,
            None => self.run_execs().await,
        }
    }

    /// One exec of the write command per write.
    async fn run_execs(self) {
        loop {
            tokio::time::sleep(self.commands.interval).await;
            let Some(name) = self.pod(&self.commands.selector).await else { continue };
            let w = self.send();
            let cmd = fill(&self.commands.write, &BTreeMap::from([("key", w.key.clone()), ("value", w.value.clone())]));
            let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
            let out = exec(&self.client, &self.namespace, &name, self.commands.container.as_deref(), &refs, DATA_COMMAND_BOUND).await;
            let outcome = match out {
                Ok(o) if o.code == 0 => Ok(()),
                Ok(o) => Err(format!("exit {}: {}", o.code, o.stderr.trim())),
                Err(e) => Err(e.to_string()),
            };
            self.end(w, &name, outcome);
        }
    }

    /// A long-running session command per writer (`[data.session]`): one line `KEY VALUE` on
    /// its stdin per write, answered by `ok KEY` (acknowledged) or `fail KEY …` on its stdout.
    /// A session that ends, breaks or leaves a write unanswered for [`DATA_COMMAND_BOUND`] is
    /// replaced by a new one (that write's outcome unknown).
    async fn run_sessions(self, session: Session) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let selector = session.selector.clone().unwrap_or_else(|| self.commands.selector.clone());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        loop {
            tokio::time::sleep(self.commands.interval.max(Duration::from_millis(100))).await;
            let Some(name) = self.pod(&selector).await else { continue };
            let mut params = kube::api::AttachParams::default().stdin(true).stdout(true).stderr(false);
            if let Some(c) = &self.commands.container {
                params = params.container(c);
            }
            let started = tokio::time::timeout(DATA_COMMAND_BOUND, pods.exec(&name, session.command.clone(), &params)).await;
            let mut attached = match started {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => {
                    self.log.lock().unwrap().last_failure = Some(format!("in {name}: the session command did not start: {e}"));
                    continue;
                }
                Err(_) => {
                    self.log.lock().unwrap().last_failure =
                        Some(format!("in {name}: the session command did not start within {DATA_COMMAND_BOUND:?}"));
                    continue;
                }
            };
            let (Some(mut stdin), Some(stdout)) = (attached.stdin(), attached.stdout()) else {
                self.log.lock().unwrap().last_failure = Some(format!("in {name}: the session's exec came without stdin or stdout"));
                continue;
            };
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            loop {
                tokio::time::sleep(self.commands.interval).await;
                let w = self.send();
                let sent = stdin.write_all(format!("{} {}\n", w.key, w.value).as_bytes()).await.and(stdin.flush().await);
                if let Err(e) = sent {
                    self.end(w, &name, Err(format!("the session's stdin: {e}")));
                    break;
                }
                let (ok, fail) = (format!("ok {}", w.key), format!("fail {}", w.key));
                let answer = tokio::time::timeout(DATA_COMMAND_BOUND, async {
                    loop {
                        match lines.next_line().await {
                            Ok(Some(l)) if l.trim_end() == ok => return Answer::Acked,
                            Ok(Some(l)) if l.trim_end() == fail || l.starts_with(&format!("{fail} ")) => return Answer::Failed(l),
                            // Anything else the command prints is not an answer.
                            Ok(Some(_)) => continue,
                            Ok(None) => return Answer::Broken("the session ended".into()),
                            Err(e) => return Answer::Broken(format!("the session's stdout: {e}")),
                        }
                    }
                })
                .await
                .unwrap_or_else(|_| Answer::Broken(format!("no answer within {DATA_COMMAND_BOUND:?}")));
                match answer {
                    Answer::Acked => self.end(w, &name, Ok(())),
                    Answer::Failed(line) => self.end(w, &name, Err(line)),
                    Answer::Broken(why) => {
                        self.end(w, &name, Err(why));
                        break;
                    }
                }
            }
            drop(stdin);
            let _ = tokio::time::timeout(Duration::from_secs(2), attached.join()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(keys: &[(&str, &str)]) -> BTreeMap<String, String> {
        keys.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn keys(reads: &[Request]) -> Vec<String> {
        reads
            .iter()
            .map(|r| format!("{}={:?}", r.key(), matches!(r, Request::Read { answer: Some(RegisterRead { value: Some(_) }), .. })))
            .collect()
    }

    /// A read records what can still constrain the history, and only that: a key whose write
    /// was acknowledged before the read was sent reads present by necessity; a key already read
    /// present reads present again; a key read absent in flight may still appear.
    #[test]
    fn a_read_records_only_what_can_still_constrain_the_history() {
        let mut l = Log::default();
        for k in ["a", "b", "c"] {
            l.sent.push(k.into());
        }
        let before = Instant::now();
        l.writes.insert("a".into(), (true, Some(0)));
        l.settled.insert("a".into(), (0, Some("v1".into()), Instant::now()));
        l.writes.insert("b".into(), (false, Some(0)));
        l.writes.insert("c".into(), (false, None));
        // Sent before a's ack: a is recorded; b (unknown outcome) present, c (in flight) absent,
        // and a key nobody wrote.
        let r = l.reads(0, before, &answer(&[("a", "v1"), ("b", "v2"), ("z", "v9")]));
        assert_eq!(keys(&r), ["a=true", "b=true", "c=false", "z=true"]);
        // Sent after: a and b are settled present, z too; c is still open.
        let after = Instant::now();
        let r = l.reads(0, after, &answer(&[("a", "v1"), ("b", "v2"), ("z", "v9")]));
        assert_eq!(keys(&r), ["c=false"]);
        // A settled key read otherwise is recorded (the checker says it is lost).
        let r = l.reads(0, Instant::now(), &answer(&[("b", "v2"), ("z", "v9")]));
        assert_eq!(keys(&r), ["a=false", "c=false"]);
        // In a new epoch (after a restore) every key sent is read afresh once (a key nobody wrote
        // only when returned); absent settles only for a key acknowledged in an earlier epoch.
        let r = l.reads(1, Instant::now(), &answer(&[("b", "v2")]));
        assert_eq!(keys(&r), ["a=false", "b=true", "c=false"]);
        let r = l.reads(1, Instant::now(), &answer(&[("b", "v2")]));
        assert_eq!(keys(&r), ["c=false"]);
    }
}
