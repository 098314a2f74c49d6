//! The node's NetworkPolicy engine. The CNI `bridge` plugin enforces no policy, so a node runs
//! this agent beside its components (`shakedown node policy-agent`, started by bring-up): it
//! watches Pods, NetworkPolicies and Namespaces and keeps two chains of the node's nftables table
//! (`netpol-egress`, `netpol-ingress`, on the forward hook) equal to what the policies say.
//!
//! What it enforces: pod-to-pod traffic across the node's bridge (seen by the forward hook through
//! `br_netfilter`); `podSelector`, `policyTypes` (defaulted as the API does), ingress `from` and
//! egress `to` peers (`podSelector`, `namespaceSelector`, both, `ipBlock` with `except`), `ports`
//! (protocol, number or name, `endPort`). What it does not: traffic between a pod and the node
//! itself (kubelet's probes, host-network pods), which NetworkPolicy implementations commonly
//! allow too. A packet is judged by its connection's original direction (conntrack's `ct
//! original` tuple): replies of an allowed connection pass, and a connection a new policy denies
//! is cut at once, established or not (some network plugins let established connections run on;
//! a partition here is total).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ApiResource;
use kube::runtime::watcher::Config as WatchConfig;

use super::layout::Layout;
use super::NodeError;
use crate::command::{run, COMMAND_BOUND};
use crate::k8s::client::Watched;

/// The sysctl that sends bridged IPv4 traffic through the IP hooks (`br_netfilter`): without it
/// the engine sees no pod-to-pod packet.
pub const BRIDGE_NF: &str = "net/bridge/bridge-nf-call-iptables";
/// How often the agent recomputes even without a change (a missed event heals by then).
const RESYNC: Duration = Duration::from_secs(10);
/// Changes within this window are applied together.
const DEBOUNCE: Duration = Duration::from_millis(50);

/// A pod as the engine sees it: where it is, its labels, its named ports.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub ns: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ip: Ipv4Addr,
    /// Named container ports: name → (protocol, port).
    pub ports: BTreeMap<String, (String, u16)>,
}

impl PodInfo {
    /// A running pod on the pod network (host-network pods and pods without an IP or finished are
    /// none of the engine's business).
    pub fn of(p: &Pod) -> Option<PodInfo> {
        let spec = p.spec.as_ref()?;
        if spec.host_network == Some(true) {
            return None;
        }
        let status = p.status.as_ref()?;
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return None;
        }
        let ip = status.pod_ip.as_deref()?.parse().ok()?;
        let mut ports = BTreeMap::new();
        for c in &spec.containers {
            for cp in c.ports.iter().flatten() {
                if let (Some(name), Ok(port)) = (&cp.name, u16::try_from(cp.container_port)) {
                    ports.insert(name.clone(), (cp.protocol.clone().unwrap_or_else(|| "TCP".into()), port));
                }
            }
        }
        Some(PodInfo {
            ns: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            ip,
            ports,
        })
    }
}

/// Whether `labels` match `sel` (an empty selector matches everything).
pub fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && sel.match_expressions.iter().flatten().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                // The apiserver refuses any other operator; matching nothing is the safe reading.
                _ => false,
            }
        })
}

/// Who a rule allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Anyone (a rule without `from` / `to`).
    Any,
    /// These pods' addresses (a selector's pods; none: the rule allows nothing).
    Ips(BTreeSet<Ipv4Addr>),
    /// An `ipBlock`.
    Cidr { cidr: String, except: Vec<String> },
}

/// Ports a rule allows: `None` every port of every protocol; else (protocol, first, last)
/// (`last` = `first` for one port; `None` first: every port of that protocol).
pub type Ports = Option<Vec<(String, Option<(u16, u16)>)>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allow {
    pub peer: Peer,
    pub ports: Ports,
}

/// One pod isolated in one direction, with what is still allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolated {
    pub pod: String,
    pub ip: Ipv4Addr,
    pub allows: Vec<Allow>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub ingress: Vec<Isolated>,
    pub egress: Vec<Isolated>,
}

