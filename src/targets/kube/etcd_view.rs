//! The kube target's view of the workload cluster's etcd (`[etcd]`): the Secret with the etcd CA
//! read once at connect, one read-only [`MemberReader`] per control-plane Node, and the
//! observation built from etcd's own answers — each member's status (reachable, leader, term,
//! revision, indexes), the member list, and for `consistency` a second status until a quiet
//! point and HashKV at a revision every reachable member has reached — as on the local target.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::Client;
use shakedown_faults::MemberId;
use shakedown_invariants::{Leader, ListedMember, MemberStatus, Observation};

use super::cache::CpMachine;
use super::etcd::{EtcdTls, MemberReader, Status};
use super::profile::EtcdSpec;
use super::KubeError;
use crate::targets::local::observe::{fill_consistency, settle_with};

/// The kubeadm name of a Node's etcd static pod.
pub fn pod_of(node: &str) -> String {
    format!("etcd-{node}")
}

pub(super) struct EtcdView {
    tls: EtcdTls,
    workload: Client,
    spec: EtcdSpec,
    /// `namespace/name` of the CA Secret (for the notes).
    pub(super) secret: String,
    /// One reader per Node, kept across steps (its connection too).
    readers: BTreeMap<String, MemberReader>,
    /// etcd member name (kubeadm: the Node's name) → the plan member its Machine stood for,
    /// kept after the Machine is gone: a member whose Machine was deleted while Cluster API's
    /// controller was paused is still in etcd's list, under its old name.
    names: BTreeMap<String, MemberId>,
}

impl EtcdView {
    /// Reads the etcd CA Secret (`[etcd] secret`, else `<cluster>-etcd`) from the management
    /// cluster and makes the run's client certificate. A Secret that is not there, or holds no
    /// usable CA, is bad input (the profile asked for etcd); a forbidden read is the
    /// environment's (the RBAC of ci/k8s/rbac.yaml grants it).
    pub(super) async fn open(
        mgmt: &Client,
        workload: Option<Client>,
        ns: &str,
        cluster: &str,
        spec: &EtcdSpec,
        run_id: &str,
    ) -> Result<EtcdView, KubeError> {
        let name = spec.secret.clone().unwrap_or_else(|| format!("{cluster}-etcd"));
        let secret = format!("{ns}/{name}");
        let Some(workload) = workload else {
            return Err(KubeError::Environment(format!(
                "kube profile [etcd]: the workload cluster is not reachable (see the note on its kubeconfig Secret {ns}/{cluster}-kubeconfig): etcd is reached through its apiserver"
            )));
        };
        let got = tokio::time::timeout(spec.timeout, Api::<Secret>::namespaced(mgmt.clone(), ns).get(&name)).await;
        let s = match got {
            Ok(Ok(s)) => s,
            Ok(Err(kube::Error::Api(r))) if r.code == 404 => {
                return Err(KubeError::Usage(format!(
                    "kube profile [etcd]: no Secret {secret}, where Cluster API keeps the workload cluster's etcd CA (set [etcd] secret if yours is elsewhere)"
                )))
            }
            Ok(Err(kube::Error::Api(r))) if r.code == 403 => {
                return Err(KubeError::Environment(format!(
                    "kube profile [etcd]: reading Secret {secret} is forbidden ({}): ci/k8s/rbac.yaml grants `get` on it by name",
                    r.message
                )))
            }
            Ok(Err(e)) => return Err(KubeError::Environment(format!("kube profile [etcd]: cannot read Secret {secret}: {e}"))),
            Err(_) => {
                return Err(KubeError::Environment(format!(
                    "kube profile [etcd]: reading Secret {secret} got no answer within {}s",
                    spec.timeout.as_secs()
                )))
            }
        };
        let data = s.data.unwrap_or_default();
        let field = |k: &str| {
            data.get(k).map(|b| b.0.clone()).ok_or_else(|| KubeError::Usage(format!("kube profile [etcd]: Secret {secret} has no key {k}")))
        };
        let tls = EtcdTls::from_ca(&field("tls.crt")?, &field("tls.key")?, run_id)
            .map_err(|e| KubeError::Usage(format!("kube profile [etcd]: Secret {secret}: {e}")))?;
        Ok(EtcdView { tls, workload, spec: spec.clone(), secret, readers: BTreeMap::new(), names: BTreeMap::new() })
    }

    fn reader(&mut self, node: &str) -> MemberReader {
        let (w, spec, tls) = (&self.workload, &self.spec, &self.tls);
        self.readers
            .entry(node.to_string())
            .or_insert_with(|| MemberReader::new(w.clone(), &spec.namespace, &pod_of(node), spec.port, tls, spec.timeout))
            .clone()
    }

