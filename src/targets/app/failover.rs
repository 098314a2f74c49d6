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
async fn leader_now(pods: &Api<Pod>, selector: &str) -> Option<Option<Leader>> {
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
        let before = leader_now(&pods, &selector).await.flatten();
        let (op_done, mut done) = watch::channel(false);
        let task = tokio::spawn(async move {
            let Some(before) = before else { return Seen::Untouched };
            let mut lost_at: Option<Instant> = None;
            let mut done_at: Option<Instant> = None;
            loop {
                match leader_now(&pods, &selector).await {
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

impl super::AppTarget {
    /// `switchover(mN)`: the `[switchover]` command exec'd in the leader's pod, asking the
    /// operator to hand the lead to replica N (to the next replica when N leads already), then
    /// verified: the `[leader]` selector's Ready pod is the candidate. An `app-switchover` event
    /// names both and how long the operator took.
    pub(super) async fn switchover(
        &mut self,
        m: shakedown_faults::MemberId,
        model: &shakedown_faults::Model,
    ) -> Result<(), crate::targets::TargetError> {
        use crate::targets::TargetError;
        let (Some(sw), Some(l)) = (self.spec.app_profile.switchover.clone(), self.spec.app_profile.leader.clone()) else {
            return Err(TargetError::Unsupported("switchover needs [switchover] and [leader] in the app profile".into()));
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let replicas = model.size().max(1) as u32;
        if self.dry_run {
            let cmd = super::spec::fill(
                &sw.command,
                &std::collections::BTreeMap::from([("leader", "<the leader>".to_string()), ("pod", self.pod_name(m))]),
            );
            self.dry_write(|| format!("exec in the leader's pod ({}): {cmd:?}", l.selector));
            self.dry_wait(&format!("{} (or the next replica, if it leads already) leads ({})", self.pod_name(m), l.selector));
            return Ok(());
        }
        let Some(Some(leader)) = leader_now(&pods, &l.selector).await else {
            return Err(TargetError::Stack(format!("no Ready leader ({}) to switch over from", l.selector)));
        };
        let mut candidate = self.pod_name(m);
        if candidate == leader.name {
            candidate = self.pod_name(shakedown_faults::MemberId((m.0 + 1) % replicas));
        }
        let cmd = super::spec::fill(
            &sw.command,
            &std::collections::BTreeMap::from([("leader", leader.name.clone()), ("pod", candidate.clone())]),
        );
        let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let t0 = Instant::now();
        let out =
            crate::k8s::exec::exec(&self.client, self.ns(), &leader.name, sw.container.as_deref(), &refs, self.spec.app_profile.op_timeout)
                .await
                .map_err(|e| TargetError::Stack(format!("switchover command in {}: {e}", leader.name)))?;
        if out.code != 0 {
            return Err(TargetError::Stack(format!(
                "switchover {} → {candidate}: the operator refused (exit {}): {}",
                leader.name,
                out.code,
                format!("{} {}", out.stdout.trim(), out.stderr.trim()).trim()
            )));
        }
        // A command that names the candidate asks for it; one that does not leaves the choice to
        // the operator (Patroni's: its synchronous standby), and any other pod will do.
        let named = sw.command.iter().any(|a| a.contains("{pod}"));
        let selector = l.selector.clone();
        let what = if named {
            format!("{candidate} leads ({selector}) after the switchover from {}", leader.name)
        } else {
            format!("another pod than {} leads ({selector}) after the switchover", leader.name)
        };
        let old = leader.name.clone();
        let led = self
            .wait(&what, || {
                let (pods, selector, candidate, old) = (pods.clone(), selector.clone(), candidate.clone(), old.clone());
                async move {
                    leader_now(&pods, &selector).await.flatten().filter(|now| if named { now.name == candidate } else { now.name != old })
                }
            })
            .await;
        // The operator's exit status is not its answer (patronictl 3.0.2 exits 0 on a refused
        // switchover): what it said goes with the verdict.
        let said = format!("{} {}", out.stdout.trim(), out.stderr.trim()).trim().to_string();
        let now = match led {
            Ok(now) => now,
            Err(TargetError::Stack(m)) => return Err(TargetError::Stack(format!("{m}; the switchover command exited 0 and said: {said}"))),
            Err(e) => return Err(e),
        };
        let candidate = now.name;
        let ms = t0.elapsed().as_millis() as u64;
        tracing::info!("switchover: {} → {candidate} in {:.1} s", leader.name, ms as f64 / 1000.0);
        self.log.push(crate::targets::Note {
            kind: "app-switchover".into(),
            detail: serde_json::json!({"from": leader.name, "to": candidate, "asked": self.pod_name(m), "ms": ms}),
        });
        Ok(())
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
