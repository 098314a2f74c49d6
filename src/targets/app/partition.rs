//! `partition` / `partition-heal` (a NetworkPolicy cutting one replica off) and
//! `partition-groups` / `partition-groups-heal` (two label groups of `[[partition.groups]]` cut
//! apart), each verified with the `[partition]` probe — which must connect before any policy is
//! made, or a cut would show nothing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use shakedown_faults::MemberId;

use super::data::{is_ready, ready_pod};
use super::spec::{fill, GroupCut};
use super::{bounded, env, AppTarget, Labels, PARTITION_SETTLE};
use crate::k8s::exec::{exec, ExecOutput};
use crate::k8s::RUN_LABEL;
use crate::targets::TargetError;

/// The label the apiserver gives every namespace, its name (Kubernetes 1.21 and later).
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn group_policy_name(pick: u32, side: char) -> String {
    format!("shakedown-partition-groups-p{pick}-{side}")
}

/// The pick of a group partition's policy, from its name.
pub(super) fn group_policy_pick(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("shakedown-partition-groups-p")?;
    let (pick, side) = rest.split_once('-')?;
    matches!(side, "a" | "b").then_some(())?;
    pick.parse().ok()
}

/// Whether pod `p` has every label of `labels`.
pub(super) fn has_labels(p: &Pod, labels: &Labels) -> bool {
    let own = p.metadata.labels.as_ref();
    labels.iter().all(|(k, v)| own.and_then(|l| l.get(k)) == Some(v))
}

/// The NetworkPolicy of one side of a group partition: it selects the side's pods (`own`) and
/// admits ingress from every pod of the namespace that lacks one of the other side's labels
/// (`NotIn` holds for a missing label too), and from every pod of the other namespaces when
/// they carry their name label (`other_namespaces_than`: the app's namespace). Ingress only:
/// with both sides' policies, a connection between them is refused whichever side opens it,
/// and each side's own egress is left alone.
fn group_policy(name: &str, run_id: &str, own: &Labels, other: &Labels, other_namespaces_than: Option<&str>) -> serde_json::Value {
    let mut from: Vec<serde_json::Value> = other
        .iter()
        .map(|(k, v)| serde_json::json!({"podSelector": {"matchExpressions": [{"key": k, "operator": "NotIn", "values": [v]}]}}))
        .collect();
    if let Some(ns) = other_namespaces_than {
        let others = serde_json::json!({"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": [ns]});
        from.push(serde_json::json!({"namespaceSelector": {"matchExpressions": [others]}}));
    }
    serde_json::json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: run_id, "app.kubernetes.io/managed-by": "shakedown"}},
        "spec": {"podSelector": {"matchLabels": own}, "policyTypes": ["Ingress"], "ingress": [{"from": from}]},
    })
}

impl AppTarget {
    fn policy_name(&self, m: MemberId) -> String {
        format!("shakedown-partition-{m}")
    }

