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
use std::sync::Mutex;
use std::time::Instant;

use shakedown_history::format::Request;
use shakedown_history::{History, ModelKind, Operation};

/// A request sent and not answered yet.
pub(crate) struct Sent {
    ticket: u64,
    client: u64,
    epoch: u32,
    call: u64,
}

#[derive(Default)]
struct Log {
    done: Vec<Operation>,
    in_flight: HashMap<u64, Operation>,
}

pub(crate) struct Requests {
    t0: Instant,
    epoch: AtomicU32,
    tickets: AtomicU64,
    log: Mutex<Log>,
}

impl Requests {
    pub(crate) fn new(t0: Instant) -> Requests {
        Requests { t0, epoch: AtomicU32::new(0), tickets: AtomicU64::new(0), log: Mutex::default() }
    }

    fn now_us(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// `client` is about to send `request` (its answer field is ignored until it is answered).
    pub(crate) fn send(&self, client: u64, request: Request) -> Sent {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let epoch = self.epoch.load(Ordering::SeqCst);
        let call = self.now_us();
        let op = Operation { client, member: None, epoch, call, ret: None, request };
        self.log.lock().expect("requests lock").in_flight.insert(ticket, op);
        Sent { ticket, client, epoch, call }
    }

    /// The request of `sent` ended: `answered` is the request with its answer filled in (or
    /// left `None`: no answer), `member` who answered.
    pub(crate) fn end(&self, sent: Sent, request: Request, member: Option<String>) {
        let ret = self.now_us();
        let now = self.epoch.load(Ordering::SeqCst);
        let mut log = self.log.lock().expect("requests lock");
        log.in_flight.remove(&sent.ticket);
        let answered = request.answered();
        let op = Operation { client: sent.client, member, epoch: sent.epoch, call: sent.call, ret: answered.then_some(ret), request };
        if now == sent.epoch {
            log.done.push(op);
        } else {
            for epoch in sent.epoch..=now {
                log.done.push(Operation { epoch, ret: None, request: unanswered(&op.request), ..op.clone() });
            }
        }
    }

    /// The instant a read is sent, for [`Self::reads`].
    pub(crate) fn read_sent(&self) -> (u32, u64) {
        (self.epoch.load(Ordering::SeqCst), self.now_us())
    }

    /// A read sent at `sent` (from [`Self::read_sent`]) was answered: `gets` are its answers
    /// about single keys (a range read is one get per key it covers: each projection of an
    /// atomic read must be explained on its own). A read that spans a restore is dropped: with
    /// no answer it constrains nothing.
    pub(crate) fn reads(&self, client: u64, sent: (u32, u64), member: Option<String>, gets: Vec<Request>) {
        let (epoch, call) = sent;
        if self.epoch.load(Ordering::SeqCst) != epoch {
            return;
        }
        let ret = Some(self.now_us());
        let mut log = self.log.lock().expect("requests lock");
        log.done.extend(gets.into_iter().map(|request| Operation { client, member: member.clone(), epoch, call, ret, request }));
    }

    /// The store is being replaced by a restore: requests from now on are answered by the
    /// restored store, whose revisions start again from the backup's.
    pub(crate) fn new_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// Every request so far: those ended, and those in flight (unknown outcome), in the epochs
    /// they span.
    pub(crate) fn history(&self) -> History {
        let now = self.epoch.load(Ordering::SeqCst);
        let log = self.log.lock().expect("requests lock");
        let mut ops = log.done.clone();
        for op in log.in_flight.values() {
            for epoch in op.epoch..=now {
                ops.push(Operation { epoch, ..op.clone() });
            }
        }
        History { model: ModelKind::Etcd, ops }
    }
}

/// `r` with no answer.
fn unanswered(r: &Request) -> Request {
    let mut r = r.clone();
    match &mut r {
        Request::Get { answer, .. } => *answer = None,
        Request::Put { answer, .. } => *answer = None,
        Request::Delete { answer, .. } => *answer = None,
        Request::Txn { answer, .. } => *answer = None,
        Request::Read { answer, .. } => *answer = None,
        Request::Write { answer, .. } => *answer = None,
        Request::Cas { answer, .. } => *answer = None,
    }
    r
}
