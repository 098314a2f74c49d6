//! Every request the workload's clients send and what each got: the run's history, for the
//! history checker (`linearizability`) and the run directory's `history.jsonl`.
//!
//! Instants are microseconds on one monotonic clock from the workload's start. A request
//! without an answer (an error, a timeout, still in flight) has an unknown outcome. Restores
//! from a backup start a new epoch: a request sent in one epoch and answered in a later one is
//! of unknown outcome in each epoch it spans (it may have been applied by the old store or the
//! restored one).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use shakedown_history::format::Request;
use shakedown_history::{History, Incremental, ModelKind, Operation};
use shakedown_invariants::observation::HistoryView;
use shakedown_invariants::ChunkedLog;

/// A request sent and not answered yet.
pub(crate) struct Sent {
    ticket: u64,
    client: u64,
    epoch: u32,
    call: u64,
}

/// A request over several keys sent and not answered yet (see [`Requests::send_group`]).
pub(crate) struct SentGroup {
    tickets: Vec<u64>,
    client: u64,
    epoch: u32,
    call: u64,
}

/// A read sent and not answered yet (see [`Requests::read_sent`]). Dropped without
/// [`Requests::reads`] (the read failed), it is forgotten: with no answer it constrains nothing.
pub(crate) struct ReadSent {
    ticket: u64,
    epoch: u32,
    call: u64,
    log: Arc<Mutex<Log>>,
}

impl Drop for ReadSent {
    fn drop(&mut self) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).reading.remove(&self.ticket);
    }
}

#[derive(Default)]
struct Log {
    /// Ended, in the order they ended.
    done: ChunkedLog<Operation>,
    in_flight: HashMap<u64, Operation>,
    /// Reads sent and not answered: their calls (reads enter the history when answered).
    reading: HashMap<u64, u64>,
    /// Member ids (as the answers' headers give them) and the members' names.
    members: HashMap<String, String>,
    /// The requests that ended without an answer, when they may still take effect after a
    /// restore ([`Requests::outliving`]).
    unknown: Vec<Operation>,
    /// A restore is replacing the store at an instant nobody reports ([`Requests::replacing`]).
    replacing: bool,
}

pub(crate) struct Requests {
    t0: Instant,
    /// What the requests are: etcd's key-value API, or registers (the application's data).
    model: ModelKind,
    epoch: AtomicU32,
    tickets: AtomicU64,
    log: Arc<Mutex<Log>>,
    /// The history checker's memory of this log, shared with every view of it.
    memo: Arc<Mutex<Incremental>>,
    /// A request without an answer may still take effect in a later epoch.
    outliving: bool,
}

impl Requests {
    pub(crate) fn new(t0: Instant, model: ModelKind) -> Requests {
        Requests {
            t0,
            model,
            epoch: AtomicU32::new(0),
            tickets: AtomicU64::new(0),
            log: Arc::default(),
            memo: Arc::new(Mutex::new(Incremental::new(shakedown_invariants::linearizability::BOUND))),
            outliving: false,
        }
    }

    /// A log whose requests without an answer may still take effect after a restore: each is
    /// carried into every later epoch as of unknown outcome. The application's data workload
    /// is one: its write command runs in a pod, and cut off by its bound it may go on running
    /// there, past a restore. (etcd's requests are not: a restore replaces every member's data
    /// directory, and with it any request still in its log.)
    pub(crate) fn outliving(mut self) -> Requests {
        self.outliving = true;
        self
    }

    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The epoch requests are sent in now (restores from a backup so far).
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// `client` is about to send `request` (its answer field is ignored until it is answered).
    pub(crate) fn send(&self, client: u64, request: Request) -> Sent {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let epoch = self.epoch.load(Ordering::SeqCst);
        let mut log = self.lock();
        let call = self.now_us();
        let op = Operation { client, member: None, epoch, group: None, call, ret: None, request };
        log.in_flight.insert(ticket, op);
        Sent { ticket, client, epoch, call }
    }

    /// The request of `sent` ended: `answered` is the request with its answer filled in (or
    /// left `None`: no answer), `member` who answered (its id as the answer's header gives it).
    pub(crate) fn end(&self, sent: Sent, request: Request, member: Option<String>) {
        let mut log = self.lock();
        // Read under the lock: a new epoch carries what has ended unanswered before it.
        let now = self.epoch.load(Ordering::SeqCst);
        let ret = self.now_us();
        log.in_flight.remove(&sent.ticket);
        let member = member.map(|m| label(&log.members, m));
        // An answer given while the store is being replaced may come from the old store or the
        // new one: it says nothing either can be held to.
        let request = if log.replacing { unanswered(&request) } else { request };
        let answered = request.answered();
        let op = Operation {
            client: sent.client,
            member,
            epoch: sent.epoch,
            group: None,
            call: sent.call,
            ret: answered.then_some(ret),
            request,
        };
        if self.outliving && !answered {
            log.unknown.push(Operation { epoch: now, ..op.clone() });
        }
        if now == sent.epoch {
            log.done.push(op);
        } else {
            for epoch in sent.epoch..=now {
                log.done.push(Operation { epoch, ret: None, request: unanswered(&op.request), ..op.clone() });
            }
        }
    }

