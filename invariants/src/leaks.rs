//! `leaks`: what the target finds of the run (on the machine, or in the cluster) equals what the
//! model expects: nothing left behind, nothing missing.

use std::collections::BTreeSet;

use shakedown_faults::{Answers, BackupId, MemberId, Model, OutageMode};

use crate::{Inventory, KubeInventory, LocalInventory, Observation, Verdict, STUCK_DELETION_SECS};

pub(crate) fn leaks(model: &Model, obs: &Observation) -> Verdict {
    match &obs.inventory {
        None => Verdict::Unobserved("no inventory of the run's resources".into()),
        Some(Inventory::Local(inv)) => local_leaks(model, inv),
        Some(Inventory::Kube(inv)) => kube_leaks(model, inv),
        Some(Inventory::App(inv)) => app_leaks(model, inv),
    }
}

/// The application target's leaks: a partition's NetworkPolicy exactly while the model has
/// the partition, no other policy of the run, the operator at its replicas, no node left
/// cordoned or tainted, no pod left failed.
fn app_leaks(model: &Model, inv: &crate::observation::AppInventory) -> Verdict {
    let mut problems = vec![];
    for m in inv.partitioned.difference(&model.partitioned) {
        problems.push(format!("the partition NetworkPolicy of {m} is still there"));
    }
    for m in model.partitioned.difference(&inv.partitioned) {
        problems.push(format!("the partition NetworkPolicy of {m} is missing"));
    }
    match (model.groups_partitioned, inv.groups_partitioned) {
        (Some(m), Some(i)) if m != i => {
            problems.push(format!("the NetworkPolicies of partition-groups(pick {i}) are there, not those of pick {m}"))
        }
        (None, Some(i)) => problems.push(format!("the NetworkPolicies of partition-groups(pick {i}) are still there")),
        (Some(m), None) => problems.push(format!("the NetworkPolicies of partition-groups(pick {m}) are missing")),
        _ => {}
    }
    if !inv.stray_policies.is_empty() {
        problems.push(format!("NetworkPolicies of the run that no partition explains: {}", inv.stray_policies.join(", ")));
    }
    if let Some(why) = &inv.operator_scaled_down {
        problems.push(why.clone());
    }
    if !inv.cordoned.is_empty() {
        problems.push(format!("nodes the run cordoned are still cordoned: {}", inv.cordoned.join(", ")));
    }
    if !inv.tainted.is_empty() {
        problems.push(format!("nodes still carry the run's taint: {}", inv.tainted.join(", ")));
    }
    if !inv.failed_pods.is_empty() {
        problems.push(format!("pods a pod-failure of the run left failed (their own images not put back): {}", inv.failed_pods.join(", ")));
    }
    match problems.is_empty() {
        true => Verdict::Pass,
        false => Verdict::Fail(problems.join("; ")),
    }
}

/// The local target's leaks: etcd processes (and the control-plane stack's apiservers), mounts, loop devices, data directories, partition
/// rules and backup files against the model; HAProxy running.
fn local_leaks(model: &Model, inv: &LocalInventory) -> Verdict {
    let mut problems = Vec::new();
    let mut compare = |what: &str, found: &std::collections::BTreeSet<String>, must: Vec<String>, may: Vec<String>| {
        let leaked: Vec<&String> = found.iter().filter(|f| !must.contains(f) && !may.contains(f)).collect();
        let missing: Vec<&String> = must.iter().filter(|m| !found.contains(*m)).collect();
        if !leaked.is_empty() {
            problems.push(format!("{what} left behind: {}", leaked.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
        }
        if !missing.is_empty() {
            problems.push(format!("{what} missing: {}", missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
        }
    };
    let names = |f: &dyn Fn(&shakedown_faults::Member) -> bool| {
        model.members.values().filter(|m| f(m)).map(|m| m.id.to_string()).collect::<Vec<_>>()
    };
    // A member whose process is missing is the `members` invariant's finding, not a leak.
    compare("etcd processes", &inv.processes, vec![], names(&|m| model.has_process(m) != Answers::No));
    // A machine's apiserver lives and dies with its member (a crash, a power loss take both).
    if let Some(apiservers) = &inv.apiservers {
        compare("kube-apiserver processes", apiservers, vec![], names(&|m| model.has_process(m) != Answers::No));
    }
    let all = names(&|_| true);
    let disks = if inv.loop_disks { all.clone() } else { vec![] };
    compare("mounts", &inv.mounts, disks.clone(), vec![]);
    compare("loop devices", &inv.loop_devices, disks, vec![]);
    compare("data directories", &inv.data_dirs, all, vec![]);
    let isolated: Vec<String> = model.outages.iter().filter(|(_, m)| **m == OutageMode::Isolate).map(|(s, _)| s.to_string()).collect();
    compare("partition rules", &inv.partition_rules, isolated, vec![]);
    compare("backup files", &inv.backups, model.backups.iter().map(BackupId::to_string).collect(), vec![]);
    if inv.haproxies == 0 {
        problems.push("no HAProxy process".into());
    }
    if problems.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(problems.join("; "))
    }
}

/// The kube target's leaks: Machines that stand for no model member, members expected to have
/// a Machine without one, worker Machines against their MachineDeployment's replicas, orphaned
/// InfraMachines, Nodes, volumes and attachments, objects stuck in deletion.
fn kube_leaks(model: &Model, inv: &KubeInventory) -> Verdict {
    let mut problems = Vec::new();
    let stray: Vec<&str> = inv.machines.iter().filter(|(_, m)| m.is_none()).map(|(n, _)| n.as_str()).collect();
    if !stray.is_empty() {
        problems.push(format!("control-plane Machine(s) standing for no member of the model left behind: {}", stray.join(", ")));
    }
    let bound: BTreeSet<MemberId> = inv.machines.values().flatten().copied().collect();
    let missing: Vec<String> = model
        .members
        .values()
        .filter(|m| model.has_process(m) == Answers::Yes && !bound.contains(&m.id))
        .map(|m| m.id.to_string())
        .collect();
    if !missing.is_empty() {
        problems.push(format!("no Machine for member(s) {}", missing.join(", ")));
    }
    for (md, want, found) in &inv.machine_deployments {
        if *found as i64 != *want {
            problems.push(format!("MachineDeployment {md} has {found} Machine(s), spec.replicas is {want}"));
        }
    }
    for (what, list) in [
        ("InfraMachine(s) without a Machine", &inv.orphan_infra_machines),
        ("Node(s) without a Machine", &inv.orphan_nodes),
        ("PersistentVolume(s) Released or Failed", &inv.released_volumes),
        ("VolumeAttachment(s) whose Node is gone", &inv.orphan_volume_attachments),
    ] {
        if !list.is_empty() {
            problems.push(format!("{what}: {}", list.join(", ")));
        }
    }
    let stuck: Vec<String> = inv.deleting.iter().filter(|(_, s)| **s >= STUCK_DELETION_SECS).map(|(o, s)| format!("{o} ({s}s)")).collect();
    if !stuck.is_empty() {
        problems.push(format!("object(s) stuck in deletion for more than {STUCK_DELETION_SECS}s: {}", stuck.join(", ")));
    }
    if problems.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(problems.join("; "))
    }
}
