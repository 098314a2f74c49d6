//! Each invariant: passes on a healthy observation, fails with a message that names the problem.

use std::collections::HashMap;

use shakedown_faults::{MemberId, Model, Op, Version};
use shakedown_invariants::{check_all, Durability, InvariantId, ListedMember, MemberStatus, Observation, Probe, ServingSample, Verdict};

fn model() -> Model {
    Model::new(3, 3, vec![Version::new(3, 4), Version::new(3, 5)], 1)
}

fn member(i: u32, leader: Option<u64>) -> MemberStatus {
    MemberStatus {
        name: format!("m{i}"),
        member: Some(MemberId(i)),
        reachable: true,
        leader,
        etcd_id: Some(100 + i as u64),
        revision: 10,
        raft_index: 20,
        version: Some("3.4.23".into()),
        hash: Some((10, 0xabcd)),
        error: None,
    }
}

fn healthy() -> Observation {
    Observation {
        members: (0..3).map(|i| member(i, Some(100))).collect(),
        member_list: Some((0..3).map(|i| ListedMember { id: 100 + i, name: format!("m{i}"), peer_urls: vec![] }).collect()),
        probes: vec![Probe { latency_ms: 2, error: None }; 3],
        durability: Some(Durability {
            acked: vec![("k1".into(), "v1".into())],
            read: HashMap::from([("k1".to_string(), "v1".to_string())]),
            read_error: None,
        }),
        serving_samples: vec![ServingSample { at_ms: 0, serving: vec!["m0".into(), "m1".into(), "m2".into()], cluster_size: 3 }],
        quorum_throughout: true,
        samples_until_ms: 0,
    }
}

fn verdict(id: InvariantId, m: &Model, o: &Observation) -> Verdict {
    id.check(m, o)
}

#[test]
fn healthy_observation_passes_every_invariant() {
    assert!(check_all(&InvariantId::ALL, &model(), &healthy()).is_empty());
}

#[test]
fn quorum_fails_on_two_leaders_and_on_no_leader() {
    let mut o = healthy();
    o.members[2].leader = Some(102);
    let v = verdict(InvariantId::Quorum, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("2 different leaders")), "{v:?}");

    let mut o = healthy();
    o.members.iter_mut().for_each(|m| m.leader = None);
    let v = verdict(InvariantId::Quorum, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("no leader")), "{v:?}");
}

#[test]
fn quorum_counts_only_reachable_members_that_see_the_leader() {
    let mut o = healthy();
    o.members[1].reachable = false;
    o.members[1].leader = None;
    assert!(verdict(InvariantId::Quorum, &model(), &o).is_pass(), "2 of 3 is quorum");
    o.members[2].leader = None;
    let v = verdict(InvariantId::Quorum, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("only 1 healthy voting members")), "{v:?}");
}

#[test]
fn invariants_follow_the_model_when_quorum_is_not_expected() {
    let mut m = Model::new(3, 3, vec![Version::new(3, 4)], 2);
    m.apply(&Op::Crash { member: MemberId(0) }).unwrap();
    m.apply(&Op::Crash { member: MemberId(1) }).unwrap();
    let mut o = healthy();
    o.members.iter_mut().for_each(|x| x.leader = None);
    o.quorum_throughout = m.quorum_expected();
    assert!(verdict(InvariantId::Quorum, &m, &o).is_pass());
    o.probes = vec![Probe { latency_ms: 2000, error: Some("timeout".into()) }];
    assert!(verdict(InvariantId::Reachability, &m, &o).is_pass(), "service not expected up");
}

#[test]
fn quorum_loss_during_the_step_is_definite() {
    let mut o = healthy();
    o.serving_samples.push(ServingSample { at_ms: 80, serving: vec!["m2".into()], cluster_size: 3 });
    o.serving_samples.push(ServingSample { at_ms: 150, serving: vec!["m1".into(), "m2".into()], cluster_size: 3 });
    let v = verdict(InvariantId::Quorum, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("from +80ms until +150ms only 1 of 3")), "{v:?}");
    // Not judged when the model does not promise quorum throughout the step.
    o.quorum_throughout = false;
    assert!(verdict(InvariantId::Quorum, &model(), &o).is_pass());
}

