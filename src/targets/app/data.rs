//! The application's data-integrity workload: unique keys written with the app profile's write
//! command (exec'd in a Ready pod), each acknowledgement recorded; the read command's answer
//! compared with them by `app-durability`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::Client;
use shakedown_faults::BackupId;
use shakedown_invariants::{AppData, Marks};

use super::spec::{fill, DataCommands};
use crate::k8s::exec::{exec, ExecError};

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

#[derive(Debug, Default)]
struct Log {
    /// In the order acknowledged.
    acked: Vec<(String, String)>,
    marks: Marks,
    unknown: BTreeSet<String>,
    in_flight: Option<String>,
    failures: u64,
    /// What the last write that failed answered (pod, exit code, stderr), for an error that
    /// says why no write is acknowledged.
    last_failure: Option<String>,
}

/// The writer task and what it recorded.
pub struct Writer {
    log: Arc<Mutex<Log>>,
    task: tokio::task::JoinHandle<()>,
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

impl Writer {
    pub fn start(client: Client, namespace: &str, commands: DataCommands, run_id: &str) -> Writer {
        let log = Arc::new(Mutex::new(Log::default()));
        let prefix = format!("sd-{}-", run_id.trim_start_matches("sd-"));
        let task = {
            let (log, client, namespace, commands, prefix) =
                (log.clone(), client.clone(), namespace.to_string(), commands.clone(), prefix.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                loop {
                    tokio::time::sleep(commands.interval).await;
                    let Some(pod) = ready_pod(&client, &namespace, &commands.selector, None).await else {
                        log.lock().unwrap().last_failure = Some(format!("no Ready pod matches {}", commands.selector));
                        continue;
                    };
                    let name = pod.metadata.name.unwrap_or_default();
                    n += 1;
                    let key = format!("{prefix}{n:06}");
                    let value = format!("v{n}");
                    log.lock().unwrap().in_flight = Some(key.clone());
                    let cmd = fill(&commands.write, &BTreeMap::from([("key", key.clone()), ("value", value.clone())]));
                    let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
                    let out = exec(&client, &namespace, &name, commands.container.as_deref(), &refs, DATA_COMMAND_BOUND).await;
                    let mut l = log.lock().unwrap();
                    l.in_flight = None;
                    match out {
                        Ok(o) if o.code == 0 => {
                            l.acked.push((key, value));
                        }
                        failed => {
                            l.failures += 1;
                            l.unknown.insert(key);
                            l.last_failure = Some(match failed {
                                Ok(o) => format!("in {name}: exit {}: {}", o.code, o.stderr.trim()),
                                Err(e) => format!("in {name}: {e}"),
                            });
                        }
                    }
                }
            })
        };
        Writer { log, task, client, namespace: namespace.to_string(), commands, prefix }
    }

    /// Reads the data back: what was acknowledged before the read was sent must be in it; what
    /// was written after, or is of unknown outcome, may be.
    pub async fn read(&self) -> AppData {
        let (sent_at, marks) = {
            let l = self.log.lock().unwrap();
            (l.acked.len(), l.marks.clone())
        };
        let read = self.read_command().await;
        let l = self.log.lock().unwrap();
        let mut unknown: BTreeSet<String> = l.unknown.clone();
        // Acknowledged while the read ran: may or may not be in it.
        unknown.extend(l.acked[sent_at..].iter().map(|(k, _)| k.clone()));
        unknown.extend(l.in_flight.clone());
        AppData { acked: l.acked[..sent_at].to_vec(), marks, unknown, read: read.map_err(|e| e.to_string()) }
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
                let none_ended = l.failures == 0 && l.last_failure.is_none();
                let now = tokio::time::Instant::now();
                if now >= deadline && (!none_ended || now >= first_attempt_deadline) {
                    let why = l.last_failure.clone().unwrap_or_else(|| "no attempt finished".into());
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

    async fn read_command(&self) -> Result<BTreeMap<String, String>, DataError> {
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
        Ok(out
            .stdout
            .lines()
            .filter_map(|l| l.trim().split_once(' '))
            .filter(|(k, _)| k.starts_with(&self.prefix))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect())
    }

    pub fn stats(&self) -> serde_json::Value {
        let l = self.log.lock().unwrap();
        serde_json::json!({"data_acked": l.acked.len(), "data_unknown": l.unknown.len(), "data_failed": l.failures})
    }

    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