/// The policy's types as the API defaults them: Ingress always, Egress when it has egress rules.
fn types(p: &NetworkPolicy) -> (bool, bool) {
    let spec = p.spec.clone().unwrap_or_default();
    match &spec.policy_types {
        Some(t) => (t.iter().any(|x| x == "Ingress"), t.iter().any(|x| x == "Egress")),
        None => (true, spec.egress.is_some()),
    }
}

/// The pods a peer names, seen from a policy of namespace `ns`.
fn peer_pods<'a>(
    peer: &NetworkPolicyPeer,
    ns: &str,
    pods: &'a [PodInfo],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<&'a PodInfo> {
    let empty = BTreeMap::new();
    pods.iter()
        .filter(|p| match &peer.namespace_selector {
            Some(sel) => selects(sel, namespaces.get(&p.ns).unwrap_or(&empty)),
            None => p.ns == ns,
        })
        .filter(|p| peer.pod_selector.as_ref().is_none_or(|sel| selects(sel, &p.labels)))
        .collect()
}

/// A policy port as (protocol, range), its name resolved on `on` (`None`: it names a port `on`
/// lacks, or `on` is not a pod: that port matches nothing).
fn port_of(p: &NetworkPolicyPort, on: Option<&PodInfo>) -> Option<(String, Option<(u16, u16)>)> {
    let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
    match &p.port {
        None => Some((proto, None)),
        Some(IntOrString::Int(n)) => {
            let first = u16::try_from(*n).ok()?;
            let last = p.end_port.and_then(|e| u16::try_from(e).ok()).unwrap_or(first);
            Some((proto, Some((first, last.max(first)))))
        }
        Some(IntOrString::String(name)) => {
            let (pproto, port) = on?.ports.get(name)?;
            (*pproto == proto).then_some((proto, Some((*port, *port))))
        }
    }
}

fn ipv4_in(ip: Ipv4Addr, cidr: &str) -> bool {
    let Some((net, len)) = cidr.split_once('/') else { return cidr.parse::<Ipv4Addr>() == Ok(ip) };
    let (Ok(net), Ok(len)) = (net.parse::<Ipv4Addr>(), len.parse::<u32>()) else { return false };
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len.min(32)) };
    u32::from(ip) & mask == u32::from(net) & mask
}

