//! Each invariant: passes on a healthy observation, fails with a message that names the problem.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use shakedown_faults::{BackupId, MemberId, Model, Op, OutageMode, SiteId, Version};
use shakedown_history::format::{ReadAnswer, Request, WriteAnswer};
use shakedown_history::{History, ModelKind, Operation};
use shakedown_invariants::{
    all_serving, check_all, expect_write, known_defects, Ack, ApiObservation, ApiServerReady, CompactedGap, Durability, Expect,
    HistoryView, InvariantId, Inventory, Leader, LeaseRecord, Leases, ListedMember, LocalInventory, Marks, MemberStatus, Observation,
    Probe, Revoke, ServingSample, Unknown, Verdict, WatchEvent, WatchProgress, WatchSession, WatchStream,
};

fn model() -> Model {
    Model::new(3, 3, vec![Version::new(3, 4), Version::new(3, 5)], 1)
}

fn member(i: u32, leader: Option<u64>) -> MemberStatus {
    let leader = leader.map(Leader::Id);
    MemberStatus {
        name: format!("m{i}"),
        member: Some(MemberId(i)),
        reachable: true,
        leader,
        etcd_id: Some(100 + i as u64),
        revision: 10,
        raft_index: 20,
        applied_index: 20,
        raft_term: Some(2),
        revision_after: Some(10),
        settled: Some((10, 20)),
        version: Some("3.4.23".into()),
        hash: Some((10, 0xabcd)),
        hash_from: 0,
        error: None,
    }
}

fn healthy() -> Observation {
    Observation {
        members: (0..3).map(|i| member(i, Some(100))).collect(),
        member_list: Some((0..3).map(|i| ListedMember { id: Some(100 + i), name: format!("m{i}"), peer_urls: vec![] }).collect()),
        probes: vec![Probe { latency_ms: 2, error: None }; 3],
        durability: Some(Durability {
            acked: vec![Ack::put("k1", "v1", 5, 0)].into(),
            read: HashMap::from([("k1".to_string(), "v1".to_string())]),
            read_revision: 10,
            marks: Marks::default(),
            ..Durability::default()
        }),
        // One watch that saw the one acknowledged write.
        watches: Some(vec![WatchSession {
            name: "w0".into(),
            start_revision: 1,
            start_ack: 0,
            events: vec![WatchEvent {
                revision: 5,
                key: "k1".into(),
                value: Some("v1".into()),
                prev: None,
                response: 1,
                created: Some((5, 1)),
            }]
            .into(),
            ..WatchSession::default()
        }]),
        // One live lease with its key.
        leases: Some(Leases {
            records: vec![LeaseRecord {
                id: 7,
                ttl_ms: 60_000,
                granted_at_ms: 0,
                keys: vec!["l1".into()],
                revoke: Revoke::No,
                kept_alive_at_ms: 0,
            }],
            alive: [7].into(),
            read: BTreeMap::from([("l1".to_string(), 7)]),
            read_done_ms: 10,
            revoking: BTreeSet::new(),
            error: None,
        }),
        serving_samples: vec![ServingSample { at_ms: 0, serving: vec!["m0".into(), "m1".into(), "m2".into()], cluster_size: 3 }],
        quorum_throughout: true,
        samples_until_ms: 0,
        inventory: Some(Inventory::Local(inventory())),
        // The workload's one request: the put of k1 acknowledged at revision 5.
        history: Some(view(vec![op(0, 0, 10, put("k1", "v1", 5))])),
        api: None,
        app: None,
    }
}

fn view(ops: Vec<Operation>) -> HistoryView {
    HistoryView::of(History { model: ModelKind::Etcd, ops }, shakedown_invariants::linearizability::BOUND)
}

fn op(client: u64, call: u64, ret: u64, request: Request) -> Operation {
    Operation { client, member: None, epoch: 0, group: None, call, ret: Some(ret), request }
}

fn register_view(ops: Vec<Operation>) -> HistoryView {
    HistoryView::of(History { model: ModelKind::Register, ops }, shakedown_invariants::linearizability::BOUND)
}

/// A register write (`write`) of `value` or a read that returned it (`None`: absent).
fn reg(client: u64, call: u64, ret: u64, key: &str, value: Option<&str>, write: bool) -> Operation {
    use shakedown_history::format::{Done, RegisterRead, Scalar};
    let value = value.map(|v| Scalar::Str(v.into()));
    let request = match (write, value) {
        (true, Some(value)) => Request::Write { key: key.into(), value, answer: Some(Done {}) },
        (_, value) => Request::Read { key: key.into(), answer: Some(RegisterRead { value }) },
    };
    op(client, call, ret, request)
}

fn put(key: &str, value: &str, revision: i64) -> Request {
    Request::Put { key: key.into(), value: value.into(), answer: Some(WriteAnswer { revision }) }
}

fn get(key: &str, revision: i64, kv: Option<(&str, i64)>) -> Request {
    let kv = kv.map(|(v, m)| shakedown_history::format::Kv { value: v.into(), mod_revision: m, create_revision: None, version: None });
    Request::Get { key: key.into(), serializable: false, answer: Some(ReadAnswer { revision, kv }) }
}

/// Issue 28: a read that answers an older value than one acknowledged before it was sent is a
/// definite violation naming both requests; without a history the check is unobserved.
#[test]
fn linearizability_names_a_stale_read() {
    let mut o = healthy();
    assert_eq!(verdict(InvariantId::Linearizability, &model(), &o), Verdict::Pass);
    let mut ops = vec![op(0, 0, 10, put("k1", "v1", 5))];
    ops.push(op(1, 20, 30, put("k1", "v2", 6)));
    ops.push(op(2, 40, 50, get("k1", 6, Some(("v2", 6)))));
    o.history = Some(view(ops.clone()));
    assert_eq!(verdict(InvariantId::Linearizability, &model(), &o), Verdict::Pass);
    // Client 3 reads v1 after v2 was acknowledged.
    ops.push(op(3, 60, 70, get("k1", 5, Some(("v1", 5)))));
    o.history = Some(view(ops));
    let Verdict::Definite(m) = verdict(InvariantId::Linearizability, &model(), &o) else { panic!("a definite violation") };
    assert!(m.contains("a stale read") && m.contains("op 3 (client 3") && m.contains("op 1 (client 1"), "{m}");
    o.history = None;
    assert!(matches!(verdict(InvariantId::Linearizability, &model(), &o), Verdict::Unobserved(_)));
}

fn inventory() -> LocalInventory {
    let names: BTreeSet<String> = (0..3).map(|i| format!("m{i}")).collect();
    LocalInventory {
        processes: names.clone(),
        haproxies: 1,
        mounts: names.clone(),
        loop_devices: names.clone(),
        data_dirs: names,
        partition_rules: BTreeSet::new(),
        backups: BTreeSet::new(),
        loop_disks: true,
        apiservers: None,
    }
}

fn local_inv(o: &mut Observation) -> &mut LocalInventory {
    match o.inventory.as_mut() {
        Some(Inventory::Local(inv)) => inv,
        other => panic!("a local inventory, not {other:?}"),
    }
}

fn verdict(id: InvariantId, m: &Model, o: &Observation) -> Verdict {
    id.check(m, o)
}

/// Each invariant passes a healthy observation that holds its input — and only then: the same
/// invariant without its input is unobserved, never a pass.
#[test]
fn healthy_observation_passes_every_invariant() {
    use InvariantId::*;
    let etcd = [Membership, Leaks, Members, Quorum, Consistency, Reachability, Durability, Watch, Leases, Linearizability];
    let api = [ApiReachability, ApiDurability, ApiWatch, ApiLinearizability];
    let app = [AppReady, AppDurability, AppLinearizability];
    assert_eq!(etcd.len() + api.len() + app.len(), InvariantId::ALL.len(), "every invariant has a healthy observation here");
    assert!(check_all(&etcd, &model(), &healthy()).is_empty(), "{:?}", check_all(&etcd, &model(), &healthy()));
    assert!(check_all(&api, &model(), &with_api()).is_empty(), "{:?}", check_all(&api, &model(), &with_api()));
    assert!(check_all(&app, &app_model(), &app_obs()).is_empty(), "{:?}", check_all(&app, &app_model(), &app_obs()));
    // The healthy etcd observation has nothing for the API's or the application's invariants.
    for id in api.into_iter().chain(app) {
        assert!(
            matches!(verdict(id, &model(), &healthy()), Verdict::Unobserved(_)),
            "{id} without its input: {:?}",
            verdict(id, &model(), &healthy())
        );
    }
}

/// Issue 26: a check whose input is absent does not pass. With nothing observed, every invariant
/// whose input is absent is `Unobserved`, and none passes.
#[test]
fn an_invariant_without_its_input_is_unobserved() {
    let nothing = Observation::default();
    for id in InvariantId::ALL {
        let v = verdict(id, &model(), &nothing);
        assert!(!v.is_pass(), "{id} passed an empty observation");
    }
    // Those that need a part the observation does not have name it.
    for (id, what) in [
        (InvariantId::Leaks, "no inventory"),
        (InvariantId::Members, "no member statuses"),
        (InvariantId::Quorum, "no member statuses"),
        (InvariantId::Consistency, "no member statuses"),
        (InvariantId::Reachability, "no probe"),
        (InvariantId::Durability, "no read-back"),
        (InvariantId::Watch, "no watch sessions"),
        (InvariantId::Leases, "no lease records"),
        (InvariantId::ApiReachability, "no Kubernetes API"),
        (InvariantId::ApiDurability, "no Kubernetes API"),
        (InvariantId::ApiWatch, "no Kubernetes API"),
        (InvariantId::ApiLinearizability, "no Kubernetes API"),
        (InvariantId::AppReady, "no application"),
        (InvariantId::AppDurability, "no application"),
        (InvariantId::AppLinearizability, "no application"),
    ] {
        let v = verdict(id, &model(), &nothing);
        assert!(matches!(&v, Verdict::Unobserved(m) if m.contains(what)), "{id}: {v:?}");
    }
    // An application observation without the data workload's read-back.
    let mut o = app_obs();
    o.app.as_mut().unwrap().data = None;
    assert!(matches!(verdict(InvariantId::AppDurability, &app_model(), &o), Verdict::Unobserved(m) if m.contains("read-back")));
    o.app.as_mut().unwrap().history = None;
    assert!(matches!(verdict(InvariantId::AppLinearizability, &app_model(), &o), Verdict::Unobserved(m) if m.contains("no history")));
}

/// The engine's bring-up and after-healing rule: every member of the model serves.
#[test]
fn all_serving_names_the_members_not_serving() {
    assert_eq!(all_serving(&model(), &healthy()), Verdict::Pass);
    let mut o = healthy();
    o.members[1].reachable = false;
    assert!(matches!(all_serving(&model(), &o), Verdict::Fail(m) if m.contains("member(s) m1 not serving")));
}

