//! `failpoint(mN, NAME, ACTION)`: one of etcd's own failpoints armed on a member of a failpoint
//! build through gofail's HTTP endpoint (each member serves it at its own address,
//! [`FAILPOINT_PORT`]), etcd driven there, and the outcome verified: a panic is the member's
//! process gone with gofail's panic for that failpoint in its log; a sleep is a request of the
//! op's own that had to wait it out.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use shakedown_faults::failpoint::Trigger;
use shakedown_faults::{Failpoint, FailpointAction, MemberId, Op};
use tokio::time::Instant;

use super::ops::Fillers;
use super::{etcd, observe, LocalError, LocalTarget, EXIT_POLL, MOVE_LEADER_BOUND};

/// The port a failpoint build's member serves gofail's endpoint on, at the member's own address
/// (`GOFAIL_HTTP`).
pub const FAILPOINT_PORT: u16 = 22381;

/// How long a member cut for a snapshot must stay caught up without one (alive, no snapshot in
/// its log) before it is cut again.
const CAUGHT_UP_SETTLE: Duration = Duration::from_secs(3);
/// How often that is looked at (the member's whole log read, its status asked).
const CAUGHT_UP_POLL: Duration = Duration::from_millis(500);

/// Bound of one request to gofail's endpoint.
const GOFAIL_BOUND: Duration = Duration::from_secs(3);

/// A sleep counts as waited out by a request that took at least this share of it: the request
/// may arrive a little after etcd reached the failpoint (a backend commit comes up to 100 ms
/// after the write it commits).
const SLEEP_SEEN_SHARE: f64 = 0.8;

/// How long the op drives etcd towards a sleeping failpoint before it says it never got there:
/// this many times the sleep, plus [`SLEEP_SLACK`].
const SLEEP_TRIES: u32 = 3;
const SLEEP_SLACK: Duration = Duration::from_secs(5);

/// What gofail's panic writes for the failpoint registered as `registered`, armed by
/// [`FailpointAction::terms`] (the goroutine's panic message, on the process's stderr: the
/// member's log).
fn panic_line(registered: &str) -> String {
    format!("failpoint panic: {registered}")
}

/// The frame of gofail's panic in a goroutine's stack (the member runs with `GOTRACEBACK=all`):
/// how the failpoint's panic shows when another goroutine's panic, set off by the shutdown the
/// failpoint's panic started, is the one Go printed.
const PANIC_FRAME: &str = "gofail/runtime.actPanic";

/// How often a panic's drive asks for a compaction again.
const COMPACTION_RETRY: Duration = Duration::from_millis(500);

/// Asks the member at `url` to compact to its current revision, told to the watches first
/// (`workload`); the answer does not matter (a revision compacted already is refused, a member
/// that dies in it does not answer).
async fn compact_now(url: &str, bound: Duration, workload: &super::workload::Workload) {
    // No transaction with a range at an older revision is drawn or in flight meanwhile (one the
    // compaction overtook would be refused: etcd-io/etcd#18667).
    let _gate = workload.compaction_gate().await;
    let Ok(s) = etcd::status(url, bound).await else { return };
    let Some(rev) = s.header().map(|h| h.revision()) else { return };
    workload.compaction_requested(rev);
    if let Ok(mut c) = etcd::connect(url, bound).await {
        let res = etcd::bounded("compact", bound, c.compact(rev, None)).await;
        tracing::debug!(url, rev, ?res, "failpoint: compaction asked");
    }
}

/// One request to a member's gofail endpoint: `(status, body)`.
async fn gofail(method: http::Method, url: &str, body: &str) -> Result<(u16, String), String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::builder()
        .method(method.clone())
        .uri(url)
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let res = tokio::time::timeout(GOFAIL_BOUND, async {
        let res = client.request(req).await.map_err(|e| e.to_string())?;
        let status = res.status().as_u16();
        let body = res.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>((status, String::from_utf8_lossy(&body).trim().to_string()))
    })
    .await;
    match res {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(format!("{method} {url}: {e}")),
        Err(_) => Err(format!("{method} {url}: no answer within {}s", GOFAIL_BOUND.as_secs())),
    }
}

