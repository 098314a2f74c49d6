//! What the kube target observes: members from Machine conditions, the leader from KCP, probes
//! and condition checks, and the inventory for `leaks`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use shakedown_faults::{Answers, MemberId, Model};
use shakedown_invariants::{InvariantId, Inventory, KubeInventory, Leader, ListedMember, MemberStatus, Observation, Probe};

use super::conditions::{condition, ETCD_CLUSTER_HEALTHY};
use super::*;

/// Why a condition check of the kube profile fails.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionFailure {
    #[error("the check names neither an object (name) nor a selector")]
    NoTarget,
    #[error("no object matches")]
    NoObject,
    /// Objects whose condition is not the one wanted: `name: what it is` each.
    #[error("{}", objects.join("; "))]
    Wrong { objects: Vec<String> },
}

impl KubeTarget {
    pub(super) fn current_kcp_version(&self) -> Option<String> {
        self.cache.kcp().and_then(|k| k.pointer("/spec/version").and_then(Value::as_str).map(str::to_string))
    }

    pub(super) async fn probes(&self) -> Vec<Probe> {
        let mut out = Vec::new();
        for (p, prober) in self.cfg.profile.probes.iter().zip(&self.probers) {
            let t0 = std::time::Instant::now();
            let res = prober.get(&p.url, p.timeout).await;
            out.push(Probe {
                latency_ms: t0.elapsed().as_millis() as u64,
                error: res.err().map(|e| format!("HTTP probe GET {}: {e}", p.url)),
            });
        }
        for c in &self.cfg.profile.commands {
            let t0 = std::time::Instant::now();
            let res = run_command(&c.command, &self.hook_env(), c.timeout).await;
            out.push(Probe {
                latency_ms: t0.elapsed().as_millis() as u64,
                error: res.error.map(|e| format!("command probe {}: {e}", c.command.join(" "))),
            });
        }
        for (i, c) in self.cfg.profile.conditions.iter().enumerate() {
            let t0 = std::time::Instant::now();
            let res = self.condition_check(i, c);
            out.push(Probe {
                latency_ms: t0.elapsed().as_millis() as u64,
                error: res.err().map(|e| format!("condition check {} {}={}: {e}", c.kind, c.type_, c.status)),
            });
        }
        out
    }