#[test]
fn quorum_fails_on_two_leaders_and_on_no_leader() {
    let mut o = healthy();
    o.members[2].leader = Some(Leader::Id(102));
    let v = verdict(InvariantId::Quorum, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("2 different leaders")), "{v:?}");

    let mut o = healthy();
    o.members.iter_mut().for_each(|m| m.leader = None);
    let v = verdict(InvariantId::Quorum, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("no leader")), "{v:?}");
}

/// A leaderless cluster on etcd 3.4 is named as raft without pre-vote (docs/findings.md, finding
/// 3) with the members' terms; the same symptom on 3.5 names nothing: pre-vote is on there.
#[test]
fn a_leaderless_verdict_names_raft_without_pre_vote_on_3_4_only() {
    let mut o = healthy();
    o.members.iter_mut().for_each(|m| {
        m.leader = None;
        m.raft_term = Some(7);
    });
    for id in [InvariantId::Quorum, InvariantId::Members] {
        let v = verdict(id, &model(), &o);
        assert!(
            matches!(&v, Verdict::Fail(m) if m.contains("no leader") && m.contains("etcd-io/etcd#9333") && m.contains("m1 runs etcd 3.4.23") && m.contains("last applied entry (what etcd's status reports: campaigns that elected nobody do not show in it): m0 7, m1 7, m2 7")),
            "{id}: {v:?}"
        );
    }
    o.members.iter_mut().for_each(|m| m.version = Some("3.5.16".into()));
    for id in [InvariantId::Quorum, InvariantId::Members] {
        let v = verdict(id, &model(), &o);
        assert!(matches!(&v, Verdict::Fail(m) if m.contains("no leader") && !m.contains("pre-vote")), "{id}: {v:?}");
    }
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
    assert!(matches!(&v, Verdict::Fail(x) if x.contains("m1 answers although it is paused")), "{v:?}");
}

#[test]
fn membership_names_stale_and_missing_members() {
    let mut o = healthy();
    o.member_list.as_mut().unwrap().push(ListedMember { id: Some(0x99), name: "m7".into(), peer_urls: vec![] });
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
    o.members[1].raft_index = 21;
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("revision 10") && m.contains("00001234 on m1")),
        "every member applied revision 10: nothing can converge: {v:?}"
    );
    // Different revisions are not compared.
    o.members[1].hash = Some((11, 0x1234));
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass());
    // Nor hashes that begin at different compactions (m1 has applied one the others have not
    // yet: HashKV hashes only what a compaction left) ...
    o.members[1].hash = Some((10, 0x1234));
    o.members[1].hash_from = 7;
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass());
    // ... but members past the same compaction are.
    for m in &mut o.members {
        m.hash_from = 7;
    }
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("revision 10 (from the compaction at 7)")), "{v:?}");
}

/// etcd-io/etcd#13766 as seen on etcd 3.5.1 (docs/findings.md): every member at the same raft
/// index, one a revision short, its hash different at the common revision. The verdict names
/// each member's revision and raft index and says a replica diverged from the log; it is
/// definite (nothing in flight can change a history every member has applied).
#[test]
fn consistency_names_a_replica_that_diverged_from_the_log() {
    let mut o = healthy();
    for m in &mut o.members {
        (m.revision, m.revision_after, m.raft_index, m.applied_index, m.hash) =
            (36561, Some(36561), 36622, 36622, Some((36560, 0xbba9_2c70)));
    }
    (o.members[2].revision, o.members[2].revision_after, o.members[2].hash) = (36560, Some(36560), Some((36560, 0xd149_2f3d)));
    let v = verdict(InvariantId::Consistency, &model(), &o);
    let Verdict::Definite(m) = &v else { panic!("a divergence cannot converge: {v:?}") };
    assert!(m.contains("at revision 36560") && m.contains("d1492f3d on m2") && m.contains("bba92c70 on m0,m1"), "{m}");
    assert!(m.contains("m2 at revision 36560, raft index 36622") && m.contains("m0 at revision 36561, raft index 36622"), "{m}");
    assert!(m.contains("same raft index on every member: a replica diverged from the replicated log"), "{m}");
    assert!(!m.contains("13766"), "members on etcd 3.4.23 are not named as running the affected releases: {m}");
    // On an affected release the verdict names the known defect and the member running it.
    o.members[2].version = Some("3.5.1".into());
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("Known etcd defect: m2 runs etcd 3.5.1") && m.contains("etcd-io/etcd#13766")),
        "{v:?}"
    );
    o.members[2].version = Some("3.5.16".into());
    assert!(matches!(verdict(InvariantId::Consistency, &model(), &o), Verdict::Definite(m) if !m.contains("13766")), "3.5.16 has the fix");
    // Members at different raft indexes disagreeing is reported without that conclusion.
    o.members[2].raft_index = 36600;
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if !m.contains("diverged")), "{v:?}");
}

/// The stale store of docs/findings.md's design finding (a reattached member that served a stale store): a member whose raft applied index is ahead of
/// another's while its store (read after that index) is at a lower revision. A follower merely
/// behind (lower applied index, lower revision) is normal, however far behind.
#[test]
fn consistency_flags_a_store_behind_its_applied_index_without_a_lag_tolerance() {
    let mut o = healthy();
    for (m, (applied, rev)) in o.members.iter_mut().zip([(5000, 4000), (4990, 3990), (3000, 2000)]) {
        m.hash = None;
        (m.applied_index, m.revision, m.revision_after) = (applied, rev, Some(rev));
    }
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass(), "a follower 2,000 revisions behind that applied less is normal");
    // m2 applied past m1 (raft index 4995 > 4990), yet its store is at 3000 < m1's 3990.
    (o.members[2].applied_index, o.members[2].revision_after) = (4995, Some(3000));
    let v = verdict(InvariantId::Consistency, &model(), &o);
    let Verdict::Definite(m) = &v else { panic!("a store that skipped applied entries cannot catch up: {v:?}") };
    assert!(
        m.contains("m2 applied the log up to raft index 4995 but its store is at revision 3000") && m.contains("m0 at revision 4000"),
        "{m}"
    );
    assert!(!m.contains("13766"), "{m}");
    // The disk-reattach of docs/findings.md (finding 1, seen again): on etcd 3.5.1 the verdict
    // names the known defect.
    o.members[2].version = Some("3.5.1".into());
    assert!(
        matches!(verdict(InvariantId::Consistency, &model(), &o), Verdict::Definite(m) if m.contains("m2 runs etcd 3.5.1") && m.contains("etcd-io/etcd#13766"))
    );
    o.members[2].version = Some("3.4.23".into());
    // At the same applied index one revision apart is fine (the first answer may include the
    // entry being applied); two apart is not: one entry adds at most one revision (a restore
    // from mixed backups: every member at the same index, one at an older backup's revision).
    (o.members[2].applied_index, o.members[2].revision, o.members[2].revision_after) = (5000, 3999, Some(3999));
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass());
    (o.members[2].revision, o.members[2].revision_after) = (3998, Some(3998));
    assert!(
        matches!(verdict(InvariantId::Consistency, &model(), &o), Verdict::Definite(m) if m.contains("m2 applied the log up to raft index 5000 but its store is at revision 3998, behind m0 at revision 4000"))
    );
}

/// A member restored from an old snapshot under its own member id (tests/kube_etcd.rs): it
/// replays the log from the snapshot's revision on, so at the same applied index it is 40
/// revisions ahead of the two others. The pairwise rule names the pair; the verdict also says
/// which store is out of line.
#[test]
fn consistency_names_the_store_out_of_line_when_the_others_agree() {
    let mut o = healthy();
    for (m, rev) in o.members.iter_mut().zip([81, 121, 81]) {
        m.hash = None;
        (m.applied_index, m.raft_index, m.revision, m.revision_after, m.settled) = (100, 100, rev, Some(rev), Some((rev, 100)));
    }
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("At raft index 100, m0, m2 agree on revision 81 and m1 at revision 121 not: the store out of line is m1's")),
        "{v:?}"
    );
    // Two members, or three that all differ: no majority, nothing more said.
    o.members[2].settled = Some((101, 100));
    o.members[2].revision_after = Some(101);
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if !m.contains("out of line")), "{v:?}");
}

/// The divergence of issue 28 (etcd 3.5.1, etcd-io/etcd#13766): m0 at revision 968 and m2 at
/// 969, both at applied index 67. The one-revision tolerance of a single status answer lets it
/// pass; read at quiet points (two answers in a row agreeing) it is named, with no tolerance.
#[test]
fn consistency_at_quiet_points_names_a_one_revision_shift_between_members() {
    let mut o = healthy();
    for (m, rev) in o.members.iter_mut().zip([968, 969, 969]) {
        m.hash = None;
        (m.applied_index, m.revision, m.revision_after, m.settled) = (67, rev, Some(rev), None);
    }
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass(), "without quiet points one revision is tolerated");
    o.members[0].settled = Some((968, 67));
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass(), "one quiet member has nothing to be compared with");
    o.members[2].settled = Some((969, 67));
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("m0 and m2 applied the same log up to raft index 67 but their stores are at revisions 968 and 969: a replica diverged")
            && m.contains("two status answers in a row agreeing: m0 at revision 968, applied index 67, m2 at revision 969, applied index 67")),
        "{v:?}"
    );
    o.members[2].version = Some("3.5.1".into());
    assert!(matches!(verdict(InvariantId::Consistency, &model(), &o), Verdict::Definite(m) if m.contains("etcd-io/etcd#13766")));
    // More applied entries: at most one revision more per entry, never fewer revisions.
    o.members[2].settled = Some((970, 69));
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass(), "two entries, two revisions");
    o.members[2].settled = Some((968, 69));
    assert!(verdict(InvariantId::Consistency, &model(), &o).is_pass(), "two entries that wrote nothing (a compaction, a member change)");
    o.members[2].settled = Some((971, 69));
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("m2 is at revision 971 with raft index 69, 3 revisions ahead of m0 at revision 968 with raft index 67")),
        "{v:?}"
    );
    o.members[2].settled = Some((967, 69));
    let v = verdict(InvariantId::Consistency, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("m2 applied the log up to raft index 69 but its store is at revision 967, behind m0 at revision 968")),
        "{v:?}"
    );
}

#[test]
fn reachability_fails_on_any_failed_probe_when_the_service_should_be_up() {
    let mut o = healthy();
    o.probes[1] = Probe { latency_ms: 2001, error: Some("linearizable read: no answer within 2000ms".into()) };
    let v = verdict(InvariantId::Reachability, &model(), &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("1 of 3 linearizable reads")), "{v:?}");
    o.probes.clear();
    assert!(matches!(verdict(InvariantId::Reachability, &model(), &o), Verdict::Unobserved(_)), "no probe is not a pass");
}