impl LocalTarget {
    /// Whether `failpoint(mN, …)` can run here: the member's etcd is a failpoint build, and the
    /// snapshot paths can be reached (as `partition-until-snapshot`: nftables, a small
    /// `snapshot_count`, the member alone in its site).
    pub(super) fn failpoint_supported(&self, op: &Op) -> Result<(), crate::targets::Unsupported> {
        let Op::Failpoint { member, failpoint, .. } = *op else { return Ok(()) };
        let binary = self.testbed.members.get(&member).and_then(|m| self.testbed.cfg.binaries.etcd.get(&m.version));
        let Some(list) = binary.and_then(|b| b.failpoints.as_deref()) else {
            return Err(format!("{member}'s etcd is not a failpoint build: set [etcd] failpoints = true in the profile").into());
        };
        if failpoint.registered_in(list).is_none() {
            return Err(format!("{member}'s failpoint build has no {failpoint}").into());
        }
        match failpoint.trigger() {
            Trigger::IncomingSnapshot => self.partition_until_snapshot_supported(&Op::PartitionUntilSnapshot { member }),
            Trigger::OwnSnapshot if self.testbed.cfg.etcd.snapshot_count.is_none() => {
                Err("the member's own snapshot comes every [etcd] snapshot_count entries: set it (at most 10,000)".into())
            }
            Trigger::OwnSnapshot | Trigger::Writes | Trigger::Leading | Trigger::Following | Trigger::Defrag | Trigger::Compaction => {
                Ok(())
            }
        }
    }

    /// `failpoint(mN, NAME, ACTION)`: see the module's documentation. A `failpoint` note in the
    /// event log says what was armed and what happened (exit status, or the longest wait).
    pub(super) async fn failpoint(&mut self, id: MemberId, fp: Failpoint, action: FailpointAction) -> Result<(), LocalError> {
        let what = format!("failpoint({id}, {fp}, {action})");
        let m = self.testbed.members.get(&id).ok_or_else(|| LocalError::Stack(format!("testbed has no member {id}")))?;
        let registered = self
            .testbed
            .cfg
            .binaries
            .etcd
            .get(&m.version)
            .and_then(|b| b.failpoints.as_deref())
            .and_then(|list| fp.registered_in(list))
            .map(String::from)
            .ok_or_else(|| LocalError::Unsupported(format!("{id}'s etcd {} is not a failpoint build with {fp}", m.version)))?;
        let endpoint = format!("http://{}:{FAILPOINT_PORT}/{registered}", m.ip);
        let log = self.member_log(id)?;
        match fp.trigger() {
            Trigger::Leading => self.move_leader_to(id).await.map_err(|e| LocalError::Stack(format!("{what}: {e}")))?,
            Trigger::Following => self.move_leader_off(id).await,
            Trigger::Writes | Trigger::OwnSnapshot | Trigger::IncomingSnapshot | Trigger::Defrag | Trigger::Compaction => {}
        }
        // Armed (gofail answers 204 once the terms are set). It is read back only after the
        // drive: a failpoint that fires at once holds the lock gofail's status takes for as long
        // as it sleeps (3.5's gofail), and a panic takes the endpoint down with the process.
        let panics_before = observe::lines_containing(&log, &panic_line(&registered));
        let frames_before = observe::lines_containing(&log, PANIC_FRAME);
        let terms = action.terms(&registered);
        let armed_at = Instant::now();
        match gofail(http::Method::PUT, &endpoint, &terms).await {
            Ok((204, _)) => {}
            Ok((status, body)) => return Err(LocalError::Stack(format!("{what}: gofail refused {terms:?} ({status}: {body})"))),
            Err(e) => return Err(LocalError::Environment(format!("{what}: arming it: {e}"))),
        }
        let detail = match action {
            FailpointAction::Panic => {
                let exit = self.drive_to_panic(id, fp).await;
                let exit = match exit {
                    Ok(Some(status)) => status,
                    Ok(None) => {
                        let _ = gofail(http::Method::DELETE, &endpoint, "").await;
                        return Err(LocalError::Stack(format!(
                            "{what}: etcd was driven there for {}s and did not panic: the failpoint was not reached",
                            self.bounds.op.as_secs()
                        )));
                    }
                    Err(e) => return Err(LocalError::Stack(format!("{what}: {e}"))),
                };
                let named = observe::lines_containing(&log, &panic_line(&registered)) > panics_before;
                if !named && observe::lines_containing(&log, PANIC_FRAME) <= frames_before {
                    return Err(LocalError::Stack(format!(
                        "{what}: the process exited ({exit}) without gofail's panic for {registered} in its log, nor gofail's panic among its goroutines: it died of something else"
                    )));
                }
                // Down like a crashed member: on the control-plane stack its machine's apiserver
                // goes with it (a restart starts both, as after a crash).
                self.testbed.kill(id).await?;
                // `printed: false`: another goroutine's panic was the one Go printed.
                json!({ "member": id.to_string(), "failpoint": registered, "action": action.to_string(), "exit": exit.to_string(), "printed": named, "ms": armed_at.elapsed().as_millis() as u64 })
            }
            FailpointAction::Sleep { ms } => {
                let sleep = Duration::from_millis(ms.into());
                let waited = self.drive_to_sleep(id, fp, sleep).await;
                let shown = gofail(http::Method::GET, &endpoint, "").await;
                let _ = gofail(http::Method::DELETE, &endpoint, "").await;
                match shown {
                    Ok((200, shown)) if shown == terms => {}
                    Ok((status, shown)) => {
                        return Err(LocalError::Stack(format!("{what}: armed with {terms:?}, its endpoint shows {shown:?} ({status})")))
                    }
                    Err(e) => return Err(LocalError::Stack(format!("{what}: reading it back: {e}"))),
                }
                let waited = waited.map_err(|e| LocalError::Stack(format!("{what}: {e}")))?;
                self.wait_caught_up(id, &format!("after {what}")).await?;
                json!({ "member": id.to_string(), "failpoint": registered, "action": action.to_string(), "waited_ms": waited.as_millis() as u64 })
            }
        };
        tracing::debug!(member = %id, %detail, "failpoint fired");
        self.log.push(crate::targets::Note { kind: "failpoint".into(), detail });
        Ok(())
    }