    /// Where the partition probe of `m` runs (another Ready replica) and `m`'s pod IP.
    async fn probe_ends(&self, m: MemberId) -> Result<(String, String), TargetError> {
        let target = self.pod_name(m);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let ip = bounded("get pod", pods.get(&target))
            .await
            .map_err(env)?
            .status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| TargetError::Stack(format!("pod {target} has no IP")))?;
        let selector = format!("{},statefulset.kubernetes.io/pod-name!={target}", self.sts_selector);
        let Some(from) = ready_pod(&self.client, self.ns(), &selector, Some(&target)).await else {
            return Err(TargetError::Stack(format!("no other Ready replica to probe {target} from")));
        };
        Ok((from.metadata.name.unwrap_or_default(), ip))
    }

    /// The partition probe from another Ready replica to `m`'s pod: `Ok(true)` connected.
    async fn probe_to(&self, m: MemberId) -> Result<bool, TargetError> {
        let (from, ip) = self.probe_ends(m).await?;
        self.probe_between(&from, &ip).await
    }

    /// The partition probe exec'd in pod `from` towards `ip`.
    async fn probe_exec(&self, from: &str, ip: &str) -> Result<ExecOutput, TargetError> {
        let Some(probe) = self.spec.app_profile.partition.clone() else {
            return Err(TargetError::Unsupported("the app profile has no [partition] probe".into()));
        };
        let cmd = fill(&probe.command, &BTreeMap::from([("ip", ip.to_string())]));
        let refs: Vec<&str> = cmd.iter().map(String::as_str).collect();
        exec(&self.client, self.ns(), from, probe.container.as_deref(), &refs, Duration::from_secs(15)).await.map_err(env)
    }

    /// The partition probe exec'd in pod `from` towards `ip`: `Ok(true)` connected.
    async fn probe_between(&self, from: &str, ip: &str) -> Result<bool, TargetError> {
        Ok(self.probe_exec(from, ip).await?.code == 0)
    }

    /// With `--dry-run`: the `[partition]` probe the op would exec in pod `from` towards `to`
    /// (at `ip`) and what it waits for it to show, printed instead of exec'd.
    fn dry_probe(&self, from: &str, to: &str, ip: &str, shows: &str) {
        let cmd = self.spec.app_profile.partition.as_ref().map(|p| fill(&p.command, &BTreeMap::from([("ip", ip.to_string())])));
        self.dry_wait(&format!("the [partition] probe {:?} exec'd in {from} {shows} to {to} ({ip})", cmd.unwrap_or_default()));
    }

    /// Before a partition, with no policy of it in place: the probe must connect from `from` to
    /// `to` (at `ip`), or its failing afterwards would show nothing — a probe that never
    /// connects (a wrong port, a command the pod lacks) would pass every cut. Tried for up to
    /// [`PARTITION_SETTLE`]; then an environment error naming the probe's answer.
    async fn probe_baseline(&self, from: &str, to: &str, ip: &str) -> Result<(), TargetError> {
        let deadline = Instant::now() + PARTITION_SETTLE;
        loop {
            let out = self.probe_exec(from, ip).await?;
            if out.code == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let said: String = format!("{} {}", out.stderr.trim(), out.stdout.trim()).trim().chars().take(300).collect();
                return Err(TargetError::Environment(format!(
                    "the [partition] probe does not connect from {from} to {to} ({ip}) before any policy is made (exit {}{}): a probe that \
                    never connects cannot show a cut, so the partition would verify nothing; fix the probe (its command, its port, a \
                    container that has the command); no policy was created",
                    out.code,
                    if said.is_empty() { String::new() } else { format!(": {said}") }
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub(super) async fn partition(&mut self, m: MemberId) -> Result<(), TargetError> {
        if self.spec.app_profile.partition.is_none() {
            return Err(TargetError::Unsupported("the app profile has no [partition] probe".into()));
        }
        let target = self.pod_name(m);
        let name = self.policy_name(m);
        // A pod on the host's network has the node's address: no network plugin applies a
        // NetworkPolicy to it, so such a partition could only pass silently or fail.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pod = bounded("get pod", pods.get(&target)).await.map_err(env)?;
        if pod.spec.as_ref().and_then(|s| s.host_network) == Some(true) {
            return Err(TargetError::Environment(format!(
                "{target} runs on the host's network (hostNetwork: true): a NetworkPolicy cannot cut it off on any network plugin, so \
                partition cannot be done to this application; no policy was created"
            )));
        }
        let (from, ip) = self.probe_ends(m).await?;
        let body = serde_json::json!({
            "metadata": {"name": name, "labels": {RUN_LABEL: self.run_id}},
            "spec": {"podSelector": {"matchLabels": {"statefulset.kubernetes.io/pod-name": target}}, "policyTypes": ["Ingress", "Egress"]},
        });
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        if self.dry_run {
            self.dry_probe(&from, &target, &ip, "connects (before any policy is made)");
            self.dry_write(|| format!("POST {} {body}", api.resource_url()));
            self.dry_probe(&from, &target, &ip, "no longer connects");
            return Ok(());
        }
        self.probe_baseline(&from, &target, &ip).await?;
        let policy: NetworkPolicy = serde_json::from_value(body).map_err(env)?;
        bounded("create NetworkPolicy", api.create(&PostParams::default(), &policy)).await.map_err(env)?;
        // Verified: the probe no longer connects (policies may apply after a moment).
        let t0 = Instant::now();
        let deadline = t0 + PARTITION_SETTLE;
        loop {
            match self.probe_to(m).await {
                Ok(false) => {
                    tracing::info!(
                        "partition({m}): {target} cut off by NetworkPolicy {name}: the partition probe no longer connects to it ({:.1}s \
                        after the policy was created)",
                        t0.elapsed().as_secs_f64()
                    );
                    return Ok(());
                }
                Ok(true) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
                Ok(true) => {
                    let _ = bounded("delete NetworkPolicy", api.delete(&name, &DeleteParams::default())).await;
                    return Err(TargetError::Environment(format!(
                        "this cluster does not enforce NetworkPolicy: {}s after NetworkPolicy {name} cut {target} off, the partition probe \
                        still connects to it (a CNI without a policy engine, such as the bridge plugin, ignores policies); the policy was \
                        removed and the partition counts as not done",
                        PARTITION_SETTLE.as_secs()
                    )));
                }
                Err(e) => {
                    let _ = bounded("delete NetworkPolicy", api.delete(&name, &DeleteParams::default())).await;
                    return Err(e);
                }
            }
        }
    }

    pub(super) async fn partition_heal(&mut self, m: MemberId) -> Result<(), TargetError> {
        let name = self.policy_name(m);
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        if self.dry_write(|| format!("DELETE {}/{name}", api.resource_url())) {
            let (from, ip) = self.probe_ends(m).await?;
            self.dry_probe(&from, &self.pod_name(m), &ip, "connects again");
            return Ok(());
        }
        match bounded("delete NetworkPolicy", api.delete(&name, &DeleteParams::default())).await {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(env(e)),
        }
        // Verified: traffic flows again.
        let deadline = Instant::now() + self.spec.app_profile.op_timeout;
        loop {
            if self.probe_to(m).await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(TargetError::Stack(format!(
                    "the partition probe does not connect to {} after its NetworkPolicy was removed",
                    self.pod_name(m)
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Cut `pick` of `[[partition.groups]]` (modulo their number) and each side's labels.
    pub(super) fn group_cut(&self, pick: u32) -> Result<(GroupCut, Labels, Labels), TargetError> {
        let cuts = self.spec.app_profile.partition.as_ref().map(|p| p.groups.as_slice()).unwrap_or_default();
        if cuts.is_empty() {
            return Err(TargetError::Unsupported("the app profile has no [[partition.groups]]".into()));
        }
        let cut = cuts[pick as usize % cuts.len()].clone();
        let (a, b) = (GroupCut::labels(&cut.a).map_err(env)?, GroupCut::labels(&cut.b).map_err(env)?);
        Ok((cut, a, b))
    }

    /// The first Ready pod of `selector`: its name and IP.
    async fn group_end(&self, selector: &str) -> Result<(String, String), TargetError> {
        let pod = ready_pod(&self.client, self.ns(), selector, None)
            .await
            .ok_or_else(|| TargetError::Stack(format!("no Ready pod matches {selector}")))?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ip = pod.status.and_then(|s| s.pod_ip).ok_or_else(|| TargetError::Stack(format!("pod {name} has no IP")))?;
        Ok((name, ip))
    }

    /// Whether the probe connects from group `a` to group `b` and from `b` to `a` (a Ready pod
    /// of each: the first by name; both ways at once, a cut way costing the probe's own timeout).
    async fn probe_groups(&self, cut: &GroupCut) -> Result<(bool, bool), TargetError> {
        let (a, b) = (self.group_end(&cut.a).await?, self.group_end(&cut.b).await?);
        let (ab, ba) = tokio::join!(self.probe_between(&a.0, &b.1), self.probe_between(&b.0, &a.1));
        Ok((ab?, ba?))
    }

    async fn delete_group_policies(&self, pick: u32) -> Result<(), TargetError> {
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        if self.dry_run {
            for side in ['a', 'b'] {
                self.dry_write(|| format!("DELETE {}/{}", api.resource_url(), group_policy_name(pick, side)));
            }
            return Ok(());
        }
        for side in ['a', 'b'] {
            match bounded("delete NetworkPolicy", api.delete(&group_policy_name(pick, side), &DeleteParams::default())).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(env(e)),
            }
        }
        Ok(())
    }

    /// The live pods of the namespace and the names of those in each group of `cut`, refusing a
    /// group with no pod, a pod in both, and a group pod on the host's network.
    async fn group_pods(&self, cut: &GroupCut, a: &Labels, b: &Labels) -> Result<(Vec<Pod>, Vec<String>, Vec<String>), TargetError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed = bounded("pods", pods.list(&ListParams::default())).await.map_err(env)?.items;
        let live: Vec<Pod> = listed.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        let (in_a, in_b): (Vec<&Pod>, Vec<&Pod>) =
            (live.iter().filter(|p| has_labels(p, a)).collect(), live.iter().filter(|p| has_labels(p, b)).collect());
        for (side, members) in [(&cut.a, &in_a), (&cut.b, &in_b)] {
            if members.is_empty() {
                return Err(TargetError::Stack(format!("no pod of {} matches {side}", self.ns())));
            }
        }
        if let Some(p) = in_a.iter().find(|p| has_labels(p, b)) {
            return Err(TargetError::Environment(format!(
                "pod {} is in both groups ({} and {}): a pod cannot be cut off from itself; no policy was created",
                name(p),
                cut.a,
                cut.b
            )));
        }
        if let Some(p) = in_a.iter().chain(&in_b).find(|p| p.spec.as_ref().and_then(|s| s.host_network) == Some(true)) {
            return Err(TargetError::Environment(format!(
                "{} runs on the host's network (hostNetwork: true): a NetworkPolicy cannot cut it off on any network plugin, so \
                partition-groups cannot be done to these groups; no policy was created",
                name(p)
            )));
        }
        let (a_pods, b_pods) = (in_a.iter().map(|p| name(p)).collect(), in_b.iter().map(|p| name(p)).collect());
        Ok((live, a_pods, b_pods))
    }

    /// Verified: `cut`'s groups no longer reach each other either way (policies may apply
    /// after a moment, up to [`PARTITION_SETTLE`]); how long that took.
    async fn verify_groups_cut(&self, pick: u32, cut: &GroupCut) -> Result<Duration, TargetError> {
        let t0 = Instant::now();
        loop {
            match self.probe_groups(cut).await? {
                (false, false) => return Ok(t0.elapsed()),
                (ab, ba) if Instant::now() >= t0 + PARTITION_SETTLE => {
                    let ways = [(ab, format!("from {} to {}", cut.a, cut.b)), (ba, format!("from {} to {}", cut.b, cut.a))]
                        .into_iter()
                        .filter(|(c, _)| *c)
                        .map(|(_, w)| w)
                        .collect::<Vec<_>>()
                        .join(" and ");
                    return Err(TargetError::Environment(format!(
                        "this cluster does not enforce NetworkPolicy: {}s after the policies of partition-groups(pick {pick}) were \
                        created, the partition probe still connects {ways} (a CNI without a policy engine, such as the bridge plugin, \
                        ignores policies); the policies were removed and the partition counts as not done",
                        PARTITION_SETTLE.as_secs()
                    )));
                }
                _ => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }

    /// Verified: other traffic flows on — replica `outside`, in neither group, still reaches a
    /// Ready pod of each (up to [`PARTITION_SETTLE`] each).
    async fn verify_outside_flows(&self, pick: u32, cut: &GroupCut, outside: &str) -> Result<(), TargetError> {
        let ends = [self.group_end(&cut.a).await?, self.group_end(&cut.b).await?];
        for (end, ip) in &ends {
            let deadline = Instant::now() + PARTITION_SETTLE;
            while !self.probe_between(outside, ip).await? {
                if Instant::now() >= deadline {
                    return Err(TargetError::Environment(format!(
                        "partition-groups(pick {pick}) cut more than the two groups: {outside}, in neither, no longer reaches {end} (the \
                        policies admit it; the network plugin does not); the policies were removed"
                    )));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Ok(())
    }

    /// `partition-groups(pick)`: the pods of the cut's two groups no longer reach each other,
    /// other traffic flows on. A NetworkPolicy on each side admits every peer but the other
    /// side; verified with the `[partition]` probe both ways between the groups (cut) and from
    /// a StatefulSet replica outside both to each (still flowing), when there is one. The
    /// policies are removed when the verification fails.
    pub(super) async fn partition_groups(&mut self, pick: u32) -> Result<(), TargetError> {
        let (cut, a, b) = self.group_cut(pick)?;
        let (live, a_pods, b_pods) = self.group_pods(&cut, &a, &b).await?;
        // Pods of other namespaces are admitted by the namespace's name label, which the
        // apiserver sets from Kubernetes 1.21; without it they are cut off from both groups too.
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let named = bounded("namespace", nss.get(self.ns()))
            .await
            .map_err(env)?
            .metadata
            .labels
            .is_some_and(|l| l.contains_key(NAMESPACE_NAME_LABEL));
        let other_namespaces = named.then(|| self.ns().to_string());
        let (a_end, b_end) = (self.group_end(&cut.a).await?, self.group_end(&cut.b).await?);
        let api: Api<NetworkPolicy> = Api::namespaced(self.client.clone(), self.ns());
        if self.dry_run {
            self.dry_probe(&a_end.0, &b_end.0, &b_end.1, "connects (before any policy is made)");
            self.dry_probe(&b_end.0, &a_end.0, &a_end.1, "connects (before any policy is made)");
            for (side, own, other) in [('a', &a, &b), ('b', &b, &a)] {
                let body = group_policy(&group_policy_name(pick, side), &self.run_id, own, other, other_namespaces.as_deref());
                self.dry_write(|| format!("POST {} {body}", api.resource_url()));
            }
            self.dry_probe(&a_end.0, &b_end.0, &b_end.1, "no longer connects");
            self.dry_probe(&b_end.0, &a_end.0, &a_end.1, "no longer connects");
            return Ok(());
        }
        self.probe_baseline(&a_end.0, &b_end.0, &b_end.1).await?;
        self.probe_baseline(&b_end.0, &a_end.0, &a_end.1).await?;
        for (side, own, other) in [('a', &a, &b), ('b', &b, &a)] {
            let policy: NetworkPolicy =
                serde_json::from_value(group_policy(&group_policy_name(pick, side), &self.run_id, own, other, other_namespaces.as_deref()))
                    .map_err(env)?;
            if let Err(e) = bounded("create NetworkPolicy", api.create(&PostParams::default(), &policy)).await {
                let _ = self.delete_group_policies(pick).await;
                return Err(env(e));
            }
        }
        // A replica in neither group, to show other traffic flowing on.
        let outside = live
            .iter()
            .filter(|p| is_ready(p) && has_labels(p, &self.sts_labels()) && !has_labels(p, &a) && !has_labels(p, &b))
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .min();
        let verified = async {
            let cut_after = self.verify_groups_cut(pick, &cut).await?;
            if let Some(c) = &outside {
                self.verify_outside_flows(pick, &cut, c).await?;
            }
            Ok(cut_after)
        };
        let cut_after = match verified.await {
            Ok(d) => d,
            Err(e) => {
                let _ = self.delete_group_policies(pick).await;
                return Err(e);
            }
        };
        tracing::info!(
            "partition-groups(pick {pick}): {} ({}) cut from {} ({}) {:.1}s after the policies were created; {}{}",
            cut.a,
            a_pods.join(", "),
            cut.b,
            b_pods.join(", "),
            cut_after.as_secs_f64(),
            outside.as_ref().map_or("no replica outside both groups to show other traffic flowing".to_string(), |c| format!(
                "{c}, in neither, still reaches both"
            )),
            if named {
                ""
            } else {
                "; pods of other namespaces are cut off from both groups too (namespaces here carry no kubernetes.io/metadata.name label: \
                Kubernetes before 1.21)"
            }
        );
        self.log.push(crate::targets::Note {
            kind: "app-partition-groups".into(),
            detail: serde_json::json!({
                "pick": pick,
                "a": cut.a,
                "b": cut.b,
                "a-pods": a_pods,
                "b-pods": b_pods,
                "cut-after-ms": cut_after.as_millis() as u64,
                "outside": outside,
                "other-namespaces-admitted": named,
            }),
        });
        Ok(())
    }

    /// `partition-groups-heal(pick)`: the cut's policies removed; verified: the probe connects
    /// both ways again.
    pub(super) async fn partition_groups_heal(&mut self, pick: u32) -> Result<(), TargetError> {
        let (cut, _, _) = self.group_cut(pick)?;
        self.delete_group_policies(pick).await?;
        if self.dry_run {
            self.dry_wait(&format!("the [partition] probe connects both ways between {} and {} again", cut.a, cut.b));
            return Ok(());
        }
        let deadline = Instant::now() + self.spec.app_profile.op_timeout;
        loop {
            if self.probe_groups(&cut).await? == (true, true) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(TargetError::Stack(format!(
                    "the partition probe does not connect both ways between {} and {} after their NetworkPolicies were removed",
                    cut.a, cut.b
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The StatefulSet's selector as labels.
    fn sts_labels(&self) -> Labels {
        self.sts_selector.split(',').filter_map(|t| t.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::netpol::{compute, Peer, PodInfo};

    fn pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            ns: ns.into(),
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ip: ip.parse().unwrap(),
            ports: BTreeMap::new(),
        }
    }

    fn labels(l: &[(&str, &str)]) -> Labels {
        l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The two policies of a group partition, read by the node's policy engine: each side is
    /// isolated for ingress and admits every pod but the other side's — its own, a replica in
    /// neither group, a pod of another namespace (when namespaces carry their name label) — and
    /// no side is isolated for egress.
    #[test]
    fn a_group_partition_admits_everyone_but_the_other_side() {
        let pods = [
            pod("kv", "kv-0", "10.0.0.10", &[("app", "kv"), ("role", "primary")]),
            pod("kv", "kv-1", "10.0.0.11", &[("app", "kv"), ("role", "standby")]),
            pod("kv", "kv-2", "10.0.0.12", &[("app", "kv"), ("role", "standby")]),
            pod("kv", "kv-3", "10.0.0.13", &[("app", "kv")]),
            pod("kv", "client", "10.0.0.14", &[("role", "client")]),
            pod("other", "tool", "10.0.0.20", &[("app", "kv"), ("role", "standby")]),
        ];
        let (a, b) = (labels(&[("app", "kv"), ("role", "primary")]), labels(&[("app", "kv"), ("role", "standby")]));
        let policies = |ns_label: bool| -> Vec<NetworkPolicy> {
            [('a', &a, &b), ('b', &b, &a)]
                .into_iter()
                .map(|(side, own, other)| {
                    let mut v = group_policy(&group_policy_name(4, side), "sd-1", own, other, ns_label.then_some("kv"));
                    v["metadata"]["namespace"] = "kv".into();
                    serde_json::from_value(v).unwrap()
                })
                .collect()
        };
        let nss = |named: bool| -> BTreeMap<String, Labels> {
            ["kv", "other"]
                .iter()
                .map(|n| (n.to_string(), if named { labels(&[(NAMESPACE_NAME_LABEL, n)]) } else { Labels::new() }))
                .collect()
        };
        let admitted = |rs: &crate::node::netpol::Ruleset, pod: &str| -> Vec<String> {
            let iso = rs.ingress.iter().find(|i| i.pod == pod).unwrap_or_else(|| panic!("{pod} isolated for ingress"));
            let mut ips: Vec<String> = iso
                .allows
                .iter()
                .flat_map(|a| match &a.peer {
                    Peer::Ips(ips) => ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                    other => panic!("only pods are admitted: {other:?}"),
                })
                .collect();
            ips.sort();
            ips.dedup();
            ips
        };
        let rs = compute(&pods, &nss(true), &policies(true));
        assert!(rs.egress.is_empty(), "egress is left alone");
        assert_eq!(rs.ingress.iter().map(|i| i.pod.as_str()).collect::<Vec<_>>(), ["kv/kv-0", "kv/kv-1", "kv/kv-2"]);
        assert_eq!(
            admitted(&rs, "kv/kv-0"),
            ["10.0.0.10", "10.0.0.13", "10.0.0.14", "10.0.0.20"],
            "the primary: everyone but the standbys of its namespace"
        );
        assert_eq!(
            admitted(&rs, "kv/kv-1"),
            ["10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14", "10.0.0.20"],
            "a standby: everyone but the primary"
        );
        // Without the namespace name label (Kubernetes < 1.21): other namespaces' pods are not admitted.
        let rs = compute(&pods, &nss(false), &policies(false));
        assert_eq!(admitted(&rs, "kv/kv-0"), ["10.0.0.10", "10.0.0.13", "10.0.0.14"]);
    }

    #[test]
    fn group_policies_are_known_by_their_names() {
        assert_eq!(group_policy_pick(&group_policy_name(7, 'a')), Some(7));
        assert_eq!(group_policy_pick(&group_policy_name(0, 'b')), Some(0));
        assert_eq!(group_policy_pick("shakedown-partition-groups-p1-c"), None);
        assert_eq!(group_policy_pick("shakedown-partition-m1"), None);
    }
}