#[test]
fn quorum_loss_shorter_than_the_sampling_resolution_is_not_judged() {
    let mut o = healthy();
    o.serving_samples.push(ServingSample { at_ms: 80, serving: vec!["m2".into()], cluster_size: 3 });
    o.serving_samples.push(ServingSample { at_ms: 84, serving: vec!["m1".into(), "m2".into()], cluster_size: 3 });
    assert!(verdict(InvariantId::Quorum, &model(), &o).is_pass());
    // Still lost when the observation was taken: judged by the time up to the observation.
    o.serving_samples.push(ServingSample { at_ms: 90, serving: vec!["m2".into()], cluster_size: 3 });
    o.samples_until_ms = 100;
    assert!(verdict(InvariantId::Quorum, &model(), &o).is_pass());
    o.samples_until_ms = 130;
    assert!(matches!(verdict(InvariantId::Quorum, &model(), &o), Verdict::Definite(m) if m.contains("from +90ms until at least +130ms")));
}

#[test]
fn quorum_during_a_replace_uses_the_membership_size_of_the_instant() {
    let mut o = healthy();
    o.serving_samples = vec![ServingSample { at_ms: 5, serving: vec!["m0".into(), "m1".into(), "m2".into()], cluster_size: 4 }];
    assert!(verdict(InvariantId::Quorum, &model(), &o).is_pass(), "3 of 4 is quorum");
    o.serving_samples = vec![ServingSample { at_ms: 5, serving: vec!["m0".into(), "m1".into()], cluster_size: 4 }];
    o.samples_until_ms = 500;
    assert!(matches!(verdict(InvariantId::Quorum, &model(), &o), Verdict::Definite(_)));
}

#[test]
fn members_must_answer_as_the_model_expects() {
    let mut m = model();
    let mut o = healthy();
    o.members[0].reachable = false;
    o.members[0].error = Some("connection refused".into());
    let v = verdict(InvariantId::Members, &m, &o);
    assert!(matches!(&v, Verdict::Fail(x) if x.contains("m0 is expected running but does not answer (connection refused)")), "{v:?}");
    m.apply(&Op::Crash { member: MemberId(0) }).unwrap();
    assert!(verdict(InvariantId::Members, &m, &o).is_pass());
    m.apply(&Op::Restart { member: MemberId(0) }).unwrap();
    m.apply(&Op::Pause { member: MemberId(1) }).unwrap();
    let v = verdict(InvariantId::Members, &m, &healthy());
    assert!(matches!(&v, Verdict::Fail(x) if x.contains("m1 is expected paused but answers")), "{v:?}");
}

#[test]
fn membership_names_stale_and_missing_members() {
    let mut o = healthy();
    o.member_list.as_mut().unwrap().push(ListedMember { id: 0x99, name: "m7".into(), peer_urls: vec![] });
    let v = verdict(InvariantId::Membership, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("stale member(s) not in the model: m7 (99)")), "{v:?}");
    let mut o = healthy();
    o.member_list.as_mut().unwrap().remove(1);
    let v = verdict(InvariantId::Membership, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("missing member(s): m1")), "{v:?}");
}

#[test]
fn consistency_fails_when_hashes_differ_at_the_same_revision() {
    let mut o = healthy();
    o.members[1].hash = Some((10, 0x1234));
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("revision 10") && m.contains("00001234 on m1")), "{v:?}");
    // Different revisions are not compared.
    o.members[1].hash = Some((11, 0x1234));
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass());
}

#[test]
fn reachability_fails_on_any_failed_probe_when_the_service_should_be_up() {
    let mut o = healthy();
    o.probes[1] = Probe { latency_ms: 2001, error: Some("linearizable read: no answer within 2000ms".into()) };
    let v = verdict(InvariantId::Reachability, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("1 of 3 linearizable reads")), "{v:?}");
    o.probes.clear();
    assert!(matches!(verdict(InvariantId::Reachability, &model(), &o), Verdict::Fail(_)), "no probe is not a pass");
}

#[test]
fn durability_lost_or_changed_acknowledged_writes_are_definite() {
    let mut o = healthy();
    o.durability.as_mut().unwrap().read.clear();
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("1 of 1 acknowledged writes lost (k1)")), "{v:?}");
    let mut o = healthy();
    o.durability.as_mut().unwrap().read.insert("k1".into(), "other".into());
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("1 read back with a different value (k1)")), "{v:?}");
    // A failed read is not a loss, and may converge.
    let mut o = healthy();
    let d = o.durability.as_mut().unwrap();
    d.read.clear();
    d.read_error = Some("no leader".into());
    assert!(matches!(verdict(InvariantId::Durability, &model(), &o), Verdict::Fail(_)));
}

#[test]
fn invariant_names_round_trip_and_unknown_names_list_the_known_ones() {
    for id in InvariantId::ALL {
        assert_eq!(id.name().parse::<InvariantId>().unwrap(), id);
    }
    let err = "latency".parse::<InvariantId>().unwrap_err();
    assert!(err.contains("membership, members, quorum, consistency, reachability, durability"), "{err}");
}