    /// `client` is about to send a request over several keys whose writes are `writes`, one
    /// line per key (their answers are ignored until it is answered). Its lines share the call,
    /// the return and a group (the first line's ticket).
    pub(crate) fn send_group(&self, client: u64, writes: Vec<Request>) -> SentGroup {
        let first = self.tickets.fetch_add(writes.len().max(1) as u64, Ordering::Relaxed);
        let epoch = self.epoch.load(Ordering::SeqCst);
        let mut log = self.lock();
        let call = self.now_us();
        let mut tickets = Vec::with_capacity(writes.len());
        for (n, request) in writes.into_iter().enumerate() {
            let ticket = first + n as u64;
            log.in_flight.insert(ticket, Operation { client, member: None, epoch, group: Some(first), call, ret: None, request });
            tickets.push(ticket);
        }
        SentGroup { tickets, client, epoch, call }
    }

    /// The request of `sent` ended: `writes` are its lines from [`Self::send_group`], with their
    /// answers filled in (or left `None`: no answer), in the same order; `reads` the lines of
    /// what it read (only when it was answered: a read without an answer constrains nothing).
    pub(crate) fn end_group(&self, sent: SentGroup, writes: Vec<Request>, reads: Vec<Request>, member: Option<String>) {
        let mut log = self.lock();
        let now = self.epoch.load(Ordering::SeqCst);
        let ret = self.now_us();
        let group = sent.tickets.first().copied();
        for t in &sent.tickets {
            log.in_flight.remove(t);
        }
        let member = member.map(|m| label(&log.members, m));
        let replacing = log.replacing;
        let answered = !replacing && writes.iter().all(Request::answered);
        let line = |request: Request, epoch: u32, ret: Option<u64>| Operation {
            client: sent.client,
            member: member.clone(),
            epoch,
            group,
            call: sent.call,
            ret,
            request,
        };
        if now == sent.epoch && answered {
            for request in writes.into_iter().chain(reads) {
                log.done.push(line(request, sent.epoch, Some(ret)));
            }
        } else {
            // No answer, or one that spans a restore or came while the store was replaced: of
            // unknown outcome in every epoch it spans; what it read says nothing.
            for epoch in sent.epoch..=now {
                for request in &writes {
                    log.done.push(line(unanswered(request), epoch, None));
                }
            }
        }
    }

    /// The request of `sent` was refused in a way its request cannot express (a Kubernetes 409
    /// says the precondition failed but not what the object is): it wrote nothing, and leaves
    /// the history.
    pub(crate) fn forget(&self, sent: Sent) {
        self.lock().in_flight.remove(&sent.ticket);
    }

    /// A read is about to be sent, for [`Self::reads`].
    pub(crate) fn read_sent(&self) -> ReadSent {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let epoch = self.epoch.load(Ordering::SeqCst);
        let mut log = self.lock();
        let call = self.now_us();
        log.reading.insert(ticket, call);
        ReadSent { ticket, epoch, call, log: self.log.clone() }
    }

    /// A read sent at `sent` (from [`Self::read_sent`]) was answered: `gets` are its answers
    /// about single keys (a range read is one get per key it covers: each projection of an
    /// atomic read must be explained on its own). A read that spans a restore is dropped: with
    /// no answer it constrains nothing.
    pub(crate) fn reads(&self, client: u64, sent: ReadSent, member: Option<String>, gets: Vec<Request>) {
        let mut log = self.lock();
        log.reading.remove(&sent.ticket);
        if self.epoch.load(Ordering::SeqCst) != sent.epoch || log.replacing {
            return;
        }
        let ret = Some(self.now_us());
        let member = member.map(|m| label(&log.members, m));
        // Several keys' lines of one read share a group.
        let group = (gets.len() > 1).then_some(sent.ticket);
        for request in gets {
            log.done.push(Operation { client, member: member.clone(), epoch: sent.epoch, group, call: sent.call, ret, request });
        }
    }

    /// The store is being replaced by a restore: requests from now on are answered by the
    /// restored store, whose revisions start again from the backup's. It also ends what
    /// [`Self::replacing`] began.
    pub(crate) fn new_epoch(&self) {
        let mut log = self.lock();
        log.replacing = false;
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let carried: Vec<Operation> = log.unknown.iter().map(|op| Operation { epoch, ..op.clone() }).collect();
        for op in carried {
            log.done.push(op);
        }
    }

    /// A restore begins that replaces the store at an instant it does not report (a hook, an
    /// operator): a new epoch, in which every request answered is recorded without its answer,
    /// and every read left out, until [`Self::new_epoch`] says the restore is over. Only the
    /// epoch after it holds the restored store's answers.
    pub(crate) fn replacing(&self) {
        self.new_epoch();
        self.lock().replacing = true;
    }

    /// The members' names by their ids (hexadecimal, as the answers' headers give them): the
    /// requests that end from now on name the member that answered.
    pub(crate) fn name_members(&self, names: &HashMap<String, String>) {
        let mut log = self.lock();
        for (id, name) in names {
            log.members.insert(id.clone(), name.clone());
        }
    }

