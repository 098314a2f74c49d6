//! `linearizability`: the history checker over every request of the workload's clients.

use crate::{Observation, Verdict};

/// Search steps per key and epoch before a check is undecided.
pub const BOUND: u64 = shakedown_history::DEFAULT_BOUND;

pub(crate) fn linearizability(obs: &Observation) -> Verdict {
    match &obs.history {
        Some(history) => crate::known::with_txn_range_refused(judge(history), obs),
        None => Verdict::Unobserved("no history of the workload's requests".into()),
    }
}

/// `api-linearizability`: the same checker over the Kubernetes API workload's history.
pub(crate) fn api_linearizability(obs: &Observation) -> Verdict {
    match obs.api.as_ref().map(|a| a.history.as_ref()) {
        Some(Some(history)) => judge(history),
        Some(None) => Verdict::Unobserved("no history of the API workload's requests".into()),
        None => Verdict::Unobserved("no Kubernetes API observation".into()),
    }
}

/// `app-linearizability`: the same checker over the application's data workload (registers).
pub(crate) fn app_linearizability(obs: &Observation) -> Verdict {
    match obs.app.as_ref().map(|a| a.history.as_ref()) {
        Some(Some(history)) => judge(history),
        Some(None) => Verdict::Unobserved("no history of the data workload's requests".into()),
        None => Verdict::Unobserved("no application observation".into()),
    }
}

fn judge(history: &crate::HistoryView) -> Verdict {
    // An empty history was observed (no request has ended yet, as at bring-up): nothing
    // contradicts it. The run's history.jsonl shows how much was judged.
    let report = history.check();
    match report.verdict {
        shakedown_history::Verdict::Linearizable => Verdict::Pass,
        // An answer already given cannot be taken back: waiting changes nothing.
        shakedown_history::Verdict::Violation { .. } => Verdict::Definite(report.detail()),
        shakedown_history::Verdict::Undecided { .. } => Verdict::Fail(format!("undecided: {}", report.detail())),
    }
}