#[test]
fn durability_lost_or_changed_acknowledged_writes_are_definite() {
    let mut o = healthy();
    o.durability.as_mut().unwrap().read.clear();
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("1 of 1 acknowledged writes lost (k1; the first is ack #0)") && !m.contains("13766")),
        "{v:?}"
    );
    // On etcd 3.5.0–3.5.2 the verdict points at the known defect as a possible cause.
    o.members[1].version = Some("3.5.1".into());
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("possibly the known etcd defect: m1 runs etcd 3.5.1") && m.contains("etcd-io/etcd#13766")),
        "{v:?}"
    );
    // A read-back from a diverged store: the transactions that can diverge one are named.
    o.durability.as_mut().unwrap().refused_write_txns = vec!["a transaction writing q".into()];
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("etcd-io/etcd#13766") && m.contains("etcd-io/etcd#18667")), "{v:?}");
    let mut o = healthy();
    o.durability.as_mut().unwrap().read.insert("k1".into(), "other".into());
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("1 read back with a value no acknowledged or in-doubt write explains (k1)")),
        "{v:?}"
    );
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
    assert_eq!((err.what.as_str(), err.given.as_str()), ("invariant", "latency"));
    assert!(err.to_string().contains("membership, leaks, members, quorum, consistency, reachability, durability, watch, leases"), "{err}");
}

#[test]
fn members_of_an_isolated_site_must_not_answer() {
    let mut m = model();
    m.apply(&Op::SiteOutage { site: SiteId(1), mode: OutageMode::Isolate }).unwrap();
    let v = verdict(InvariantId::Members, &m, &healthy());
    assert!(matches!(&v, Verdict::Fail(x) if x.contains("m1 answers although its site site1 is out (isolate)")), "{v:?}");
}

#[test]
fn a_member_whose_disk_was_detached_may_answer_or_not() {
    let mut m = model();
    m.apply(&Op::DiskDetach { member: MemberId(2) }).unwrap();
    assert!(verdict(InvariantId::Members, &m, &healthy()).is_pass());
    let mut o = healthy();
    o.members[2].reachable = false;
    local_inv(&mut o).processes.remove("m2");
    assert!(verdict(InvariantId::Members, &m, &o).is_pass());
    assert!(verdict(InvariantId::Leaks, &m, &o).is_pass(), "a dead member on a detached disk is no leak");
}

#[test]
fn leaks_name_what_is_left_behind_and_what_is_missing() {
    let m = model();
    let mut o = healthy();
    let inv = local_inv(&mut o);
    inv.partition_rules.insert("site1".into());
    inv.loop_devices.insert("m7".into());
    inv.processes.remove("m0");
    let v = verdict(InvariantId::Leaks, &m, &o);
    let msg = v.message().unwrap_or_default().to_string();
    assert!(!msg.contains("m0"), "a missing process is the members invariant's finding: {msg}");
    assert!(msg.contains("loop devices left behind: m7"), "{msg}");
    assert!(msg.contains("partition rules left behind: site1"), "{msg}");
}

#[test]
fn leaks_follow_outages_and_backups_in_the_model() {
    let mut m = model();
    m.apply(&Op::SiteOutage { site: SiteId(0), mode: OutageMode::Isolate }).unwrap();
    m.apply(&Op::Backup).unwrap();
    let mut o = healthy();
    assert!(!verdict(InvariantId::Leaks, &m, &o).is_pass(), "rule and backup file are expected");
    let inv = local_inv(&mut o);
    inv.partition_rules.insert("site0".into());
    inv.backups.insert("b0".into());
    assert!(verdict(InvariantId::Leaks, &m, &o).is_pass());
    // Power loss: the site's processes are gone, its disks stay.
    let mut m = model();
    m.apply(&Op::SiteOutage { site: SiteId(2), mode: OutageMode::PowerLoss }).unwrap();
    let mut o = healthy();
    assert!(matches!(verdict(InvariantId::Leaks, &m, &o), Verdict::Fail(x) if x.contains("etcd processes left behind: m2")));
    local_inv(&mut o).processes.remove("m2");
    assert!(verdict(InvariantId::Leaks, &m, &o).is_pass());
}

#[test]
fn plain_disks_expect_no_mounts() {
    let mut o = healthy();
    let inv = local_inv(&mut o);
    inv.loop_disks = false;
    assert!(matches!(verdict(InvariantId::Leaks, &model(), &o), Verdict::Fail(x) if x.contains("mounts left behind")));
    let inv = local_inv(&mut o);
    inv.mounts.clear();
    inv.loop_devices.clear();
    assert!(verdict(InvariantId::Leaks, &model(), &o).is_pass());
}

/// A backup (`B(id, start, end)`) or a restore (`R(id, start, end)`), in the order of the ops.
enum M {
    B(u32, usize, usize),
    R(u32, usize, usize),
}

/// Marks as a target records them: in op order.
fn marks(seq: &[M]) -> Marks {
    let mut m = Marks::default();
    for mark in seq {
        match *mark {
            M::B(b, s, e) => m.backup_taken(BackupId(b), s, e),
            M::R(b, s, e) => {
                m.restore_begins(BackupId(b), s);
                m.restore_ends(e);
            }
        }
    }
    m
}

#[test]
fn durability_expectations_follow_backups_and_restores() {
    use M::{B, R};
    // No restore: everything acknowledged must be there.
    assert_eq!(expect_write(5, 5, &Marks::default()), Expect::Present);
    // b0 taken while acks 10..12 came in; restored while acks 20..25 came in.
    let m = marks(&[B(0, 10, 12), R(0, 20, 25)]);
    assert_eq!(expect_write(9, 9, &m), Expect::Present);
    assert_eq!(expect_write(11, 11, &m), Expect::Either);
    assert_eq!(expect_write(15, 15, &m), Expect::Absent);
    // Sent while the snapshot was taken (at ack 11), acknowledged after it ended (ack 15; other
    // clients' writes came in between): it may be in the snapshot (seen in a nightly soak with 8
    // clients as a false "the restore did not restore").
    assert_eq!(expect_write(15, 11, &m), Expect::Either);
    assert_eq!(expect_write(15, 12, &m), Expect::Absent);
    assert_eq!(expect_write(22, 22, &m), Expect::Either);
    assert_eq!(expect_write(30, 30, &m), Expect::Present);
    // A second backup after the restore, then a restore of it: writes gone by the first
    // restore stay gone; writes after the first restore and before b1 are there.
    let m = marks(&[B(0, 10, 12), R(0, 20, 25), B(1, 40, 41), R(1, 50, 55)]);
    assert_eq!(expect_write(15, 15, &m), Expect::Absent);
    assert_eq!(expect_write(30, 30, &m), Expect::Present);
    assert_eq!(expect_write(45, 45, &m), Expect::Absent);
    assert_eq!(expect_write(9, 9, &m), Expect::Present);
    // Restoring the older b0 again brings back only what b0 had.
    let m = marks(&[B(0, 10, 12), R(0, 20, 25), B(1, 40, 41), R(0, 50, 55)]);
    assert_eq!(expect_write(30, 30, &m), Expect::Absent);
    assert_eq!(expect_write(5, 5, &m), Expect::Present);
}

/// Ties (no write acknowledged between a backup, a restore and the next backup) end.
#[test]
fn durability_expectations_with_ties_terminate() {
    use M::{B, R};
    let m = marks(&[B(0, 100, 100), R(0, 100, 100), B(1, 100, 100), R(1, 100, 100)]);
    assert_eq!(expect_write(50, 50, &m), Expect::Present);
    assert_eq!(expect_write(100, 100, &m), Expect::Present);
}

/// Issue 26, the nightly tier's false alarm (`run --seed 11 --steps 40 --profile nightly`, red at
/// step 28, `restore(b5)`: "343 written after the restored backup are still there"): no write was
/// acknowledged between backup b5 (step 18) and the end of `restore(b0)` (step 21), so the
/// restore's end count equals b5's start count. The restore came after b5 in op order: b5 holds
/// what was written before it, b0's restore notwithstanding.
#[test]
fn durability_expectations_order_marks_by_op_not_by_ack_count() {
    use M::{B, R};
    let seq = [B(0, 1, 2), B(5, 528, 529), B(6, 528, 529), R(0, 528, 528), R(5, 7206, 7209)];
    let m = marks(&seq);
    // Acknowledged at #100, long before b5: in b5, so there after restore(b5).
    assert_eq!(expect_write(100, 100, &m), Expect::Present);
    // Acknowledged between restore(b0) and restore(b5): not in b5.
    assert_eq!(expect_write(1000, 1000, &m), Expect::Absent);
    // Written before b0: in b0 and in b5 alike.
    assert_eq!(expect_write(0, 0, &m), Expect::Present);
    // Had restore(b0) come before b5 (same counts, other op order), #100 would be gone: b5 then
    // holds b0's data plus what came after the restore.
    let m = marks(&[B(0, 1, 2), R(0, 528, 528), B(5, 528, 529), B(6, 528, 529), R(5, 7206, 7209)]);
    assert_eq!(expect_write(100, 100, &m), Expect::Absent);
    assert_eq!(expect_write(1, 1, &m), Expect::Either);
}

#[test]
fn durability_after_a_restore_flags_lost_and_resurrected_writes() {
    let mut o = healthy();
    let d = o.durability.as_mut().unwrap();
    d.acked = (0..6).map(|i| Ack::put(format!("k{i}"), format!("v{i}"), i as i64 + 1, i)).collect::<Vec<_>>().into();
    d.read_revision = 0;
    d.marks = marks(&[M::B(0, 2, 2), M::R(0, 4, 4)]);
    // k0,k1 before the backup; k2,k3 after it (gone); k4,k5 after the restore.
    d.read = [0, 1, 4, 5].iter().map(|i| (format!("k{i}"), format!("v{i}"))).collect();
    assert!(verdict(InvariantId::Durability, &model(), &o).is_pass());
    let d = o.durability.as_mut().unwrap();
    d.read.insert("k3".into(), "v3".into());
    d.read.remove("k0");
    let v = verdict(InvariantId::Durability, &model(), &o);
    let msg = v.message().unwrap_or_default();
    assert!(
        msg.contains(
            "1 of 6 acknowledged writes lost (k0; the first is ack #0; b0 taken during acks #2..#2, b0 restored during acks #4..#4)"
        ) && msg.contains("the restore did not restore"),
        "{msg}"
    );
}

/// The acknowledged history is kept in shared chunks: a snapshot iterates the same writes, in
/// order, across chunk boundaries.
#[test]
fn acked_history_in_chunks_iterates_in_order() {
    use std::sync::Arc;
    let w = |i: usize| Ack::put(format!("k{i}"), format!("v{i}"), i as i64, i);
    let sealed: Vec<Arc<Vec<Ack>>> = vec![Arc::new((0..3).map(w).collect()), Arc::new((3..5).map(w).collect())];
    let a = shakedown_invariants::Acked::from_chunks(&sealed, &[w(5)]);
    assert_eq!(a.len(), 6);
    assert_eq!(a.iter().cloned().collect::<Vec<_>>(), (0..6).map(w).collect::<Vec<_>>());
    assert!(shakedown_invariants::Acked::from_chunks(&[], &[]).is_empty());
}