/// The rules of one direction's peers and ports for the isolated pod `pod`. Named ports are
/// resolved on the pod that listens: `pod` itself for ingress, each destination pod for egress.
fn allows(
    peers: Option<&Vec<NetworkPolicyPeer>>,
    ports: Option<&Vec<NetworkPolicyPort>>,
    ingress: bool,
    pod: &PodInfo,
    policy_ns: &str,
    pods: &[PodInfo],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<Allow> {
    let ports: Vec<NetworkPolicyPort> = ports.cloned().unwrap_or_default();
    let named = ports.iter().any(|p| matches!(p.port, Some(IntOrString::String(_))));
    let peers: Vec<Peer> = match peers {
        None => vec![Peer::Any],
        Some(v) if v.is_empty() => vec![Peer::Any],
        Some(v) => v
            .iter()
            .map(|peer| match &peer.ip_block {
                // The node's pods have IPv4 addresses only: an IPv6 block matches none of their traffic.
                Some(b) if b.cidr.contains(':') => Peer::Ips(BTreeSet::new()),
                Some(b) => {
                    Peer::Cidr { cidr: b.cidr.clone(), except: b.except.iter().flatten().filter(|e| !e.contains(':')).cloned().collect() }
                }
                None => Peer::Ips(peer_pods(peer, policy_ns, pods, namespaces).iter().map(|p| p.ip).collect()),
            })
            .collect(),
    };
    let resolve = |on: Option<&PodInfo>| -> Ports {
        if ports.is_empty() {
            None
        } else {
            Some(ports.iter().filter_map(|p| port_of(p, on)).collect())
        }
    };
    if ingress || !named {
        let p = resolve(if ingress { Some(pod) } else { None });
        return peers.into_iter().map(|peer| Allow { peer, ports: p.clone() }).collect();
    }
    // Egress to a named port: one rule per destination pod, its own number for the name.
    let mut out = vec![];
    for peer in peers {
        let dests: Vec<&PodInfo> = pods
            .iter()
            .filter(|d| match &peer {
                Peer::Any => true,
                Peer::Ips(ips) => ips.contains(&d.ip),
                Peer::Cidr { cidr, except } => ipv4_in(d.ip, cidr) && !except.iter().any(|e| ipv4_in(d.ip, e)),
            })
            .collect();
        for d in dests {
            out.push(Allow { peer: Peer::Ips(BTreeSet::from([d.ip])), ports: resolve(Some(d)) });
        }
        // Numbered ports still apply to destinations that are not pods.
        if !matches!(peer, Peer::Ips(_)) {
            let numbered: Vec<_> =
                ports.iter().filter(|p| !matches!(p.port, Some(IntOrString::String(_)))).filter_map(|p| port_of(p, None)).collect();
            if !numbered.is_empty() {
                out.push(Allow { peer, ports: Some(numbered) });
            }
        }
    }
    out
}

/// What the policies say, for these pods.
pub fn compute(pods: &[PodInfo], namespaces: &BTreeMap<String, BTreeMap<String, String>>, policies: &[NetworkPolicy]) -> Ruleset {
    let mut rs = Ruleset::default();
    for pod in pods {
        let (mut ing, mut eg): (Option<Vec<Allow>>, Option<Vec<Allow>>) = (None, None);
        for pol in policies {
            let ns = pol.metadata.namespace.clone().unwrap_or_default();
            let spec = pol.spec.clone().unwrap_or_default();
            if ns != pod.ns || !spec.pod_selector.as_ref().is_none_or(|s| selects(s, &pod.labels)) {
                continue;
            }
            let (i, e) = types(pol);
            if i {
                let a = ing.get_or_insert_with(Vec::new);
                for r in spec.ingress.iter().flatten() {
                    a.extend(allows(r.from.as_ref(), r.ports.as_ref(), true, pod, &ns, pods, namespaces));
                }
            }
            if e {
                let a = eg.get_or_insert_with(Vec::new);
                for r in spec.egress.iter().flatten() {
                    a.extend(allows(r.to.as_ref(), r.ports.as_ref(), false, pod, &ns, pods, namespaces));
                }
            }
        }
        let id = format!("{}/{}", pod.ns, pod.name);
        if let Some(allows) = ing {
            rs.ingress.push(Isolated { pod: id.clone(), ip: pod.ip, allows });
        }
        if let Some(allows) = eg {
            rs.egress.push(Isolated { pod: id, ip: pod.ip, allows });
        }
    }
    rs
}

fn nft_set<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    format!("{{ {} }}", items.into_iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "))
}

/// The nftables script that makes the table's policy chains say `rs` (applied atomically).
pub fn render(table: &str, rs: &Ruleset) -> String {
    let mut s = format!("flush chain inet {table} netpol-egress\nflush chain inet {table} netpol-ingress\n");
    for (chain, list, own, other) in [("netpol-egress", &rs.egress, "saddr", "daddr"), ("netpol-ingress", &rs.ingress, "daddr", "saddr")] {
        for iso in list {
            let me = format!("ct original ip {own} {}", iso.ip);
            for a in &iso.allows {
                let peer = match &a.peer {
                    Peer::Any => String::new(),
                    Peer::Ips(ips) if ips.is_empty() => continue,
                    Peer::Ips(ips) => format!(" ct original ip {other} {}", nft_set(ips)),
                    Peer::Cidr { cidr, except } if except.is_empty() => format!(" ct original ip {other} {cidr}"),
                    Peer::Cidr { cidr, except } => format!(" ct original ip {other} {cidr} ct original ip {other} != {}", nft_set(except)),
                };
                match &a.ports {
                    None => s.push_str(&format!("add rule inet {table} {chain} {me}{peer} return\n")),
                    Some(ports) => {
                        let mut by_proto: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
                        for (proto, range) in ports {
                            let e = by_proto.entry(proto.to_lowercase()).or_insert_with(|| Some(vec![]));
                            match (range, e.as_mut()) {
                                (None, _) => *e = None,
                                (Some((f, l)), Some(v)) => v.push(if f == l { f.to_string() } else { format!("{f}-{l}") }),
                                (Some(_), None) => {}
                            }
                        }
                        for (proto, nums) in by_proto {
                            let dst = nums.map(|n| format!(" ct original proto-dst {}", nft_set(n))).unwrap_or_default();
                            s.push_str(&format!("add rule inet {table} {chain} {me}{peer} meta l4proto {proto}{dst} return\n"));
                        }
                    }
                }
            }
            s.push_str(&format!("add rule inet {table} {chain} {me} counter drop comment \"{}\"\n", iso.pod));
        }
    }
    s
}

/// The base chains the agent fills (part of the guard table, made at bring-up).
pub fn base_chains() -> &'static str {
    "  chain netpol { type filter hook forward priority 10; jump netpol-egress; jump netpol-ingress; }\n  chain netpol-egress { }\n  chain netpol-ingress { }\n"
}

