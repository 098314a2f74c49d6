//! The kube target's `leaks`: its inventory of Cluster API objects against the model.

use std::collections::BTreeMap;

use shakedown_faults::{MemberId, MemberState, Model, Version};
use shakedown_invariants::{InvariantId, Inventory, KubeInventory, Observation, Verdict, STUCK_DELETION_SECS};

fn model() -> Model {
    Model::new(3, 3, vec![Version::new(3, 4), Version::new(3, 5)], 1)
}

fn obs(inv: KubeInventory) -> Observation {
    Observation { inventory: Some(Inventory::Kube(inv)), ..Default::default() }
}

fn bound() -> KubeInventory {
    let machines = (0..3).map(|i| (format!("cp-{i}"), Some(MemberId(i)))).collect();
    KubeInventory { machines, machine_deployments: vec![("md-0".into(), 2, 2)], ..Default::default() }
}

fn fails_with(inv: KubeInventory, m: &Model, text: &str) {
    match InvariantId::Leaks.check(m, &obs(inv)) {
        Verdict::Fail(msg) => assert!(msg.contains(text), "{msg}"),
        v => panic!("expected a failure containing {text:?}, got {v:?}"),
    }
}

#[test]
fn every_member_on_a_machine_and_nothing_else_passes() {
    assert_eq!(InvariantId::Leaks.check(&model(), &obs(bound())), Verdict::Pass);
}

#[test]
fn a_machine_standing_for_no_member_is_a_leak() {
    let mut inv = bound();
    inv.machines.insert("cp-old".into(), None);
    fails_with(inv, &model(), "left behind: cp-old");
}

#[test]
fn a_running_member_without_a_machine_is_missing_but_a_crashed_one_is_not() {
    let mut inv = bound();
    inv.machines.remove("cp-1");
    fails_with(inv.clone(), &model(), "no Machine for member(s) m1");
    let mut m = model();
    m.members.get_mut(&MemberId(1)).unwrap().state = MemberState::Crashed;
    assert_eq!(InvariantId::Leaks.check(&m, &obs(inv)), Verdict::Pass);
}

#[test]
fn worker_machines_against_replicas_orphans_and_stuck_deletions() {
    let mut inv = bound();
    inv.machine_deployments = vec![("md-0".into(), 2, 3)];
    fails_with(inv, &model(), "MachineDeployment md-0 has 3 Machine(s), spec.replicas is 2");
    let mut inv = bound();
    inv.orphan_infra_machines = vec!["DevMachine/x".into()];
    fails_with(inv, &model(), "InfraMachine(s) without a Machine: DevMachine/x");
    let mut inv = bound();
    inv.deleting = BTreeMap::from([("Machine/cp-9".to_string(), STUCK_DELETION_SECS)]);
    fails_with(inv.clone(), &model(), "stuck in deletion");
    inv.deleting = BTreeMap::from([("Machine/cp-9".to_string(), 3)]);
    assert_eq!(InvariantId::Leaks.check(&model(), &obs(inv)), Verdict::Pass);
}

#[test]
fn workload_cluster_nodes_volumes_and_attachments() {
    let mut inv = bound();
    inv.orphan_nodes = vec!["ghost".into()];
    fails_with(inv, &model(), "Node(s) without a Machine: ghost");
    let mut inv = bound();
    inv.released_volumes = vec!["pv-1 (Released)".into(), "pv-2 (Failed)".into()];
    fails_with(inv, &model(), "PersistentVolume(s) Released or Failed: pv-1 (Released), pv-2 (Failed)");
    let mut inv = bound();
    inv.orphan_volume_attachments = vec!["csi-x (node gone)".into()];
    fails_with(inv, &model(), "VolumeAttachment(s) whose Node is gone: csi-x (node gone)");
}
