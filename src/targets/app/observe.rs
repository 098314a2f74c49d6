//! Observation: the workloads' Ready replicas, the probes, the data read-back, members as
//! serving when their pod is Ready (what the engine asks of healed members), and the
//! `AppInventory` for `leaks` (the run's policies, cordons, failed pods, the operator's scale).

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use shakedown_faults::{MemberId, Model};
use shakedown_invariants::{AppInventory, AppObservation, AppWorkload, InvariantId, Inventory, MemberStatus, Observation};

use super::data::is_ready;
use super::drain::cordoned_by;
use super::partition::{group_policy_pick, has_labels};
use super::pods::failed_by;
use super::taint::tainted_by;
use super::{bounded, AppTarget};
use crate::k8s::RUN_LABEL;

impl AppTarget {
    /// What `observe` returns: the workloads' Ready replicas, the probes, the data read-back (for
    /// `app-durability`) and the data workload's history (for `app-linearizability`), the inventory (for `leaks`), members as serving when their pod is Ready.
    pub(super) async fn observation(&self, model: &Model, invariants: &[InvariantId]) -> Observation {
        let mut app = AppObservation {
            workloads: self.workloads().await,
            probes: self.probes().await,
            in_cut_groups: self.in_cut_groups(model).await,
            data: None,
            history: None,
        };
        let judged = [InvariantId::AppDurability, InvariantId::AppLinearizability];
        if let Some(w) = self.writer.as_ref().filter(|_| judged.iter().any(|i| invariants.contains(i))) {
            // One read serves both: its answer for app-durability, its place in the history
            // (taken after it) for app-linearizability.
            app.data = Some(w.read().await);
            if invariants.contains(&InvariantId::AppLinearizability) {
                app.history = Some(w.history_view());
            }
        }
        let inventory = if invariants.contains(&InvariantId::Leaks) { Some(Inventory::App(self.inventory().await)) } else { None };
        // A replica serves when its pod is Ready (what the engine asks of healed members).
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed =
            bounded("pods", pods.list(&ListParams::default().labels(&self.sts_selector))).await.map(|l| l.items).unwrap_or_default();
        let members = model
            .members
            .keys()
            .map(|&m| {
                let name = self.pod_name(m);
                let pod = listed.iter().find(|p| p.metadata.name.as_deref() == Some(name.as_str()));
                MemberStatus {
                    reachable: pod.is_some_and(is_ready),
                    error: if pod.is_some() { None } else { Some(format!("no pod {name}")) },
                    ..MemberStatus::without_status(m.to_string(), Some(m))
                }
            })
            .collect();
        Observation { members, app: Some(app), inventory, quorum_throughout: true, ..Default::default() }
    }