/// A target that cannot name the leader (the kube target) reports `Leader::Unnamed`: quorum
/// counts those members as seeing it; members that see none still fail.
#[test]
fn an_unnamed_leader_counts_for_quorum_and_no_leader_still_fails() {
    let mut o = healthy();
    o.members.iter_mut().for_each(|m| m.leader = Some(Leader::Unnamed));
    assert_eq!(verdict(InvariantId::Quorum, &model(), &o), Verdict::Pass);
    o.members[0].leader = None;
    o.members[1].leader = None;
    assert!(matches!(verdict(InvariantId::Quorum, &model(), &o), Verdict::Fail(m) if m.contains("only 1 healthy voting members")));
    o.members[2].leader = None;
    assert!(matches!(verdict(InvariantId::Quorum, &model(), &o), Verdict::Fail(m) if m.contains("no leader")));
}

fn ack(key: &str, value: Option<&str>, revision: i64, start: usize) -> Ack {
    Ack { key: key.into(), value: value.map(str::to_string), revision, start }
}

/// Durability over the history: per key, the last acknowledged write in revision order (not
/// acknowledgement order) must be reflected; a delete means absent; a write acknowledged above
/// the read's revision is not visible yet; a write of unknown outcome may or may not be there.
#[test]
fn durability_judges_each_key_by_its_last_acknowledged_write_in_revision_order() {
    let mut o = healthy();
    let d = o.durability.as_mut().unwrap();
    // k1: v1@5, then v2@8 acknowledged before v1's ack was recorded (two clients); k2 created
    // and deleted; k3 updated at revision 12, after the read at 10.
    d.acked = vec![
        ack("k1", Some("v2"), 8, 0),
        ack("k1", Some("v1"), 5, 0),
        ack("k2", Some("x"), 6, 1),
        ack("k2", None, 7, 2),
        ack("k3", Some("a"), 4, 0),
        ack("k3", Some("b"), 12, 4),
    ]
    .into();
    d.read = HashMap::from([("k1".into(), "v2".into()), ("k3".into(), "a".into())]);
    assert_eq!(verdict(InvariantId::Durability, &model(), &o), Verdict::Pass);
    let d = o.durability.as_mut().unwrap();
    d.read.insert("k1".into(), "v1".into());
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("1 read back with a value no acknowledged or in-doubt write explains (k1)")),
        "a lost update: {v:?}"
    );
    let d = o.durability.as_mut().unwrap();
    d.read.insert("k1".into(), "v2".into());
    d.read.insert("k2".into(), "x".into());
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("1 deleted (acknowledged) but present again (k2)")), "{v:?}");
    // An update of unknown outcome sent after the delete was acknowledged explains it.
    let d = o.durability.as_mut().unwrap();
    d.unknown = vec![Unknown { key: "k2".into(), value: Some("x".into()), start: 3, any_time: false }];
    assert_eq!(verdict(InvariantId::Durability, &model(), &o), Verdict::Pass);
    // Sent before the delete it could not have applied after it (its compare would fail)...
    o.durability.as_mut().unwrap().unknown[0].start = 1;
    assert!(!verdict(InvariantId::Durability, &model(), &o).is_pass());
    // ...unless it was a create, which may apply after any delete, or a write no compare
    // guards (the kv workload's: a proposal still queued when the client gave up may apply
    // after any later write).
    o.durability.as_mut().unwrap().unknown[0].any_time = true;
    assert_eq!(verdict(InvariantId::Durability, &model(), &o), Verdict::Pass);
    // A lost create.
    let d = o.durability.as_mut().unwrap();
    d.unknown.clear();
    d.read.remove("k2");
    d.read.remove("k1");
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("1 of 6 acknowledged writes lost (k1;")), "{v:?}");
}

#[test]
fn durability_reports_inconsistent_paginated_reads() {
    let mut o = healthy();
    o.durability.as_mut().unwrap().list_anomalies = vec!["list at revision 7: key k1 has mod revision 9".into()];
    let v = verdict(InvariantId::Durability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("paginated read at a pinned revision was inconsistent: list at revision 7")),
        "{v:?}"
    );
}

fn session(events: Vec<WatchEvent>) -> WatchSession {
    WatchSession { name: "w0".into(), start_revision: 5, start_ack: 0, events: events.into(), resumptions: 1, ..WatchSession::default() }
}

fn event(revision: i64, key: &str, value: Option<&str>, prev: Option<&str>) -> WatchEvent {
    WatchEvent {
        revision,
        key: key.into(),
        value: value.map(str::to_string),
        prev: prev.map(str::to_string),
        response: revision as u64,
        created: None,
    }
}

/// A delete at exactly a compaction's revision that a stream from that revision never delivers
/// is etcd-io/etcd#18089 on a release that has it (named, not a failure), a missing write on one
/// that does not; a missing delete at any other revision is missing everywhere.
#[test]
fn watch_names_a_tombstone_removed_by_a_compaction_to_its_revision() {
    let mut o = healthy();
    // /o/a written at 5 and deleted at 6, a compaction asked for at 6, /o/b written at 7.
    o.durability.as_mut().unwrap().acked = vec![ack("/o/a", Some("1"), 5, 0), ack("/o/a", None, 6, 1), ack("/o/b", Some("x"), 7, 2)].into();
    let put = |rev, key: &str, value: &str| WatchEvent { created: Some((rev, 1)), ..event(rev, key, Some(value), None) };
    // Told that revision 5 was compacted, the stream resumed at 6 and went on from 7.
    let s = |version: &str, compactions: Vec<i64>| WatchSession {
        range: Some("/o/".into()),
        streams: vec![WatchStream { first: 0, member: "m1".into(), version: Some(version.into()) }],
        compacted: vec![CompactedGap { from: 5, to: 6, at: 0 }],
        compactions,
        ..session(vec![put(7, "/o/b", "x")])
    };
    let judge = |o: &mut Observation, s: WatchSession| {
        o.watches = Some(vec![s]);
        verdict(InvariantId::Watch, &model(), o)
    };
    assert_eq!(judge(&mut o, s("3.4.23", vec![6])), Verdict::Pass);
    let known = known_defects(&[InvariantId::Watch], &o);
    assert_eq!(known.len(), 1, "{known:?}");
    assert_eq!(known[0].defect, "etcd-io/etcd#18089");
    assert!(
        known[0]
            .message
            .starts_with("w0: the delete of /o/a acknowledged at revision 6, the revision a compaction was asked for, was never delivered"),
        "{known:?}"
    );
    assert_eq!(judge(&mut o, s("3.5.1", vec![6])), Verdict::Pass, "3.5.1 has it too");
    // 3.5.16 keeps the tombstone: the same stream missed a write.
    let v = judge(&mut o, s("3.5.16", vec![6]));
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("1 acknowledged write(s) never delivered") && m.contains("revision 6 (/o/a)")),
        "{v:?}"
    );
    // No compaction at that revision: missing on every release.
    let v = judge(&mut o, s("3.4.23", vec![5]));
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("revision 6 (/o/a)")), "{v:?}");
}

/// The same defect when the delete shares its revision with another write of one transaction:
/// the compaction keeps the put's event, so the stream delivers the revision without the delete.
/// Found by the `failpoints` tier compacting every 2 s (seed 2002, a transaction deleting one key
/// and putting another, a compaction to exactly its revision on 3.4.23), which `watch` had
/// called a divergence ("delivered as the put but the write acknowledged at it was the delete").
#[test]
fn watch_names_a_removed_tombstone_beside_its_transactions_other_write() {
    let mut o = healthy();
    // /o/a written at 5; at 6 one transaction deletes /o/a and puts /o/c; a compaction to 6.
    o.durability.as_mut().unwrap().acked =
        vec![ack("/o/a", Some("1"), 5, 0), ack("/o/a", None, 6, 1), ack("/o/c", Some("y"), 6, 1), ack("/o/b", Some("x"), 7, 2)].into();
    let put = |rev, key: &str, value: &str| WatchEvent { created: Some((rev, 1)), ..event(rev, key, Some(value), None) };
    let s = |version: &str, at_6: &str| WatchSession {
        range: Some("/o/".into()),
        streams: vec![WatchStream { first: 0, member: "m1".into(), version: Some(version.into()) }],
        compacted: vec![CompactedGap { from: 5, to: 6, at: 0 }],
        compactions: vec![6],
        ..session(vec![put(6, at_6, "y"), put(7, "/o/b", "x")])
    };
    let judge = |o: &mut Observation, s: WatchSession| {
        o.watches = Some(vec![s]);
        verdict(InvariantId::Watch, &model(), o)
    };
    assert_eq!(judge(&mut o, s("3.4.23", "/o/c")), Verdict::Pass);
    let known = known_defects(&[InvariantId::Watch], &o);
    assert_eq!(known.len(), 1, "{known:?}");
    assert_eq!(known[0].defect, "etcd-io/etcd#18089");
    // On a release without the defect the delete is missing, said as such.
    let v = judge(&mut o, s("3.5.16", "/o/c"));
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("1 acknowledged write(s) never delivered") && m.contains("revision 6 (/o/a)")),
        "{v:?}"
    );
    // A key no write acknowledged at 6 delivered at 6 (a write of another transaction than the
    // acknowledged one): still a failure on a release with the defect.
    let v = judge(&mut o, s("3.4.23", "/o/z"));
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("revision 6 delivered /o/z")), "{v:?}");
    o.durability.as_mut().unwrap().acked = vec![
        ack("/o/z", Some("y"), 4, 0),
        ack("/o/a", Some("1"), 5, 0),
        ack("/o/a", None, 6, 1),
        ack("/o/c", Some("y"), 6, 1),
        ack("/o/b", Some("x"), 7, 2),
    ]
    .into();
    let v = judge(&mut o, s("3.4.23", "/o/z"));
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("revision 6 delivered as /o/z")), "{v:?}");
}