    /// Drives etcd to an armed panic: writes through every member (or the cut and the snapshot,
    /// or a defrag), until the member's process exits or the op bound. The exit status, or
    /// `None` if the process still runs at the bound.
    async fn drive_to_panic(&mut self, id: MemberId, fp: Failpoint) -> Result<Option<std::process::ExitStatus>, String> {
        let deadline = Instant::now() + self.bounds.op;
        let key = format!("/shakedown/{}/failpoint-fill", self.testbed.cfg.run_id);
        let fillers = match fp.trigger() {
            Trigger::Writes | Trigger::Leading | Trigger::Following | Trigger::OwnSnapshot | Trigger::Compaction => {
                Some(Fillers::start(&self.urls(), &key, deadline, self.bounds.request))
            }
            Trigger::IncomingSnapshot => return self.drive_to_incoming_snapshot(id, deadline).await,
            Trigger::Defrag => {
                let url = self.url_of(id).map_err(|e| e.to_string())?;
                let bound = self.bounds.op;
                // Its answer does not matter: the process dies in it.
                tokio::spawn(async move {
                    if let Ok(mut c) = etcd::connect(&url, bound).await {
                        let _ = etcd::bounded("defragment", bound, c.defragment()).await;
                    }
                });
                None
            }
        };
        let url = self.url_of(id).map_err(|e| e.to_string())?;
        let mut exit = None;
        let mut next_compaction = Instant::now();
        while Instant::now() < deadline {
            if let Some(status) = self.testbed.exit_status(id) {
                exit = Some(status);
                break;
            }
            // A compaction now and then (one refused as already compacted waits for the fillers'
            // revisions).
            if fp.trigger() == Trigger::Compaction && Instant::now() >= next_compaction {
                compact_now(&url, self.bounds.request, &self.workload).await;
                next_compaction = Instant::now() + COMPACTION_RETRY;
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
        if let Some(f) = fillers {
            f.stop().await;
        }
        Ok(exit)
    }

    /// Drives a member to a panic on the leader's snapshot: its raft traffic cut until the
    /// others have compacted their logs past it, then let back (the leader can only send it a
    /// snapshot); it panics on it. A member that catches up without a snapshot (what was in
    /// flight at the cut reached it) is cut again, while the op's bound allows: caught up, alive
    /// and without a snapshot in its log for [`CAUGHT_UP_SETTLE`] (a member taking the snapshot
    /// answers at the snapshot's index a moment before its log says so, and panics just after).
    /// The exit status, or `None` if the process still runs at the bound.
    async fn drive_to_incoming_snapshot(&mut self, id: MemberId, deadline: Instant) -> Result<Option<std::process::ExitStatus>, String> {
        let log = self.member_log(id).map_err(|e| e.to_string())?;
        let url = self.url_of(id).map_err(|e| e.to_string())?;
        let mut cuts = 0;
        while Instant::now() < deadline {
            let received_before = observe::snapshots_received_in(&log);
            let reached = match self.cut_until_outrun(id, "failpoint").await {
                Ok((_, reached)) => reached,
                // It may have died on a snapshot the last cut brought after all.
                Err(e) => return self.testbed.exit_status(id).map(Some).ok_or_else(|| e.to_string()),
            };
            cuts += 1;
            let mut caught_up_since: Option<Instant> = None;
            let mut next_look = Instant::now();
            loop {
                if let Some(status) = self.testbed.exit_status(id) {
                    return Ok(Some(status));
                }
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                // The exit is polled often; the member's log (read whole) and its status less.
                if Instant::now() >= next_look {
                    next_look = Instant::now() + CAUGHT_UP_POLL;
                    let caught_up = observe::snapshots_received_in(&log) == received_before
                        && etcd::status(&url, self.bounds.request).await.is_ok_and(|s| s.raft_index() >= reached);
                    if !caught_up {
                        caught_up_since = None;
                    } else if caught_up_since.get_or_insert_with(Instant::now).elapsed() >= CAUGHT_UP_SETTLE {
                        tracing::warn!(member = %id, cuts, reached, "failpoint: caught up without the leader's snapshot; cut again");
                        break;
                    }
                }
                tokio::time::sleep(EXIT_POLL).await;
            }
        }
        Ok(None)
    }

    /// Drives etcd to an armed sleep with requests of the op's own to the member, one at a
    /// time — puts, or a defrag — until one of them waits out most of the sleep (the raft loop
    /// or the backend's lock is held while etcd sleeps there). The longest wait.
    async fn drive_to_sleep(&mut self, id: MemberId, fp: Failpoint, sleep: Duration) -> Result<Duration, String> {
        let url = self.url_of(id).map_err(|e| e.to_string())?;
        let bound = sleep + self.bounds.request;
        let deadline = Instant::now() + sleep * SLEEP_TRIES + SLEEP_SLACK;
        let key = format!("/shakedown/{}/failpoint-fill", self.testbed.cfg.run_id);
        let mut c = etcd::connect(&url, bound).await.map_err(|e| e.to_string())?;
        let mut longest = Duration::ZERO;
        let mut errors = vec![];
        let mut i = 0u64;
        while Instant::now() < deadline {
            i += 1;
            let started = Instant::now();
            if fp.trigger() == Trigger::Compaction {
                compact_now(&url, self.bounds.request, &self.workload).await;
            }
            // An error (a leader that lost its leadership while it slept, say) still waited.
            let res = match fp.trigger() {
                Trigger::Defrag => etcd::bounded("defragment", bound, c.defragment()).await.map(drop),
                _ => etcd::bounded("put", bound, c.put(key.as_str(), i.to_string(), None)).await.map(drop),
            };
            let took = started.elapsed();
            longest = longest.max(took);
            if let Err(e) = res {
                errors.push(e.to_string());
            }
            if took.as_secs_f64() >= sleep.as_secs_f64() * SLEEP_SEEN_SHARE {
                return Ok(took);
            }
        }
        errors.dedup();
        Err(format!(
            "no request to the member waited out the sleep: the longest took {} ms of {} ms in {} requests (errors: {}): the failpoint was not reached",
            longest.as_millis(),
            sleep.as_millis(),
            i,
            if errors.is_empty() { "none".into() } else { errors.join("; ") }
        ))
    }

    /// Makes member `id` the leader (etcd's MoveLeader, sent to the current leader), verified
    /// by the member's own status.
    async fn move_leader_to(&self, id: MemberId) -> Result<(), String> {
        let url = self.url_of(id).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + self.bounds.op.min(Duration::from_secs(20));
        let mut last = String::new();
        while Instant::now() < deadline {
            match etcd::status(&url, self.bounds.request).await {
                Ok(s) => {
                    let me = s.header().map(|h| h.member_id()).unwrap_or(0);
                    if me != 0 && s.leader() == me {
                        return Ok(());
                    }
                    // MoveLeader must be asked of the leader.
                    for other in self.urls().into_iter().filter(|u| *u != url) {
                        let Ok(o) = etcd::status(&other, self.bounds.request).await else { continue };
                        if o.header().map(|h| h.member_id()) != Some(o.leader()) {
                            continue;
                        }
                        match etcd::connect(&other, MOVE_LEADER_BOUND).await {
                            Ok(mut c) => {
                                if let Err(e) = etcd::bounded("move leader", MOVE_LEADER_BOUND, c.move_leader(me)).await {
                                    last = e.to_string();
                                }
                            }
                            Err(e) => last = e.to_string(),
                        }
                    }
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(format!("leadership could not be moved to {id} (last error: {})", if last.is_empty() { "none" } else { &last }))
    }
}