    /// The pods of the app's namespace a `pod-failure` of this run left failed.
    async fn failed_pods(&self) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed = bounded("pods", pods.list(&ListParams::default())).await.map(|l| l.items).unwrap_or_default();
        listed.into_iter().filter(|p| failed_by(p) == Some(self.run_id.as_str())).collect()
    }

    /// How many of the StatefulSet's live pods are in the groups of the group partition in
    /// place (`app-ready` excuses them).
    async fn in_cut_groups(&self, model: &Model) -> i32 {
        let Some(Ok((_, a, b))) = model.groups_partitioned.map(|pick| self.group_cut(pick)) else { return 0 };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed =
            bounded("pods", pods.list(&ListParams::default().labels(&self.sts_selector))).await.map(|l| l.items).unwrap_or_default();
        listed.iter().filter(|p| has_labels(p, &a) || has_labels(p, &b)).count() as i32
    }

    async fn inventory(&self) -> AppInventory {
        let mut inv = AppInventory::default();
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        if let Ok(list) = bounded("NetworkPolicies", api.list(&ListParams::default().labels(&format!("{RUN_LABEL}={}", self.run_id)))).await
        {
            for p in list.items {
                let name = p.metadata.name.unwrap_or_default();
                if let Some(i) = name.strip_prefix("shakedown-partition-m").and_then(|n| n.parse::<u32>().ok()) {
                    inv.partitioned.insert(MemberId(i));
                } else if let Some(pick) = group_policy_pick(&name) {
                    inv.groups_partitioned = Some(pick);
                } else {
                    inv.stray_policies.push(name);
                }
            }
        }
        (inv.cordoned, inv.tainted) = self.cordoned_and_tainted_nodes().await;
        inv.failed_pods = self.failed_pods().await.into_iter().filter_map(|p| p.metadata.name).collect();
        if let (Some(name), Some(replicas)) = (&self.spec.app_profile.operator, self.operator_replicas) {
            let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
            if let Ok(d) = bounded("operator", deps.get(name)).await {
                let now = d.spec.and_then(|s| s.replicas).unwrap_or(1);
                if now < replicas {
                    inv.operator_scaled_down = Some(format!("the operator {name} is scaled to {now}, not its {replicas}"));
                }
            }
        }
        inv
    }

    /// The nodes this run cordoned that are still cordoned, and those that carry its taint.
    async fn cordoned_and_tainted_nodes(&self) -> (Vec<String>, Vec<String>) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let list = bounded("nodes", nodes.list(&ListParams::default())).await.map(|l| l.items).unwrap_or_default();
        let run = Some(self.run_id.as_str());
        let named = |keep: &dyn Fn(&Node) -> bool| list.iter().filter(|n| keep(n)).filter_map(|n| n.metadata.name.clone()).collect();
        let cordoned = named(&|n| cordoned_by(n) == run && n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true));
        (cordoned, named(&|n| tainted_by(n) == run))
    }

    async fn workloads(&self) -> Vec<AppWorkload> {
        let p = &self.spec.app_profile;
        let mut out = vec![];
        let sts: Api<StatefulSet> = Api::namespaced(self.client.clone(), self.ns());
        match bounded("statefulset", sts.get(&p.statefulset)).await {
            Ok(s) => out.push(AppWorkload {
                name: format!("statefulset/{}", p.statefulset),
                desired: s.spec.and_then(|s| s.replicas).unwrap_or(1),
                ready: s.status.and_then(|s| s.ready_replicas).unwrap_or(0),
            }),
            Err(_) => out.push(AppWorkload { name: format!("statefulset/{} (unreadable)", p.statefulset), desired: 1, ready: 0 }),
        }
        if let Some(name) = &p.operator {
            let deps: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
            match bounded("operator", deps.get(name)).await {
                Ok(d) => out.push(AppWorkload {
                    name: format!("deployment/{name}"),
                    desired: d.spec.and_then(|s| s.replicas).unwrap_or(1),
                    ready: d.status.and_then(|s| s.available_replicas).unwrap_or(0),
                }),
                Err(_) => out.push(AppWorkload { name: format!("deployment/{name} (unreadable)"), desired: 1, ready: 0 }),
            }
        }
        out
    }
}

/// The forensics of a failed run that live in the cluster: for every pod of `ns`, the last
/// lines of each container's log (`pod-<pod>-<container>.log.tail`, and `….previous.log.tail`
/// when it restarted), and the namespace's events (`events.txt`). Each request is bounded; what
/// cannot be read is said in the file instead.
pub(super) async fn forensics(client: &kube::Client, ns: &str) -> Vec<(String, String)> {
    use k8s_openapi::api::core::v1::{Event, Pod};
    use kube::api::{ListParams, LogParams};
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), ns);
    let mut out = Vec::new();
    let listed = match super::bounded("list pods", pods.list(&ListParams::default())).await {
        Ok(l) => l.items,
        Err(e) => return vec![("pods.txt".into(), format!("cannot list the pods of {ns}: {e}\n"))],
    };
    for pod in listed {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
        for c in statuses {
            let instances: &[bool] = if c.restart_count > 0 { &[false, true] } else { &[false] };
            for &previous in instances {
                let params = LogParams {
                    container: Some(c.name.clone()),
                    previous,
                    tail_lines: Some(crate::targets::FORENSIC_LOG_LINES as i64),
                    ..LogParams::default()
                };
                let text = match super::bounded("pod log", pods.logs(&name, &params)).await {
                    Ok(t) => t,
                    Err(e) => format!("cannot read the log: {e}\n"),
                };
                let file = format!("pod-{name}-{}{}.log.tail", c.name, if previous { ".previous" } else { "" });
                out.push((file, text));
            }
        }
    }
    let events: kube::Api<Event> = kube::Api::namespaced(client.clone(), ns);
    let text = match super::bounded("list events", events.list(&ListParams::default())).await {
        Ok(l) => {
            let mut items = l.items;
            items.sort_by_key(|e| e.last_timestamp.as_ref().map(|t| t.0).or(e.event_time.as_ref().map(|t| t.0)));
            items
                .iter()
                .map(|e| {
                    let when = e.last_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
                    let what = e.involved_object.name.clone().unwrap_or_default();
                    format!(
                        "{when} {} {what} {}: {}\n",
                        e.type_.clone().unwrap_or_default(),
                        e.reason.clone().unwrap_or_default(),
                        e.message.clone().unwrap_or_default()
                    )
                })
                .collect()
        }
        Err(e) => format!("cannot list the events of {ns}: {e}\n"),
    };
    out.push(("events.txt".into(), text));
    out
}