/// A watch must deliver every acknowledged write up to how far it got, once, in order, with the
/// `prev_kv` its own earlier events imply; an explicit compaction excuses what it covers.
#[test]
fn watch_catches_gaps_reordering_and_wrong_prev_kv() {
    let mut o = healthy();
    o.durability.as_mut().unwrap().acked = vec![
        ack("a", Some("1"), 5, 0),
        ack("b", Some("x"), 6, 0),
        ack("a", Some("2"), 7, 1),
        ack("a", None, 8, 2),
        ack("c", Some("z"), 9, 3),
    ]
    .into();
    let good = vec![
        event(5, "a", Some("1"), None),
        event(6, "b", Some("x"), None),
        event(7, "a", Some("2"), Some("1")),
        event(8, "a", None, Some("2")),
    ];
    o.watches = Some(vec![session(good.clone())]);
    assert_eq!(verdict(InvariantId::Watch, &model(), &o), Verdict::Pass, "revision 9 is beyond what the stream delivered: not yet due");
    // A gap: revision 6 skipped, 7 delivered.
    let mut gap = good.clone();
    gap.remove(1);
    o.watches = Some(vec![session(gap)]);
    let v = verdict(InvariantId::Watch, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("w0: 1 acknowledged write(s) never delivered though the stream went past them to revision 8: revision 6 (b)")),
        "{v:?}"
    );
    // A compaction declared elsewhere does not excuse it.
    o.watches.as_mut().unwrap()[0].compacted = vec![shakedown_invariants::CompactedGap { from: 2, to: 5, at: 0 }];
    assert!(matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m) if m.contains("revision 6 (b)")));
    // Declared compaction covers it: the stream resumed at 6 was told history below 7 is gone.
    o.watches.as_mut().unwrap()[0].compacted = vec![shakedown_invariants::CompactedGap { from: 6, to: 7, at: 1 }];
    assert_eq!(verdict(InvariantId::Watch, &model(), &o), Verdict::Pass);
    // Twice.
    let mut twice = good.clone();
    twice.insert(2, event(6, "b", Some("x"), None));
    o.watches = Some(vec![session(twice)]);
    assert!(
        matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m) if m.contains("delivered revision 6 (b) after revision 6"))
    );
    // prev_kv that contradicts the stream.
    let mut prev = good.clone();
    prev[2].prev = Some("0".into());
    o.watches = Some(vec![session(prev)]);
    assert!(
        matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m) if m.contains("came with prev_kv \"0\" but the stream's previous event for the key says \"1\""))
    );
    // An update without its prev_kv: a wrong previous value, unless a compaction at or above its
    // revision had been requested (etcd-io/etcd#10681: reported by name, not a failure).
    let mut missing = good.clone();
    missing[2].prev = None;
    missing[0].created = Some((5, 1));
    missing[2].created = Some((5, 2));
    o.watches = Some(vec![session(missing.clone())]);
    assert!(matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m) if m.contains("came with prev_kv (deleted)")));
    assert!(known_defects(&[InvariantId::Watch], &o).is_empty());
    o.watches.as_mut().unwrap()[0].compactions = vec![6];
    assert!(matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(_)), "a compaction below its revision explains nothing");
    o.watches.as_mut().unwrap()[0].compactions = vec![7];
    assert_eq!(verdict(InvariantId::Watch, &model(), &o), Verdict::Pass);
    let known = known_defects(&[InvariantId::Watch], &o);
    assert!(known.len() == 1 && known[0].defect == "etcd-io/etcd#10681", "{known:?}");
    // The first event of a key in the session, an update (create revision below it) without
    // prev_kv: the same.
    let mut first = vec![event(7, "a", Some("2"), None)];
    first[0].created = Some((3, 4));
    let mut s = session(first);
    s.start_revision = 7;
    o.watches = Some(vec![s]);
    assert!(matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m) if m.contains("create revision 3, version 4")));
    o.watches.as_mut().unwrap()[0].compactions = vec![9];
    assert_eq!(verdict(InvariantId::Watch, &model(), &o), Verdict::Pass);
    // The wrong value at a revision.
    let mut wrong = good;
    wrong[1].value = Some("y".into());
    o.watches = Some(vec![session(wrong)]);
    assert!(
        matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m) if m.contains("revision 6 delivered as b = \"y\" but the write acknowledged at it was b = \"x\"") && !m.contains("#18667"))
    );
    // A diverged store shows as another write at an acknowledged revision: the transactions that
    // can make one (etcd-io/etcd#18667) are named beside it, refused or unanswered.
    let d = o.durability.as_mut().unwrap();
    d.unanswered_compacted_txns = vec!["a transaction writing q with a range at revision 1, unanswered".into()];
    assert!(matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m)
        if m.contains("delivered as b") && m.contains("1 transaction(s) with writes and a range at a revision since compacted that got no answer") && m.contains("etcd-io/etcd#18667")));
    o.durability.as_mut().unwrap().refused_write_txns = vec!["a transaction writing r".into()];
    assert!(matches!(verdict(InvariantId::Watch, &model(), &o), Verdict::Definite(m)
        if m.contains("1 transaction(s) with writes that a member refused") && m.contains("and 1 more with such a range that got no answer")));
}

/// The rest of etcd's watch guarantees: filtered by the range, atomic responses, the create
/// revision and version each put implies, nothing no client wrote, and progress notifications
/// never ahead of the events — the early one named as etcd-io/etcd#15220 on a release that has it.
#[test]
fn watch_enforces_range_atomicity_creation_origin_and_progress() {
    let mut o = healthy();
    o.durability.as_mut().unwrap().acked =
        vec![ack("/o/a", Some("1"), 5, 0), ack("/o/b", Some("x"), 6, 0), ack("/o/a", Some("2"), 7, 1), ack("/o/a", None, 8, 2)].into();
    let put = |rev, key: &str, value: &str, prev: Option<&str>, created: (i64, i64)| WatchEvent {
        created: Some(created),
        ..event(rev, key, Some(value), prev)
    };
    let good = vec![
        put(5, "/o/a", "1", None, (5, 1)),
        put(6, "/o/b", "x", None, (6, 1)),
        put(7, "/o/a", "2", Some("1"), (5, 2)),
        event(8, "/o/a", None, Some("2")),
    ];
    let watched = |events: Vec<WatchEvent>| WatchSession {
        range: Some("/o/".into()),
        streams: vec![WatchStream { first: 0, member: "m1".into(), version: None }],
        ..session(events)
    };
    let judge = |o: &mut Observation, s: WatchSession| {
        o.watches = Some(vec![s]);
        verdict(InvariantId::Watch, &model(), o)
    };
    assert_eq!(judge(&mut o, watched(good.clone())), Verdict::Pass);
    let definite = |v: &Verdict, says: &str| matches!(v, Verdict::Definite(m) if m.contains(says));

    // Outside the range.
    let mut outside = good.clone();
    outside[1].key = "/other/b".into();
    let v = judge(&mut o, watched(outside));
    assert!(definite(&v, "w0 (on m1): revision 6 delivered /other/b, outside the watched range \"/o/\""), "{v:?}");

    // One revision's events in two responses (a two-key transaction at revision 6).
    o.durability.as_mut().unwrap().unknown.push(Unknown { key: "/o/c".into(), value: Some("y".into()), start: 0, any_time: true });
    let mut together = good.clone();
    together.insert(2, WatchEvent { response: 6, ..put(6, "/o/c", "y", None, (6, 1)) });
    assert_eq!(judge(&mut o, watched(together.clone())), Verdict::Pass, "two keys at one revision in one response");
    together[2].response = 99;
    let v = judge(&mut o, watched(together));
    assert!(definite(&v, "revision 6 split across two responses"), "{v:?}");

    // A create that says it is an update, an update that says it is a create, a version skipped.
    for (i, created, says) in [
        (0, (4, 2), "revision 5 (/o/a) came with create revision 4, version 2 (is_create false) but the key's history implies create revision 5, version 1"),
        (2, (7, 1), "revision 7 (/o/a) came with create revision 7, version 1 (is_create true) but the key's history implies create revision 5, version 2"),
        (2, (5, 3), "revision 7 (/o/a) came with create revision 5, version 3"),
    ] {
        let mut wrong = good.clone();
        wrong[i].created = Some(created);
        let v = judge(&mut o, watched(wrong));
        assert!(definite(&v, says), "{v:?}");
    }
    // The first event of a key with a prev_kv is an update whose creation the session did not see.
    let first_update = vec![put(7, "/o/a", "2", Some("1"), (5, 2))];
    let mut s = watched(first_update.clone());
    s.start_revision = 7;
    assert_eq!(judge(&mut o, s.clone()), Verdict::Pass);
    s.events = vec![put(7, "/o/a", "2", Some("1"), (7, 1))].into();
    assert!(definite(&judge(&mut o, s), "implies an update"));

    // A value no client wrote, within what the writes read cover; above them it may be a write
    // sent after.
    let mut phantom = good.clone();
    phantom[1].value = Some("ghost".into());
    let v = judge(&mut o, watched(phantom));
    assert!(definite(&v, "revision 6 delivered /o/b = \"ghost\", which no client wrote (event #1, from m1)"), "{v:?}");
    let mut later = good.clone();
    later.push(put(9, "/o/d", "sent-after", None, (9, 1)));
    assert_eq!(judge(&mut o, watched(later)), Verdict::Pass);
    // After a restore the numbering starts again from the backup's: the revisions acknowledged
    // before it say nothing of what the new numbering covers (seed 11 of the 3.4 soak).
    let mut restored = o.clone();
    let d = restored.durability.as_mut().unwrap();
    d.marks.backup_taken(BackupId(0), 0, 0);
    d.marks.restore_begins(BackupId(0), 4);
    d.marks.restore_ends(4);
    let mut s = watched(vec![put(3, "/o/e", "sent-after-the-restore", None, (3, 1))]);
    (s.start_revision, s.start_ack) = (3, 4);
    assert_eq!(judge(&mut restored, s), Verdict::Pass);

    // Progress: at revision 6 after two events is honest; at 7 after two events, with revision 7
    // delivered after it, is early — and named on etcd 3.4.23, not on 3.5.16.
    let with_progress =
        |revision, delivered| WatchSession { progress: vec![WatchProgress { revision, delivered }], ..watched(good.clone()) };
    assert_eq!(judge(&mut o, with_progress(6, 2)), Verdict::Pass);
    assert!(known_defects(&[InvariantId::Watch], &o).is_empty());
    // On etcd 3.4.23 (every member of `healthy`) the early one is the known defect: named, every
    // occurrence, not a failure of the run.
    assert_eq!(judge(&mut o, with_progress(7, 2)), Verdict::Pass);
    let known = known_defects(&[InvariantId::Watch], &o);
    assert_eq!(known.len(), 1, "{known:?}");
    assert_eq!((known[0].invariant, known[0].defect.as_str()), (InvariantId::Watch, "etcd-io/etcd#15220"));
    assert!(
        known[0].message.starts_with("w0: a progress notification at revision 7 (after event #2) promised every event up to it, but revision 7 (/o/a) came after it — m1 runs etcd 3.4.23"),
        "{known:?}"
    );
    assert!(known_defects(&[InvariantId::Durability], &o).is_empty(), "only for the invariants checked");
    // On a release with the fix it is a violation, naming the member.
    o.members[1].version = Some("3.5.16".into());
    let v = judge(&mut o, with_progress(7, 2));
    assert!(definite(&v, "came after it (sent by m1)") && !definite(&v, "15220"), "{v:?}");
    assert!(known_defects(&[InvariantId::Watch], &o).is_empty());
    // The release the member ran when it served the stream counts (it was upgraded since, or
    // replaced and gone).
    let mut then = with_progress(7, 2);
    then.streams[0].version = Some("3.4.23".into());
    assert_eq!(judge(&mut o, then), Verdict::Pass);
    assert_eq!(known_defects(&[InvariantId::Watch], &o).len(), 1);
    // An acknowledged write at or below the promise, never delivered before the session ended.
    let mut cut = with_progress(8, 2);
    cut.events = good[..2].to_vec().into();
    let v = judge(&mut o, cut);
    assert!(
        definite(&v, "a progress notification at revision 8 promised every event up to it, but the write acknowledged at revision 7 (/o/a) had not been delivered (the stream had reached revision 6)"),
        "{v:?}"
    );
    // A known defect excuses only itself: a gap in the same session still fails.
    let mut both = with_progress(7, 2);
    both.streams[0].version = Some("3.4.23".into());
    both.events = vec![good[0].clone(), good[2].clone(), good[3].clone()].into();
    both.progress[0].delivered = 1;
    let v = judge(&mut o, both);
    assert!(definite(&v, "never delivered"), "{v:?}");
    // A revision delivered again fails on every release; on one with etcd-io/etcd#15271 (a
    // member back through the leader's snapshot replays its watches) the verdict names it.
    let mut again = good.clone();
    again.insert(3, good[2].clone());
    for (version, named) in [("3.4.23", true), ("3.5.16", false)] {
        let mut s = watched(again.clone());
        s.streams[0].version = Some(version.into());
        let v = judge(&mut o, s);
        assert!(definite(&v, "delivered revision 7 (/o/a) after revision 7: out of order or twice"), "{v:?}");
        assert_eq!(definite(&v, "etcd-io/etcd#15271"), named, "{version}: {v:?}");
    }
}