/// What the agent last applied (`node/policy-status.json`, for `node status`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Status {
    pub policies: usize,
    /// Pods isolated in at least one direction.
    pub isolated: usize,
    /// Why the last apply failed, if it did.
    pub error: Option<String>,
}

pub fn status_file(l: &Layout) -> std::path::PathBuf {
    l.dir.join("policy-status.json")
}

/// `node status`'s line about the engine: running or not, and what it last applied.
pub fn describe(l: &Layout) -> String {
    let running = crate::procs::processes_of(&l.dir).iter().any(|(_, cmd)| cmd.contains("policy-agent"));
    let status: Option<Status> = std::fs::read_to_string(status_file(l)).ok().and_then(|s| serde_json::from_str(&s).ok());
    match (running, status) {
        (false, _) => "NetworkPolicy engine not running: policies are not enforced".to_string(),
        (true, None) => "NetworkPolicy engine starting".to_string(),
        (true, Some(Status { error: Some(e), .. })) => format!("NetworkPolicy engine running; its last apply failed: {e}"),
        (true, Some(s)) => format!("NetworkPolicy engine running: {} policies, {} pods isolated", s.policies, s.isolated),
    }
}

/// The agent: keeps the node's policy chains current until killed (the node's teardown does).
pub async fn agent(node_dir: &Path) -> Result<(), NodeError> {
    let l = Layout::load(node_dir).ok_or_else(|| NodeError::NoNode(node_dir.to_path_buf()))?;
    if !std::fs::read_to_string(Path::new("/proc/sys").join(BRIDGE_NF)).is_ok_and(|v| v.trim() == "1") {
        return Err(NodeError::NoBridgeNetfilter);
    }
    let client = super::admin_client(&l.admin_kubeconfig()).await?;
    let (tx, mut rx) = tokio::sync::watch::channel(0u64);
    let errors = Arc::new(Mutex::new(None));
    let watch = |ar: ApiResource| Watched::start_cluster_scoped(&client, &ar, WatchConfig::default(), tx.clone(), errors.clone());
    let pods = watch(ApiResource::erase::<Pod>(&()));
    let policies = watch(ApiResource::erase::<NetworkPolicy>(&()));
    let namespaces = watch(ApiResource::erase::<Namespace>(&()));
    let file = l.dir.join("policy.nft");
    let mut applied: Option<Ruleset> = None;
    loop {
        let _ = tokio::time::timeout(RESYNC, rx.changed()).await;
        tokio::time::sleep(DEBOUNCE).await;
        rx.borrow_and_update();
        if !(pods.synced() && policies.synced() && namespaces.synced()) {
            continue;
        }
        let typed =
            |w: &Watched| -> Vec<serde_json::Value> { w.objects().iter().filter_map(|o| serde_json::to_value(o.as_ref()).ok()).collect() };
        let pod_infos: Vec<PodInfo> =
            typed(&pods).into_iter().filter_map(|v| serde_json::from_value::<Pod>(v).ok()).filter_map(|p| PodInfo::of(&p)).collect();
        let pols: Vec<NetworkPolicy> = typed(&policies).into_iter().filter_map(|v| serde_json::from_value(v).ok()).collect();
        let nss: BTreeMap<String, BTreeMap<String, String>> = typed(&namespaces)
            .into_iter()
            .filter_map(|v| serde_json::from_value::<Namespace>(v).ok())
            .map(|n| (n.metadata.name.unwrap_or_default(), n.metadata.labels.unwrap_or_default()))
            .collect();
        let rs = compute(&pod_infos, &nss, &pols);
        if applied.as_ref() == Some(&rs) {
            continue;
        }
        let script = render(&l.nft_table, &rs);
        std::fs::write(&file, &script).map_err(|source| NodeError::Io { action: "write", path: file.clone(), source })?;
        let out = run("nft", &["-f", &file.display().to_string()], COMMAND_BOUND).await?;
        let status = if out.status.success() {
            tracing::info!(policies = pols.len(), ingress_isolated = rs.ingress.len(), egress_isolated = rs.egress.len(), "applied");
            let s = Status {
                policies: pols.len(),
                isolated: rs.ingress.iter().chain(&rs.egress).map(|i| i.pod.clone()).collect::<BTreeSet<_>>().len(),
                error: None,
            };
            applied = Some(rs);
            s
        } else {
            // Kept for the next change or resync; the log says what nft refused.
            let e = format!("nft -f {}: {}", file.display(), String::from_utf8_lossy(&out.stderr).trim());
            tracing::error!("{e}");
            Status { policies: pols.len(), isolated: 0, error: Some(e) }
        };
        let _ = std::fs::write(status_file(&l), serde_json::to_string(&status).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> PodInfo {
        PodInfo {
            ns: ns.into(),
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ip: ip.parse().unwrap(),
            ports: BTreeMap::from([("http".to_string(), ("TCP".to_string(), 8080))]),
        }
    }

    fn policy(ns: &str, spec: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": ns}, "spec": spec})).unwrap()
    }

    fn ips(v: &[&str]) -> Peer {
        Peer::Ips(v.iter().map(|s| s.parse().unwrap()).collect())
    }

    #[test]
    fn selectors_follow_the_apis_rules() {
        let labels: BTreeMap<String, String> =
            [("app", "web"), ("tier", "a")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let sel = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        assert!(selects(&sel(json!({})), &labels), "empty selects all");
        assert!(selects(&sel(json!({"matchLabels": {"app": "web"}})), &labels));
        assert!(!selects(&sel(json!({"matchLabels": {"app": "db"}})), &labels));
        assert!(selects(&sel(json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]})), &labels));
        assert!(!selects(&sel(json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]})), &labels));
        assert!(
            selects(&sel(json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]})), &labels),
            "NotIn holds for a missing key"
        );
        assert!(selects(&sel(json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]})), &labels));
        assert!(
            !selects(
                &sel(json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]})),
                &labels
            ),
            "both parts must hold"
        );
    }

    #[test]
    fn a_deny_all_policy_isolates_only_its_pods_in_the_directions_it_names() {
        let pods = [
            pod("a", "web-0", "10.0.0.10", &[("app", "web")]),
            pod("a", "web-1", "10.0.0.11", &[("app", "web")]),
            pod("b", "web-0", "10.0.0.12", &[("app", "web")]),
        ];
        let cut = policy(
            "a",
            json!({"podSelector": {"matchLabels": {"statefulset.kubernetes.io/pod-name": "web-0"}}, "policyTypes": ["Ingress", "Egress"]}),
        );
        let mut p0 = pods[0].clone();
        p0.labels.insert("statefulset.kubernetes.io/pod-name".into(), "web-0".into());
        let mut pods = pods.to_vec();
        pods[0] = p0;
        let rs = compute(&pods, &BTreeMap::new(), &[cut]);
        let want = vec![Isolated { pod: "a/web-0".into(), ip: "10.0.0.10".parse().unwrap(), allows: vec![] }];
        assert_eq!((rs.ingress.clone(), rs.egress.clone()), (want.clone(), want));
        // Without policyTypes: Ingress only, unless it has egress rules.
        let ing = policy("a", json!({"podSelector": {}}));
        let rs = compute(&pods, &BTreeMap::new(), &[ing]);
        assert_eq!(rs.ingress.iter().map(|i| i.pod.as_str()).collect::<Vec<_>>(), ["a/web-0", "a/web-1"], "namespace a only");
        assert!(rs.egress.is_empty());
        let eg = policy("a", json!({"podSelector": {}, "egress": [{}]}));
        let rs = compute(&pods, &BTreeMap::new(), &[eg]);
        assert_eq!(rs.egress.len(), 2);
        assert_eq!(rs.egress[0].allows, vec![Allow { peer: Peer::Any, ports: None }], "an empty rule allows everything");
    }

    #[test]
    fn peers_ports_and_named_ports_resolve_as_the_api_says() {
        let pods = [
            pod("a", "web-0", "10.0.0.10", &[("app", "web")]),
            pod("a", "cli-0", "10.0.0.11", &[("role", "client")]),
            pod("b", "cli-1", "10.0.0.12", &[("role", "client")]),
        ];
        let nss = BTreeMap::from([("b".to_string(), BTreeMap::from([("team".to_string(), "x".to_string())]))]);
        let p = policy(
            "a",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [
                {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": "http"}]},
                {"from": [{"namespaceSelector": {"matchLabels": {"team": "x"}}}], "ports": [{"port": 9000, "endPort": 9010, "protocol": "UDP"}]},
                {"from": [{"ipBlock": {"cidr": "10.0.0.0/24", "except": ["10.0.0.11/32"]}}]},
                {"from": [{"podSelector": {"matchLabels": {"role": "nobody"}}}]},
                {"from": [{"ipBlock": {"cidr": "::/0"}}]}
            ]}),
        );
        let rs = compute(&pods, &nss, &[p]);
        assert_eq!(rs.ingress.len(), 1);
        let a = &rs.ingress[0].allows;
        assert_eq!(
            a[0],
            Allow { peer: ips(&["10.0.0.11"]), ports: Some(vec![("TCP".into(), Some((8080, 8080)))]) },
            "a podSelector alone: the policy's namespace; the name resolved on the listening pod"
        );
        assert_eq!(a[1], Allow { peer: ips(&["10.0.0.12"]), ports: Some(vec![("UDP".into(), Some((9000, 9010)))]) });
        assert_eq!(a[2], Allow { peer: Peer::Cidr { cidr: "10.0.0.0/24".into(), except: vec!["10.0.0.11/32".into()] }, ports: None });
        assert_eq!(a[3], Allow { peer: ips(&[]), ports: None }, "a selector of no pod allows nothing");
        assert_eq!(
            a[4],
            Allow { peer: ips(&[]), ports: None },
            "an IPv6 block allows no IPv4 traffic (and renders no rule nft would refuse)"
        );
        let script = render("t", &rs);
        assert!(script.contains("add rule inet t netpol-ingress ct original ip daddr 10.0.0.10 ct original ip saddr { 10.0.0.11 } meta l4proto tcp ct original proto-dst { 8080 } return"), "{script}");
        assert!(script.contains("meta l4proto udp ct original proto-dst { 9000-9010 } return"), "{script}");
        assert!(script.contains("ct original ip saddr 10.0.0.0/24 ct original ip saddr != { 10.0.0.11/32 } return"), "{script}");
        assert!(!script.contains("{  }"), "an empty peer set renders no rule: {script}");
        assert!(
            script.trim_end().ends_with("add rule inet t netpol-ingress ct original ip daddr 10.0.0.10 counter drop comment \"a/web-0\""),
            "{script}"
        );

        // Egress to a named port: resolved on each destination pod.
        let mut db = pod("a", "db-0", "10.0.0.20", &[("app", "db")]);
        db.ports = BTreeMap::from([("http".to_string(), ("TCP".to_string(), 5432))]);
        let pods = [pods[0].clone(), db];
        let p = policy(
            "a",
            json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "http"}, {"port": 53, "protocol": "UDP"}]}]}),
        );
        let rs = compute(&pods, &BTreeMap::new(), &[p]);
        let a = &rs.egress[0].allows;
        assert!(
            a.contains(&Allow {
                peer: ips(&["10.0.0.20"]),
                ports: Some(vec![("TCP".into(), Some((5432, 5432))), ("UDP".into(), Some((53, 53)))])
            }),
            "{a:?}"
        );
        assert!(
            a.contains(&Allow { peer: Peer::Any, ports: Some(vec![("UDP".into(), Some((53, 53)))]) }),
            "numbered ports still reach non-pods: {a:?}"
        );
    }
}