    /// The name of the member with this id (hexadecimal), or the id when it has none yet.
    pub(crate) fn member_name(&self, id: &str) -> String {
        self.lock().members.get(id).cloned().unwrap_or_else(|| id.to_string())
    }

    /// Every request so far: those ended, and those in flight (unknown outcome), in the epochs
    /// they span; every member named.
    pub(crate) fn history(&self) -> History {
        let view = self.view();
        let mut ops: Vec<Operation> = view.ended.iter().chain(&view.in_flight).cloned().collect();
        for op in &mut ops {
            if let Some(name) = op.member.as_ref().and_then(|m| view.members.get(m)) {
                op.member = Some(name.clone());
            }
        }
        History { model: self.model, ops }
    }

    /// The history as a check sees it: the ended requests (shared, not copied), those in flight
    /// in every epoch they span, and the horizon (no request that ends later was sent before
    /// it).
    pub(crate) fn view(&self) -> HistoryView {
        let now = self.epoch.load(Ordering::SeqCst);
        let log = self.lock();
        let taken = self.now_us();
        let mut in_flight = Vec::new();
        for op in log.in_flight.values() {
            for epoch in op.epoch..=now {
                in_flight.push(Operation { epoch, ..op.clone() });
            }
        }
        let horizon = in_flight.iter().map(|o| o.call).chain(log.reading.values().copied()).min().unwrap_or(taken).min(taken);
        let members = log.members.keys().map(|id| (id.clone(), label(&log.members, id.clone()))).collect();
        HistoryView { ended: log.done.snapshot(), in_flight, horizon, memo: self.memo.clone(), members }
    }
}

/// How the history names the member with id `id`: its name and its id (a member replaced under
/// the same name is another member, whose store starts again), or the id alone while its name
/// is not known.
fn label(members: &HashMap<String, String>, id: String) -> String {
    match members.get(&id) {
        Some(name) => format!("{name} ({id})"),
        None => id,
    }
}

/// `r` with no answer.
fn unanswered(r: &Request) -> Request {
    let mut r = r.clone();
    match &mut r {
        Request::Get { answer, .. } | Request::GetAt { answer, .. } => *answer = None,
        Request::Put { answer, .. } => *answer = None,
        Request::Delete { answer, .. } => *answer = None,
        Request::Txn { answer, .. } => *answer = None,
        Request::Read { answer, .. } => *answer = None,
        Request::Write { answer, .. } => *answer = None,
        Request::Cas { answer, .. } => *answer = None,
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use shakedown_history::format::{Done, Scalar};

    fn write(answer: Option<Done>) -> Request {
        Request::Write { key: "k".into(), value: Scalar::Int(1), answer }
    }

    /// A write of unknown outcome may still take effect after a restore when the log says its
    /// requests outlive their answer (the application's exec'd commands), and only then.
    #[test]
    fn unanswered_requests_are_carried_into_later_epochs_only_when_they_may_outlive_their_answer() {
        for outliving in [false, true] {
            let r = Requests::new(Instant::now(), ModelKind::Register);
            let r = if outliving { r.outliving() } else { r };
            let lost = r.send(0, write(None));
            r.end(lost, write(None), None);
            let done = r.send(0, write(None));
            r.end(done, write(Some(Done {})), None);
            r.new_epoch();
            r.new_epoch();
            let h = r.history();
            let epochs: Vec<(u32, bool)> = h.ops.iter().map(|o| (o.epoch, o.request.answered())).collect();
            let want = if outliving { vec![(0, false), (0, true), (1, false), (2, false)] } else { vec![(0, false), (0, true)] };
            assert_eq!(epochs, want, "outliving: {outliving}");
            assert_eq!(h.model, ModelKind::Register);
        }
    }

    /// While a restore replaces the store at an unreported instant, answers are recorded as
    /// unknown and reads left out; the epoch after it judges the restored store alone.
    #[test]
    fn answers_given_while_the_store_is_replaced_hold_nothing() {
        let read = |v: i64| Request::Read {
            key: "k".into(),
            answer: Some(shakedown_history::format::RegisterRead { value: Some(Scalar::Int(v)) }),
        };
        let r = Requests::new(Instant::now(), ModelKind::Register);
        r.replacing();
        let w = r.send(0, write(None));
        r.end(w, write(Some(Done {})), None);
        let t = r.read_sent();
        r.reads(1, t, None, vec![read(1)]);
        r.new_epoch();
        let w = r.send(0, write(None));
        r.end(w, write(Some(Done {})), None);
        let t = r.read_sent();
        r.reads(1, t, None, vec![read(1)]);
        let h = r.history();
        let seen: Vec<(u32, &str, bool)> = h
            .ops
            .iter()
            .map(|o| (o.epoch, if matches!(o.request, Request::Read { .. }) { "read" } else { "write" }, o.request.answered()))
            .collect();
        assert_eq!(seen, [(1, "write", false), (2, "write", true), (2, "read", true)]);
    }
}