fn lease(id: i64, keys: &[&str], revoke: Revoke) -> LeaseRecord {
    LeaseRecord { id, ttl_ms: 3000, granted_at_ms: 1000, keys: keys.iter().map(|k| k.to_string()).collect(), revoke, kept_alive_at_ms: 0 }
}

/// Keys of a gone lease are gone; keys of a lease not yet due are there; a lease is not gone
/// before its TTL unless revoked.
#[test]
fn leases_catch_keys_outliving_their_lease_and_leases_gone_early() {
    let mut o = healthy();
    let alive = Leases {
        records: vec![lease(1, &["l/1/0", "l/1/1"], Revoke::No), lease(2, &["l/2/0"], Revoke::Acked)],
        alive: [1].into(),
        read: [("l/1/0".to_string(), 1), ("l/1/1".to_string(), 1)].into(),
        read_done_ms: 2000,
        revoking: [2].into(),
        error: None,
    };
    o.leases = Some(alive.clone());
    assert_eq!(verdict(InvariantId::Leases, &model(), &o), Verdict::Pass);
    // A revoked lease's key still there.
    o.leases.as_mut().unwrap().read.insert("l/2/0".into(), 2);
    assert!(
        matches!(verdict(InvariantId::Leases, &model(), &o), Verdict::Definite(m) if m.contains("lease 2 is gone (revoked) but 1 of its keys are still there (l/2/0)"))
    );
    // A key written without its lease.
    let mut l = alive.clone();
    l.read.insert("l/1/1".into(), 0);
    o.leases = Some(l);
    assert!(
        matches!(verdict(InvariantId::Leases, &model(), &o), Verdict::Definite(m) if m.contains("1 acknowledged key(s) of live lease 1 missing or attached elsewhere (l/1/1"))
    );
    // Gone 1 s into a 3 s TTL without a revoke.
    let mut l = alive.clone();
    l.alive.clear();
    l.read.clear();
    o.leases = Some(l.clone());
    assert!(
        matches!(verdict(InvariantId::Leases, &model(), &o), Verdict::Definite(m) if m.contains("lease 1 (TTL 3000 ms, granted 1000 ms before the read) is gone before its TTL ran out"))
    );
    // Unless a revoke was sent before the read returned.
    l.revoking.insert(1);
    o.leases = Some(l.clone());
    assert_eq!(verdict(InvariantId::Leases, &model(), &o), Verdict::Pass);
    l.revoking.remove(&1);
    // After its TTL it may be gone.
    l.read_done_ms = 4100;
    o.leases = Some(l.clone());
    assert_eq!(verdict(InvariantId::Leases, &model(), &o), Verdict::Pass);
    // Unless a keep-alive etcd answered was sent since: due again a TTL after it.
    l.records[0].kept_alive_at_ms = 3000;
    o.leases = Some(l.clone());
    assert!(
        matches!(verdict(InvariantId::Leases, &model(), &o), Verdict::Definite(m) if m.contains("lease 1 (TTL 3000 ms, granted 3100 ms before the read, kept alive 1100 ms before the read) is gone before its TTL ran out")),
        "{:?}",
        verdict(InvariantId::Leases, &model(), &o)
    );
    l.read_done_ms = 6100;
    o.leases = Some(l);
    assert_eq!(verdict(InvariantId::Leases, &model(), &o), Verdict::Pass);
}

fn apiserver(i: u32, answered: bool, ready: bool) -> ApiServerReady {
    ApiServerReady {
        name: format!("m{i}-apiserver"),
        member: Some(MemberId(i)),
        answered,
        ready,
        detail: (!ready).then(|| "[-]etcd failed".to_string()),
    }
}

fn with_api() -> Observation {
    let mut o = healthy();
    o.api = Some(ApiObservation {
        durability: o.durability.clone(),
        watches: vec![],
        endpoint: vec![Probe { latency_ms: 3, error: None }; 6],
        apiservers: (0..3).map(|i| apiserver(i, true, true)).collect(),
        history: Some(view(vec![op(0, 0, 10, txn("sd-0-1", 0, "0-1", true, 5)), op(LIST, 20, 30, get("sd-0-1", 7, Some(("0-1", 5))))])),
    });
    o
}

/// The client id of the checks' LISTs in an API history.
const LIST: u64 = 1_000_000;

/// A write guarded by a resourceVersion (0: a create), as the API workload records it.
fn txn(key: &str, if_mod_revision: i64, value: &str, succeeded: bool, revision: i64) -> Request {
    Request::Txn {
        key: key.into(),
        if_mod_revision,
        then: shakedown_history::format::Then::Put(value.into()),
        answer: Some(shakedown_history::format::TxnAnswer { succeeded, revision, kv: None }),
    }
}

/// api-linearizability: the API workload's creates and guarded updates and the checks' LISTs,
/// judged by etcd's model over resourceVersions. An update acknowledged against a
/// resourceVersion the object had already moved past (a lost update), and a LIST that shows an
/// object older than an update acknowledged before it was sent, are definite.
#[test]
fn api_linearizability_judges_guarded_writes_and_lists_over_resource_versions() {
    let mut o = with_api();
    assert_eq!(verdict(InvariantId::ApiLinearizability, &model(), &o), Verdict::Pass);
    let base = vec![op(0, 0, 10, txn("sd-0-1", 0, "0-1", true, 5)), op(0, 20, 30, txn("sd-0-1", 5, "0-2", true, 8))];
    let judge = |o: &mut Observation, ops: Vec<Operation>| {
        o.api.as_mut().unwrap().history = Some(view(ops));
        verdict(InvariantId::ApiLinearizability, &model(), o)
    };
    let mut ok = base.clone();
    ok.push(op(LIST, 40, 50, get("sd-0-1", 9, Some(("0-2", 8)))));
    assert_eq!(judge(&mut o, ok), Verdict::Pass);
    // The LIST sent after the update was acknowledged still shows the created object.
    let mut stale = base.clone();
    stale.push(op(LIST, 40, 50, get("sd-0-1", 9, Some(("0-1", 5)))));
    assert!(matches!(judge(&mut o, stale), Verdict::Definite(m) if m.contains("op 2 (client 1000000")));
    // A second update guarded by the created object's resourceVersion, acknowledged too.
    let mut lost = base.clone();
    lost.push(op(1, 40, 50, txn("sd-0-1", 5, "1-1", true, 9)));
    assert!(matches!(judge(&mut o, lost), Verdict::Definite(_)));
    // Without a history on an API observation the check is unobserved.
    o.api.as_mut().unwrap().history = None;
    assert!(
        matches!(verdict(InvariantId::ApiLinearizability, &model(), &o), Verdict::Unobserved(m) if m.contains("no history of the API workload"))
    );
}

/// The API invariants pass on a healthy API; where there is none (the etcd stack) they are
/// unobserved, not passed (a target without an API declares them unchecked).
#[test]
fn api_invariants_pass_on_a_healthy_api_and_are_unobserved_without_one() {
    let ids = InvariantId::API;
    for id in ids {
        assert!(matches!(verdict(id, &model(), &healthy()), Verdict::Unobserved(_)), "{id}");
    }
    assert!(check_all(&ids, &model(), &with_api()).is_empty());
}

/// api-reachability: a failed request through the load balancer, an apiserver of a running
/// machine that is not ready, an apiserver of a crashed machine that still answers.
#[test]
fn api_reachability_names_the_load_balancer_and_each_apiserver() {
    let mut o = with_api();
    o.api.as_mut().unwrap().endpoint[2].error = Some("GET /api/v1/namespaces/r/configmaps: connection reset".into());
    let v = verdict(InvariantId::ApiReachability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Fail(m) if m.contains("1 of 6 requests through the API load balancer failed") && m.contains("connection reset")),
        "{v:?}"
    );
    let mut o = with_api();
    o.api.as_mut().unwrap().apiservers[1] = apiserver(1, true, false);
    let v = verdict(InvariantId::ApiReachability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Fail(m) if m.contains("m1-apiserver is not ready although its machine m1 is up and etcd has quorum: [-]etcd failed")),
        "{v:?}"
    );
    // Machine m1 crashed: its apiserver must be gone with it.
    let mut crashed = model();
    crashed.apply(&Op::Crash { member: MemberId(1) }).unwrap();
    let o = with_api();
    let v = verdict(InvariantId::ApiReachability, &crashed, &o);
    assert!(
        matches!(&v, Verdict::Fail(m) if m.contains("m1-apiserver answered /readyz (ready) although its machine m1 is down in the model")),
        "{v:?}"
    );
    let mut o = with_api();
    o.api.as_mut().unwrap().apiservers[1] = apiserver(1, false, false);
    assert_eq!(verdict(InvariantId::ApiReachability, &crashed, &o), Verdict::Pass);
    // Without quorum nothing is owed through the load balancer.
    let mut lost = Model::new(3, 3, vec![Version::new(3, 4)], 2);
    lost.apply(&Op::Crash { member: MemberId(1) }).unwrap();
    lost.apply(&Op::Crash { member: MemberId(2) }).unwrap();
    let mut o = with_api();
    for i in 1..3 {
        o.api.as_mut().unwrap().apiservers[i] = apiserver(i as u32, false, false);
    }
    o.api.as_mut().unwrap().apiservers[0] = apiserver(0, true, false);
    o.api.as_mut().unwrap().endpoint[0].error = Some("503".into());
    assert_eq!(verdict(InvariantId::ApiReachability, &lost, &o), Verdict::Pass);
}