    /// The etcd releases the members of `machines` answer with (`3.5.16`, or `3.4.23, 3.5.16`
    /// mid-upgrade), read once at connect for the run's versions; `None` when none answered
    /// (the first check says why).
    pub(super) async fn versions(&mut self, machines: &[CpMachine]) -> Option<String> {
        let readers: Vec<MemberReader> =
            machines.iter().filter(|m| !m.deleting).filter_map(|m| m.node.clone()).map(|n| self.reader(&n)).collect();
        let answers = futures::future::join_all(readers.iter().map(MemberReader::status)).await;
        let seen: std::collections::BTreeSet<String> = answers.into_iter().flatten().map(|s| s.version).collect();
        (!seen.is_empty()).then(|| seen.into_iter().collect::<Vec<_>>().join(", "))
    }

    /// Fills `obs.members` and `obs.member_list` from etcd (and, with `consistency`, each
    /// member's quiet point and hash). `machines`: the control-plane Machines; `bound`: which
    /// plan member each stands for.
    pub(super) async fn observe(
        &mut self,
        obs: &mut Observation,
        machines: &[CpMachine],
        bound: &BTreeMap<&String, MemberId>,
        consistency: bool,
    ) {
        for m in machines {
            if let (Some(node), Some(id)) = (&m.node, bound.get(&m.name)) {
                self.names.insert(node.clone(), *id);
            }
        }
        let live: Vec<&CpMachine> = machines.iter().filter(|m| !m.deleting).collect();
        let display = |m: &CpMachine| bound.get(&m.name).map(|id| id.to_string()).unwrap_or_else(|| m.name.clone());
        let mut asked = Vec::new();
        for m in &live {
            match &m.node {
                Some(node) => asked.push((display(m), bound.get(&m.name).copied(), self.reader(node))),
                None => obs.members.push(MemberStatus {
                    error: Some(format!("Machine {} has no Node yet (status.nodeRef): no etcd pod to read", m.name)),
                    ..MemberStatus::without_status(display(m), bound.get(&m.name).copied())
                }),
            }
        }
        let statuses = futures::future::join_all(asked.iter().map(|(_, _, r)| r.status())).await;
        let mut answered: Vec<(String, MemberReader, Status)> = Vec::new();
        for ((name, member, reader), res) in asked.into_iter().zip(statuses) {
            obs.members.push(match res {
                Ok(s) => {
                    answered.push((name.clone(), reader.clone(), s.clone()));
                    MemberStatus {
                        name,
                        member,
                        reachable: true,
                        leader: (s.leader != 0).then_some(Leader::Id(s.leader)),
                        etcd_id: Some(s.member_id),
                        revision: s.revision,
                        raft_index: s.raft_index,
                        applied_index: s.applied_index,
                        raft_term: Some(s.raft_term),
                        revision_after: None,
                        settled: None,
                        version: Some(s.version.clone()),
                        hash: None,
                        hash_from: 0,
                        error: (!s.errors.is_empty()).then(|| format!("etcd reports: {}", s.errors.join("; "))),
                    }
                }
                Err(e) => MemberStatus { error: Some(e.to_string()), ..MemberStatus::without_status(name, member) },
            });
        }
        // The member list from the leader (else any member that answered).
        let from = answered.iter().find(|(_, _, s)| s.leader != 0 && s.leader == s.member_id).or(answered.first());
        if let Some((_, reader, _)) = from {
            if let Ok(list) = reader.member_list().await {
                let names = &self.names;
                obs.member_list = Some(
                    list.into_iter()
                        .map(|m| ListedMember {
                            id: Some(m.id),
                            name: names.get(&m.name).map(|id| id.to_string()).unwrap_or(m.name),
                            peer_urls: m.peer_urls,
                        })
                        .collect(),
                );
            }
        }
        if !consistency {
            return;
        }
        let lowest = answered.iter().map(|(_, _, s)| s.revision).filter(|r| *r > 0).min();
        let again = answered.iter().map(|(name, reader, s)| async move {
            let status = || async { reader.status().await.ok().map(|s| (s.revision, s.applied_index, s.raft_index)) };
            (name.clone(), settle_with(Some((s.revision, s.applied_index)), status).await)
        });
        let hashes = answered.iter().filter(|_| lowest.is_some()).map(|(name, reader, _)| async move {
            let rev = lowest.unwrap_or(0);
            (name.clone(), reader.hash_kv(rev).await.ok().map(|h| ((rev, h.hash), h.compact_revision)))
        });
        let (again, hashes) = tokio::join!(futures::future::join_all(again), futures::future::join_all(hashes));
        fill_consistency(obs, again, hashes);
    }

    /// What the run is told at the start: where etcd is read from.
    pub(super) fn note(&self) -> String {
        format!(
            "etcd read through Cluster API's path: the CA of Secret {}, each member by a port-forward to {}/etcd-<node>:{} (status, member list, HashKV; read-only)",
            self.secret, self.spec.namespace, self.spec.port
        )
    }
}
