//! Failovers seen: with the app profile's `[leader]`, every op is watched from its start for
//! the leader's pod (the one Ready pod of the leader selector). An op that took the leader away
//! is followed until a pod leads again: another one (a failover), or the same one back (the
//! operator kept the old leader). An `app-failover` event says which, and how long no Ready pod
//! led; an op that never touched the leader adds nothing.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::Client;
use tokio::sync::watch;

use super::data::is_ready;

/// How often the leader is looked for while an op runs.
const LEADER_POLL: Duration = Duration::from_millis(100);

/// A leader's pod.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Leader {
    pub name: String,
    pub uid: Option<String>,
}

/// What came of the leader during an op.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Seen {
    /// The same pod led throughout (or there was no leader before the op either).
    Untouched,
    /// The leader was lost, and `after` leads since; `without` is how long no Ready pod led.
    Replaced { before: Leader, after: Leader, without: Duration },
    /// The leader was lost and no pod led again within the bound.
    NoLeader { before: Leader, bound: Duration },
}

/// The watch of one op.
pub(super) struct LeaderWatch {
    op_done: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Seen>,
}

/// The Ready pod of `selector` (the first by name, should several claim it).
async fn leader(pods: &Api<Pod>, selector: &str) -> Option<Option<Leader>> {
    let listed = tokio::time::timeout(Duration::from_secs(5), pods.list(&ListParams::default().labels(selector))).await.ok()?.ok()?;
    Some(
        listed
            .items
            .into_iter()
            .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
            .map(|p| Leader { name: p.metadata.name.unwrap_or_default(), uid: p.metadata.uid }),
    )
}

impl LeaderWatch {
    /// Starts watching before an op: the leader now, then every [`LEADER_POLL`]. Once the op is
    /// done ([`LeaderWatch::finish`]), a leader never lost ends the watch at once; a lost one is
    /// followed for up to `bound` more.
    pub(super) async fn start(client: Client, namespace: &str, selector: &str, bound: Duration) -> LeaderWatch {
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let selector = selector.to_string();
        let before = leader(&pods, &selector).await.flatten();
        let (op_done, mut done) = watch::channel(false);
        let task = tokio::spawn(async move {
            let Some(before) = before else { return Seen::Untouched };
            let mut lost_at: Option<Instant> = None;
            let mut done_at: Option<Instant> = None;
            loop {
                match leader(&pods, &selector).await {
                    // Unanswered: nothing learnt this round.
                    None => {}
                    Some(Some(now)) if now.uid == before.uid => {
                        if let Some(t) = lost_at {
                            return Seen::Replaced { before, after: now, without: t.elapsed() };
                        }
                    }
                    Some(Some(now)) => {
                        let without = lost_at.map(|t| t.elapsed()).unwrap_or_default();
                        return Seen::Replaced { before, after: now, without };
                    }
                    Some(None) => {
                        lost_at.get_or_insert_with(Instant::now);
                    }
                }
                if *done.borrow() {
                    if lost_at.is_none() {
                        return Seen::Untouched;
                    }
                    if done_at.get_or_insert_with(Instant::now).elapsed() > bound {
                        return Seen::NoLeader { before, bound };
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(LEADER_POLL) => {}
                    _ = done.changed() => {}
                }
            }
        });
        LeaderWatch { op_done, task }
    }

    /// The op is done: what came of its leader (waiting, if it was lost, until a pod leads
    /// again or the bound passes).
    pub(super) async fn finish(self) -> Seen {
        let _ = self.op_done.send(true);
        self.task.await.unwrap_or(Seen::Untouched)
    }
}

impl Seen {
    /// The event's detail and the line said to the user; `None` when the leader was untouched.
    pub(super) fn report(&self, selector: &str) -> Option<(serde_json::Value, String)> {
        match self {
            Seen::Untouched => None,
            Seen::Replaced { before, after, without } => {
                let failover = after.name != before.name;
                let detail = serde_json::json!({
                    "selector": selector,
                    "before": before.name,
                    "after": after.name,
                    "failover": failover,
                    "without_leader_ms": without.as_millis() as u64,
                });
                let secs = without.as_secs_f64();
                let line = if failover {
                    format!("failover: {} → {} ({selector}), {secs:.1} s without a Ready leader", before.name, after.name)
                } else {
                    format!(
                        "no failover: {} leads again ({selector}; the operator kept the old leader), {secs:.1} s without a Ready leader",
                        before.name
                    )
                };
                Some((detail, line))
            }
            Seen::NoLeader { before, bound } => {
                let detail = serde_json::json!({
                    "selector": selector,
                    "before": before.name,
                    "after": null,
                    "failover": false,
                    "without_leader_ms": null,
                });
                Some((detail, format!("no Ready leader ({selector}) within {}s of {}'s loss", bound.as_secs(), before.name)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(name: &str, uid: &str) -> Leader {
        Leader { name: name.into(), uid: Some(uid.into()) }
    }

    #[test]
    fn a_report_tells_a_failover_from_a_kept_leader_and_says_nothing_of_an_untouched_one() {
        assert_eq!(Seen::Untouched.report("role=master"), None);
        let (d, line) = Seen::Replaced { before: l("pg-1", "a"), after: l("pg-0", "b"), without: Duration::from_millis(4321) }
            .report("role=master")
            .unwrap();
        assert_eq!((d["failover"].as_bool(), d["without_leader_ms"].as_u64()), (Some(true), Some(4321)));
        assert_eq!(line, "failover: pg-1 → pg-0 (role=master), 4.3 s without a Ready leader");
        let (d, line) = Seen::Replaced { before: l("pg-1", "a"), after: l("pg-1", "c"), without: Duration::from_secs(3) }
            .report("role=master")
            .unwrap();
        assert_eq!(d["failover"].as_bool(), Some(false));
        assert!(line.starts_with("no failover: pg-1 leads again"), "{line}");
        let (d, line) = Seen::NoLeader { before: l("pg-1", "a"), bound: Duration::from_secs(180) }.report("role=master").unwrap();
        assert!(d["after"].is_null() && line.contains("within 180s of pg-1's loss"), "{line}");
    }
}