/// api-durability: a DELETE's revision is not known (the API answers with the object as it
/// was): the key's writes are judged in acknowledgement order, and a delete acknowledged after
/// the read was sent may or may not be in it.
#[test]
fn api_durability_orders_deletes_without_a_revision_by_acknowledgement() {
    let mut o = with_api();
    let d = o.api.as_mut().unwrap().durability.as_mut().unwrap();
    // o1: created at 5, updated at 8, deleted (revision unknown); o2 created at 6.
    d.acked = vec![ack("o1", Some("a"), 5, 0), ack("o2", Some("x"), 6, 1), ack("o1", Some("b"), 8, 2), ack("o1", None, 0, 3)].into();
    d.read = HashMap::from([("o2".into(), "x".into())]);
    d.read_revision = 10;
    d.read_sent_at = Some(4);
    assert_eq!(verdict(InvariantId::ApiDurability, &model(), &o), Verdict::Pass);
    // The deleted object is back: a delete the API acknowledged before the read was sent.
    o.api.as_mut().unwrap().durability.as_mut().unwrap().read.insert("o1".into(), "b".into());
    let v = verdict(InvariantId::ApiDurability, &model(), &o);
    assert!(matches!(&v, Verdict::Definite(m) if m.contains("1 deleted (acknowledged) but present again (o1)")), "{v:?}");
    // Acknowledged after the read was sent: either is fine.
    o.api.as_mut().unwrap().durability.as_mut().unwrap().read_sent_at = Some(3);
    assert_eq!(verdict(InvariantId::ApiDurability, &model(), &o), Verdict::Pass);
    // A lost update: o2 was updated at 9 and the read says x.
    let d = o.api.as_mut().unwrap().durability.as_mut().unwrap();
    d.acked = vec![ack("o2", Some("x"), 6, 0), ack("o2", Some("y"), 9, 1)].into();
    d.read = HashMap::from([("o2".into(), "x".into())]);
    let v = verdict(InvariantId::ApiDurability, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("1 read back with a value no acknowledged or in-doubt write explains (o2)")),
        "{v:?}"
    );
    // The etcd durability check does not look at the API's history.
    assert_eq!(verdict(InvariantId::Durability, &model(), &o), Verdict::Pass);
}

/// api-watch: Kubernetes watches carry no previous values (not judged), but a gap is.
#[test]
fn api_watch_judges_gaps_without_previous_values() {
    let mut o = with_api();
    let api = o.api.as_mut().unwrap();
    api.durability.as_mut().unwrap().acked = vec![ack("a", Some("1"), 5, 0), ack("b", Some("x"), 6, 0), ack("a", Some("2"), 7, 1)].into();
    let s = |events| WatchSession { prev_unknown: true, ..session(events) };
    api.watches = vec![s(vec![event(5, "a", Some("1"), None), event(6, "b", Some("x"), None), event(7, "a", Some("2"), None)])];
    assert_eq!(verdict(InvariantId::ApiWatch, &model(), &o), Verdict::Pass);
    let api = o.api.as_mut().unwrap();
    api.watches = vec![s(vec![event(5, "a", Some("1"), None), event(7, "a", Some("2"), None)])];
    let v = verdict(InvariantId::ApiWatch, &model(), &o);
    assert!(
        matches!(&v, Verdict::Definite(m) if m.contains("w0: 1 acknowledged write(s) never delivered though the stream went past them to revision 7: revision 6 (b)")),
        "{v:?}"
    );
    // Without prev_unknown the missing previous values would read as a contradiction.
    o.api.as_mut().unwrap().watches[0].prev_unknown = false;
    o.api.as_mut().unwrap().watches[0].events =
        vec![event(5, "a", Some("1"), None), event(6, "b", Some("x"), None), event(7, "a", Some("2"), None)].into();
    assert!(!verdict(InvariantId::ApiWatch, &model(), &o).is_pass());
}

/// The control-plane stack's apiservers live and die with their machines: one left running
/// after its machine crashed is a leak; a missing one is `api-reachability`'s finding.
#[test]
fn leaks_know_the_control_plane_stack_apiservers() {
    let mut o = healthy();
    local_inv(&mut o).apiservers = Some((0..3).map(|i| format!("m{i}")).collect());
    assert_eq!(verdict(InvariantId::Leaks, &model(), &o), Verdict::Pass);
    let mut crashed = model();
    crashed.apply(&Op::Crash { member: MemberId(1) }).unwrap();
    local_inv(&mut o).processes.remove("m1");
    let v = verdict(InvariantId::Leaks, &crashed, &o);
    assert!(matches!(&v, Verdict::Fail(m) if m.contains("kube-apiserver processes left behind: m1")), "{v:?}");
    local_inv(&mut o).apiservers.as_mut().unwrap().remove("m1");
    assert_eq!(verdict(InvariantId::Leaks, &crashed, &o), Verdict::Pass);
}

fn app_model() -> Model {
    Model::new(1, 3, vec![Version::new(3, 5)], 1)
}