    /// A condition check against its watch cache (no request).
    pub(super) fn condition_check(&self, i: usize, c: &profile::ConditionCheck) -> Result<(), ConditionFailure> {
        if c.name.is_none() && c.selector.is_none() {
            return Err(ConditionFailure::NoTarget);
        }
        let objs = self.cache.conditions.get(i).map(|w| w.objects()).unwrap_or_default();
        if objs.is_empty() {
            return Err(ConditionFailure::NoObject);
        }
        let mut wrong = Vec::new();
        for o in objs {
            let v = serde_json::to_value(o.as_ref()).unwrap_or_default();
            let name = o.metadata.name.clone().unwrap_or_default();
            match condition(&v, &[c.type_.as_str()]) {
                Some(cond) if format!("{:?}", cond.status) == c.status => {}
                Some(cond) => wrong.push(format!("{name}: {}", cond.text())),
                None => wrong.push(format!("{name}: no {} condition", c.type_)),
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(ConditionFailure::Wrong { objects: wrong })
        }
    }

    pub(super) fn inventory(&self) -> KubeInventory {
        let machines = self.cache.machines.objects();
        let cp = cp_machines(&machines);
        let by_machine: BTreeMap<&String, MemberId> = self.bindings.iter().map(|(id, m)| (m, *id)).collect();
        let mut inv = KubeInventory {
            machines: cp.iter().filter(|m| !m.deleting).map(|m| (m.name.clone(), by_machine.get(&m.name).copied())).collect(),
            ..Default::default()
        };
        for d in self.cache.deployments.objects() {
            let name = d.metadata.name.clone().unwrap_or_default();
            let want = d.data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
            let found = machines
                .iter()
                .filter(|m| {
                    m.metadata.deletion_timestamp.is_none()
                        && m.metadata.labels.as_ref().and_then(|l| l.get(DEPLOYMENT_NAME_LABEL)) == Some(&name)
                })
                .count();
            inv.machine_deployments.push((name, want, found));
        }
        let referenced: BTreeSet<(String, String)> = machines
            .iter()
            .filter_map(|m| {
                let r = m.data.pointer("/spec/infrastructureRef")?;
                Some((r.get("kind")?.as_str()?.to_string(), r.get("name")?.as_str()?.to_string()))
            })
            .collect();
        let now = std::time::SystemTime::now();
        for w in self.cache.all() {
            for o in w.objects() {
                let name = o.metadata.name.clone().unwrap_or_default();
                if let Some(ts) = &o.metadata.deletion_timestamp {
                    let since: std::time::SystemTime = ts.0.into();
                    inv.deleting.insert(format!("{}/{name}", w.kind), now.duration_since(since).map(|d| d.as_secs()).unwrap_or(0));
                }
            }
        }
        for w in &self.cache.infra {
            for o in w.objects() {
                let name = o.metadata.name.clone().unwrap_or_default();
                if o.metadata.deletion_timestamp.is_none() && !referenced.contains(&(w.kind.clone(), name.clone())) {
                    inv.orphan_infra_machines.push(format!("{}/{name}", w.kind));
                }
            }
        }
        if let Some(w) = &self.cache.workload {
            inv.orphan_nodes = w.orphan_nodes(&machines);
            inv.released_volumes = w.released_volumes();
            inv.orphan_volume_attachments = w.orphan_attachments();
        }
        inv
    }

    pub(super) fn observe_members(&self, obs: &mut Observation) {
        let ms = cp_machines(&self.cache.machines.objects());
        let kcp = self.cache.kcp();
        // The etcd cluster's health as KCP reports it: without it, nobody is known to see a leader.
        let cluster_cond = kcp.as_ref().and_then(|k| condition(k, ETCD_CLUSTER_HEALTHY));
        let by_machine: BTreeMap<&String, MemberId> = self.bindings.iter().map(|(id, m)| (m, *id)).collect();
        for m in &ms {
            let member = by_machine.get(&m.name).copied();
            obs.members.push(MemberStatus {
                reachable: m.healthy && !m.deleting,
                leader: (m.healthy && !m.deleting && cluster_cond.is_some()).then_some(Leader::Unnamed),
                version: m.version.clone(),
                error: (!m.healthy || m.deleting || cluster_cond.is_none()).then(|| {
                    let mut why = format!("Machine {}: {}", m.name, m.why);
                    if m.deleting {
                        why.push_str(", being deleted");
                    }
                    if cluster_cond.is_none() {
                        why.push_str("; KubeadmControlPlane reports no EtcdClusterHealthy condition");
                    }
                    why
                }),
                ..MemberStatus::without_status(member.map(|id| id.to_string()).unwrap_or_else(|| m.name.clone()), member)
            });
        }
        if kcp.is_some() {
            let mut list: Vec<ListedMember> = ms
                .iter()
                .filter(|m| !m.deleting)
                .map(|m| ListedMember {
                    id: None,
                    name: by_machine.get(&m.name).map(|id| id.to_string()).unwrap_or_else(|| m.name.clone()),
                    peer_urls: vec![format!("machine/{} ({})", m.name, m.fd.clone().unwrap_or_default())],
                })
                .collect();
            // Only KubeadmControlPlane removes the etcd member of a deleted Machine (its
            // pre-terminate hook); while this run keeps it paused, the members whose Machines
            // were deleted to crash them are still etcd members.
            if self.paused {
                for m in
                    self.model.members.values().filter(|m| self.model.has_process(m) == Answers::No && !self.bindings.contains_key(&m.id))
                {
                    list.push(ListedMember {
                        id: None,
                        name: m.id.to_string(),
                        peer_urls: vec!["machine deleted, KubeadmControlPlane paused".into()],
                    });
                }
            }
            obs.member_list = Some(list);
        }
    }

    pub(super) async fn observation(&mut self, model: &Model, invariants: &[InvariantId]) -> Observation {
        self.model = model.clone();
        self.rebind();
        let mut obs = Observation::default();
        match &mut self.etcd {
            // etcd's own answers, through Cluster API's path.
            Ok(view) => {
                let ms = cp_machines(&self.cache.machines.objects());
                let bound: BTreeMap<&String, MemberId> = self.bindings.iter().map(|(id, m)| (m, *id)).collect();
                view.observe(&mut obs, &ms, &bound, invariants.contains(&InvariantId::Consistency)).await;
            }
            Err(_) => self.observe_members(&mut obs),
        }
        obs.probes = self.probes().await;
        {
            let s = self.sampler.lock().unwrap_or_else(|e| e.into_inner());
            obs.serving_samples = s.samples.clone();
            obs.samples_until_ms = s.start.map(|t| t.elapsed().as_millis() as u64).unwrap_or(0);
        }
        obs.inventory = Some(Inventory::Kube(self.inventory()));
        obs
    }
}