fn app_obs() -> Observation {
    use shakedown_invariants::{AppData, AppInventory, AppObservation, AppWorkload};
    Observation {
        app: Some(AppObservation {
            workloads: vec![
                AppWorkload { name: "statefulset/etcd".into(), desired: 3, ready: 3 },
                AppWorkload { name: "deployment/op".into(), desired: 1, ready: 1 },
            ],
            probes: vec![("health".into(), None)],
            in_cut_groups: 0,
            data: Some(AppData {
                acked: [("k1", "v1"), ("k2", "v2")].iter().enumerate().map(|(i, (k, v))| (k.to_string(), v.to_string(), i)).collect(),
                marks: Default::default(),
                unknown: ["k3".to_string()].into_iter().collect(),
                read: Ok([("k1", "v1"), ("k2", "v2"), ("k3", "v3")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            }),
            history: Some(register_view(vec![reg(0, 0, 10, "k1", Some("v1"), true), reg(1, 20, 30, "k1", Some("v1"), false)])),
        }),
        inventory: Some(Inventory::App(AppInventory::default())),
        ..Default::default()
    }
}

/// app-ready: every workload Ready and every probe passing; a partitioned replica is excused.
#[test]
fn app_ready_wants_every_replica_ready_and_every_probe_passing() {
    let m = app_model();
    let mut o = app_obs();
    assert_eq!(verdict(InvariantId::AppReady, &m, &o), Verdict::Pass);
    o.app.as_mut().unwrap().workloads[0].ready = 2;
    let v = verdict(InvariantId::AppReady, &m, &o);
    assert!(matches!(&v, Verdict::Fail(msg) if msg.contains("statefulset/etcd: 2/3 Ready")), "{v:?}");
    let mut cut = app_model();
    cut.apply(&Op::Partition { member: MemberId(1) }).unwrap();
    assert_eq!(verdict(InvariantId::AppReady, &cut, &o), Verdict::Pass, "the partitioned replica may be unready");
    // A group partition excuses the replicas in its groups, and only while it is in place.
    o.app.as_mut().unwrap().workloads[0].ready = 1;
    o.app.as_mut().unwrap().in_cut_groups = 2;
    let mut groups = app_model();
    groups.apply(&Op::PartitionGroups { pick: 0 }).unwrap();
    assert_eq!(verdict(InvariantId::AppReady, &groups, &o), Verdict::Pass, "the replicas of both groups may be unready");
    assert!(matches!(verdict(InvariantId::AppReady, &m, &o), Verdict::Fail(msg) if msg.contains("statefulset/etcd: 1/3 Ready")));
    o.app.as_mut().unwrap().in_cut_groups = 1;
    assert!(
        matches!(verdict(InvariantId::AppReady, &groups, &o), Verdict::Fail(msg) if msg.contains("statefulset/etcd: 1/3 Ready")),
        "one more unready than the groups hold"
    );
    o.app.as_mut().unwrap().in_cut_groups = 0;
    o.app.as_mut().unwrap().workloads[0].ready = 3;
    o.app.as_mut().unwrap().probes[0].1 = Some("exit 1".into());
    assert!(matches!(verdict(InvariantId::AppReady, &m, &o), Verdict::Fail(msg) if msg.contains("probe health: exit 1")));
    // Elsewhere (no application observed) it has nothing to judge: unobserved, not a pass.
    assert!(matches!(verdict(InvariantId::AppReady, &m, &healthy()), Verdict::Unobserved(_)));
}

/// app-durability: a lost or changed acknowledged write is definite; a key never written is
/// unexplained; a write of unknown outcome may be either; a failed read converges.
#[test]
fn app_durability_judges_acknowledged_writes_against_the_read() {
    let m = app_model();
    let mut o = app_obs();
    assert_eq!(verdict(InvariantId::AppDurability, &m, &o), Verdict::Pass);
    let data = o.app.as_mut().unwrap().data.as_mut().unwrap();
    data.read.as_mut().unwrap().remove("k3");
    assert_eq!(verdict(InvariantId::AppDurability, &m, &o), Verdict::Pass, "an unknown write may be absent");
    let data = o.app.as_mut().unwrap().data.as_mut().unwrap();
    data.read.as_mut().unwrap().remove("k1");
    data.read.as_mut().unwrap().insert("k2".into(), "stale".into());
    data.read.as_mut().unwrap().insert("k9".into(), "x".into());
    let v = verdict(InvariantId::AppDurability, &m, &o);
    assert!(
        matches!(&v, Verdict::Definite(msg) if msg.contains("1 of 2 acknowledged writes lost (first: k1)") && msg.contains("k2 = \"stale\", acknowledged \"v2\"") && msg.contains("never written (k9)")),
        "{v:?}"
    );
    o.app.as_mut().unwrap().data.as_mut().unwrap().read = Err("no Ready pod".into());
    assert!(matches!(verdict(InvariantId::AppDurability, &m, &o), Verdict::Fail(msg) if msg.contains("no Ready pod")));
}

/// app-durability after a restore: the writes acknowledged before the backup are there, those
/// acknowledged after it and before the restore are gone (one still there: the restore did not
/// restore), those after the restore are there; a restore of an older backup loses writes.
#[test]
fn app_durability_follows_backups_and_restores() {
    let m = app_model();
    let mut o = app_obs();
    let kv = |ks: &[&str]| ks.iter().map(|k| (k.to_string(), format!("v{k}"))).collect::<Vec<(String, String)>>();
    let sequential = |ks: &[&str]| kv(ks).into_iter().enumerate().map(|(i, (k, v))| (k, v, i)).collect::<Vec<_>>();
    {
        let data = o.app.as_mut().unwrap().data.as_mut().unwrap();
        // k1 k2 | b0 | k3 | b1 | k4 k5 | restore(b1) | k6
        data.acked = sequential(&["k1", "k2", "k3", "k4", "k5", "k6"]);
        data.unknown.clear();
        data.marks = marks(&[M::B(0, 2, 2), M::B(1, 3, 3), M::R(1, 5, 5)]);
        data.read = Ok(kv(&["k1", "k2", "k3", "k6"]).into_iter().collect());
    }
    assert_eq!(verdict(InvariantId::AppDurability, &m, &o), Verdict::Pass, "k4 and k5 came after the restored backup");
    let read = |o: &mut Observation, ks: &[&str]| o.app.as_mut().unwrap().data.as_mut().unwrap().read = Ok(kv(ks).into_iter().collect());
    // The operator restored b0 instead of b1: k3 is lost.
    read(&mut o, &["k1", "k2", "k6"]);
    let v = verdict(InvariantId::AppDurability, &m, &o);
    assert!(
        matches!(&v, Verdict::Definite(msg) if msg.contains("1 of 4 acknowledged writes lost (first: k3)") && msg.contains("b1 restored during acks #5..#5")),
        "{v:?}"
    );
    // Nothing restored: k4 and k5 are still there.
    read(&mut o, &["k1", "k2", "k3", "k4", "k5", "k6"]);
    let v = verdict(InvariantId::AppDurability, &m, &o);
    assert!(
        matches!(&v, Verdict::Definite(msg) if msg.contains("2 written after the restored backup (or instant) are still there (k4, k5): the restore did not restore")),
        "{v:?}"
    );
}

/// app-durability after a point-in-time restore, with concurrent writers: the writes
/// acknowledged before the instant are there, one in flight across it may be either, one sent
/// after it is gone, and those after the restore are there.
#[test]
fn app_durability_after_a_point_in_time_restore_expects_the_writes_acknowledged_before_its_instant() {
    let m = app_model();
    let mut o = app_obs();
    let acked = |ks: &[(&str, usize)]| ks.iter().map(|(k, s)| (k.to_string(), format!("v{k}"), *s)).collect::<Vec<_>>();
    let read = |o: &mut Observation, ks: &[&str]| {
        o.app.as_mut().unwrap().data.as_mut().unwrap().read = Ok(ks.iter().map(|k| (k.to_string(), format!("v{k}"))).collect())
    };
    {
        let data = o.app.as_mut().unwrap().data.as_mut().unwrap();
        // Two writers. k1 k2 | b0 | k3, then the instant T (3 acked before it; k4 was sent
        // before it, with 2 acked) | k5 sent after T (4 acked) | restore-pitr(b0 → T) | k6
        data.acked = acked(&[("k1", 0), ("k2", 0), ("k3", 2), ("k4", 2), ("k5", 4), ("k6", 5)]);
        data.unknown.clear();
        let mut marks = marks(&[M::B(0, 2, 2)]);
        marks.pitr_begins(BackupId(0), 5, 3, 4);
        marks.restore_ends(5);
        data.marks = marks;
    }
    read(&mut o, &["k1", "k2", "k3", "k6"]);
    assert_eq!(verdict(InvariantId::AppDurability, &m, &o), Verdict::Pass, "k4 in flight across the instant, k5 after it");
    read(&mut o, &["k1", "k2", "k3", "k4", "k6"]);
    assert_eq!(verdict(InvariantId::AppDurability, &m, &o), Verdict::Pass, "k4 was in flight across the instant: either");
    read(&mut o, &["k1", "k2", "k6"]);
    let v = verdict(InvariantId::AppDurability, &m, &o);
    assert!(
        matches!(&v, Verdict::Definite(msg) if msg.contains("1 of 4 acknowledged writes lost (first: k3)")
            && msg.contains("b0 recovered to the instant after ack #3 during acks #5..#5")),
        "k3 was acknowledged before the instant: {v:?}"
    );
    read(&mut o, &["k1", "k2", "k3", "k5", "k6"]);
    let v = verdict(InvariantId::AppDurability, &m, &o);
    assert!(
        matches!(&v, Verdict::Definite(msg) if msg.contains("1 written after the restored backup (or instant) are still there (k5)")),
        "{v:?}"
    );
}

/// leaks on the application target: a partition's policy exactly while the model has it, no
/// stray policy of the run, the operator at its replicas.
#[test]
fn app_leaks_follow_the_model_partitions_and_the_operator_scale() {
    let m = app_model();
    let mut o = app_obs();
    assert_eq!(verdict(InvariantId::Leaks, &m, &o), Verdict::Pass);
    fn inv(o: &mut Observation) -> &mut shakedown_invariants::AppInventory {
        match o.inventory.as_mut() {
            Some(Inventory::App(i)) => i,
            _ => unreachable!(),
        }
    }
    inv(&mut o).partitioned.insert(MemberId(1));
    let v = verdict(InvariantId::Leaks, &m, &o);
    assert!(matches!(&v, Verdict::Fail(msg) if msg.contains("the partition NetworkPolicy of m1 is still there")), "{v:?}");
    let mut cut = app_model();
    cut.apply(&Op::Partition { member: MemberId(1) }).unwrap();
    assert_eq!(verdict(InvariantId::Leaks, &cut, &o), Verdict::Pass);
    inv(&mut o).operator_scaled_down = Some("the operator op is scaled to 0, not its 1".into());
    assert!(matches!(verdict(InvariantId::Leaks, &cut, &o), Verdict::Fail(msg) if msg.contains("scaled to 0")));
    inv(&mut o).operator_scaled_down = None;
    assert_eq!(verdict(InvariantId::Leaks, &cut, &o), Verdict::Pass);
    inv(&mut o).cordoned.push("node-1".into());
    assert!(
        matches!(verdict(InvariantId::Leaks, &cut, &o), Verdict::Fail(msg) if msg.contains("nodes the run cordoned are still cordoned: node-1"))
    );
    inv(&mut o).cordoned.clear();
    inv(&mut o).tainted.push("node-2".into());
    assert!(matches!(verdict(InvariantId::Leaks, &cut, &o), Verdict::Fail(msg) if msg == "nodes still carry the run's taint: node-2"));
    // A group partition's policies: there exactly while the model has that pick in place.
    let mut o = app_obs();
    inv(&mut o).groups_partitioned = Some(3);
    assert!(matches!(verdict(InvariantId::Leaks, &m, &o), Verdict::Fail(msg) if msg.contains("partition-groups(pick 3) are still there")));
    let mut groups = app_model();
    groups.apply(&Op::PartitionGroups { pick: 3 }).unwrap();
    assert_eq!(verdict(InvariantId::Leaks, &groups, &o), Verdict::Pass);
    inv(&mut o).groups_partitioned = None;
    assert!(matches!(verdict(InvariantId::Leaks, &groups, &o), Verdict::Fail(msg) if msg.contains("partition-groups(pick 3) are missing")));
    groups.apply(&Op::PartitionGroupsHeal { pick: 3 }).unwrap();
    assert_eq!(verdict(InvariantId::Leaks, &groups, &o), Verdict::Pass);
}

/// Issue 28: checks of a growing log share the checker's memory (each judges what is new) and
/// still see a stale read that only the newest request shows; a request in flight constrains
/// nothing until it ends.
#[test]
fn linearizability_of_a_growing_history_judges_what_is_new() {
    let memo =
        std::sync::Arc::new(std::sync::Mutex::new(shakedown_history::Incremental::new(shakedown_invariants::linearizability::BOUND)));
    let mut log = shakedown_invariants::ChunkedLog::default();
    let mut o = healthy();
    let mut check = |log: &shakedown_invariants::ChunkedLog<Operation>, in_flight: Vec<Operation>, horizon: u64| {
        o.history = Some(HistoryView { ended: log.snapshot(), in_flight, horizon, memo: memo.clone(), members: HashMap::new() });
        verdict(InvariantId::Linearizability, &model(), &o)
    };
    log.push(op(0, 0, 10, put("k1", "v1", 5)));
    log.push(op(1, 20, 30, put("k1", "v2", 6)));
    // Client 3's read is in flight: no answer yet.
    let flying = Operation {
        ret: None,
        request: Request::Get { key: "k1".into(), serializable: false, answer: None },
        ..op(3, 60, 0, put("k1", "", 0))
    };
    assert_eq!(check(&log, vec![flying], 60), Verdict::Pass);
    assert_eq!(memo.lock().unwrap().fed(), 2, "the memory holds what ended");
    // It ends with v1: stale.
    log.push(op(3, 60, 70, get("k1", 5, Some(("v1", 5)))));
    let Verdict::Definite(m) = check(&log, vec![], 71) else { panic!("a definite violation") };
    assert!(m.contains("a stale read") && m.contains("op 2 (client 3"), "{m}");
    assert_eq!(memo.lock().unwrap().overturned(), 0);
}

/// app-linearizability: the data workload's keys as registers written once. A key read and then
/// gone (a write of unknown outcome that surfaced, then vanished) is definite although
/// app-durability cannot see it (it only knows the acknowledged writes); so is a read before the
/// write was sent. After a restore (epoch 1), a key holds what its first read says.
#[test]
fn app_linearizability_judges_every_read_of_the_data_workload() {
    let m = app_model();
    let mut o = app_obs();
    assert_eq!(verdict(InvariantId::AppLinearizability, &m, &o), Verdict::Pass);
    let judge = |o: &mut Observation, ops: Vec<Operation>| {
        o.app.as_mut().unwrap().history = Some(register_view(ops));
        verdict(InvariantId::AppLinearizability, &m, o)
    };
    let unknown = Operation { ret: None, ..reg(0, 0, 0, "k3", Some("v3"), true) };
    let unknown = Operation {
        request: Request::Write { key: "k3".into(), value: shakedown_history::format::Scalar::Str("v3".into()), answer: None },
        ..unknown
    };
    let seen = reg(1, 20, 30, "k3", Some("v3"), false);
    let gone = reg(1, 40, 50, "k3", None, false);
    assert_eq!(judge(&mut o, vec![unknown.clone(), seen.clone()]), Verdict::Pass);
    assert!(matches!(judge(&mut o, vec![unknown.clone(), seen.clone(), gone.clone()]), Verdict::Definite(msg) if msg.contains("key k3")));
    // A value read before its write was sent.
    let early = reg(1, 0, 5, "k4", Some("v4"), false);
    assert!(matches!(judge(&mut o, vec![early, reg(0, 10, 20, "k4", Some("v4"), true)]), Verdict::Definite(msg) if msg.contains("key k4")));
    // After a restore, the first read of k3 says it was not in the backup; so does the next.
    let restored = |mut op: Operation| {
        op.epoch = 1;
        op
    };
    let after = vec![unknown.clone(), seen, restored(gone.clone()), restored(reg(1, 60, 70, "k3", None, false))];
    assert_eq!(judge(&mut o, after.clone()), Verdict::Pass);
    let mut back = after;
    back.push(restored(reg(1, 80, 90, "k3", Some("v3"), false)));
    // Back again in the same epoch with nothing written in it: only the write of unknown
    // outcome carried into the epoch could explain it.
    assert!(matches!(judge(&mut o, back.clone()), Verdict::Definite(_)));
    back.push(restored(unknown));
    assert_eq!(judge(&mut o, back), Verdict::Pass);
}
