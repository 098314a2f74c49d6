//! `watch`: every long-lived watch of the workload's keys follows etcd's watch guarantees, per
//! stream and across resumptions from the last revision + 1:
//!
//! - **Filtered:** every event is inside the range the watch asked for.
//! - **Ordered and unique:** revisions never go back, and a key changes at most once per
//!   revision.
//! - **Atomic:** all events of one revision arrive in one response.
//! - **Right values:** the value of the acknowledged write at each revision; `prev_kv` what the
//!   stream's own earlier events imply; the create revision and version (so `is_create`) what the
//!   key's previous event implies.
//! - **Nothing extra:** every event is a write some client sent (acknowledged or of unknown
//!   outcome).
//! - **Reliable:** a write acknowledged at a revision at or below the last event a session
//!   received is among its events — or etcd declared, by a compaction, that it is gone.
//! - **Progress notifications never ahead:** a progress notification at revision R promises that
//!   every event of the range up to R was delivered before it; an event at or below R delivered
//!   after it, or an acknowledged write at or below R not delivered before it, breaks the promise.
//!   etcd before 3.4.25 and 3.5.8 can send a requested one ahead of events still queued
//!   (etcd-io/etcd#15220): on a member running such a release an early notification is that
//!   known defect, reported by name at every occurrence ([`crate::known_defects`]) rather than
//!   failing the run; on any other release it is a violation.

use std::collections::{HashMap, HashSet};

use crate::expect_write;
use crate::observation::{Ack, Durability, WatchEvent, WatchProgress, WatchSession};
use crate::{Expect, InvariantId, KnownDefect, MemberStatus, Observation, Verdict};

/// The verdict, and the early progress notifications of members on a release with
/// etcd-io/etcd#15220: each named, not failed (every other rule, and this one on every other
/// release, still fails).
pub(crate) fn watch(obs: &Observation) -> (Verdict, Vec<KnownDefect>) {
    match &obs.watches {
        Some(watches) => {
            // A member whose store diverged delivers other writes at the acknowledged revisions.
            let (verdict, known) = sessions(watches, obs.durability.as_ref(), &obs.members);
            (crate::known::with_txn_range_refused(verdict, obs), known)
        }
        None => (Verdict::Unobserved("no watch sessions of the workload".into()), Vec::new()),
    }
}

/// `api-watch`: the same rules over the Kubernetes API workload's watches and writes.
pub(crate) fn api_watch(obs: &Observation) -> Verdict {
    match &obs.api {
        Some(api) => sessions(&api.watches, api.durability.as_ref(), &[]).0,
        None => Verdict::Unobserved("no Kubernetes API observation".into()),
    }
}

fn sessions(watches: &[WatchSession], durability: Option<&Durability>, members: &[MemberStatus]) -> (Verdict, Vec<KnownDefect>) {
    let written = durability.map(Written::of);
    let mut problems = Vec::new();
    let mut known = Vec::new();
    for s in watches {
        if let Some(p) = session(s, durability, written.as_ref(), members, &mut known) {
            let at = s.streams.last().map(|st| format!(" (on {})", st.member)).unwrap_or_default();
            problems.push(format!("{}{at}: {p}", s.name));
        }
    }
    let verdict = if problems.is_empty() {
        Verdict::Pass
    } else {
        // What a stream delivered cannot be undelivered: waiting changes nothing.
        Verdict::Definite(problems.join("; "))
    };
    (verdict, known)
}

/// Every write some client sent, acknowledged or not, as (key, value): what an event may be.
struct Written<'a> {
    writes: HashSet<(&'a str, Option<&'a str>)>,
    /// The highest revision acknowledged when the writes were read: an event above it may be
    /// a write sent after, which is not in `writes`.
    covered: i64,
}

impl<'a> Written<'a> {
    fn of(d: &'a Durability) -> Written<'a> {
        let mut writes: HashSet<(&str, Option<&str>)> = d.unknown.iter().map(|u| (u.key.as_str(), u.value.as_deref())).collect();
        // Revisions start again from the backup's after a restore: only the acknowledgements
        // since the last one tell how far the current numbering is covered.
        let since = d.marks.last_restore_end();
        let mut covered = 0;
        for (i, a) in d.acked.iter().enumerate() {
            writes.insert((a.key.as_str(), a.value.as_deref()));
            if i >= since {
                covered = covered.max(a.revision);
            }
        }
        Written { writes, covered }
    }
}

fn session(
    s: &WatchSession,
    durability: Option<&Durability>,
    written: Option<&Written>,
    members: &[MemberStatus],
    known: &mut Vec<KnownDefect>,
) -> Option<String> {
    let mut last = s.start_revision - 1;
    let mut last_key: Option<&str> = None;
    let mut last_response = 0;
    let mut value_of: HashMap<&str, Option<&str>> = HashMap::new();
    // The key's create revision and version after the stream's last event of it (`None`:
    // deleted).
    let mut created_of: HashMap<&str, Option<(i64, i64)>> = HashMap::new();
    for (i, e) in s.events.iter().enumerate() {
        if s.compacted.iter().any(|g| g.at == i) {
            // A declared gap: what the stream knew of each key is no longer the key's history.
            value_of.clear();
            created_of.clear();
        }
        let on = s.member_at(i).map(|m| format!(", from {m}")).unwrap_or_default();
        if let Some(range) = &s.range {
            if !e.key.starts_with(range.as_str()) {
                return Some(format!("revision {} delivered {}, outside the watched range {range:?} (event #{i}{on})", e.revision, e.key));
            }
        }
        if e.revision < last || (e.revision == last && (last_key == Some(e.key.as_str()) || i == 0)) {
            let known = version_at(s, i, members).map(|(m, v)| crate::known::watch_back_after_snapshot(m, v)).unwrap_or_default();
            return Some(format!(
                "delivered revision {} ({}) after revision {last}: out of order or twice (event #{i} of the session{on}, {} resumptions){known}",
                e.revision, e.key, s.resumptions
            ));
        }
        if e.revision == last && e.response != last_response {
            return Some(format!(
                "revision {} split across two responses (its event for {} came in a later response than the one before{on}): a revision's events must arrive together",
                e.revision, e.key
            ));
        }
        last = e.revision;
        last_key = Some(e.key.as_str());
        last_response = e.response;
        // etcd-io/etcd#10681: the watch reads an event's prev_kv at the revision before it, and
        // leaves it out when a compaction has removed that revision. Reported by name, never
        // taken for "the key did not exist".
        // Not a create: a delete (there is no event for deleting nothing), or a put whose
        // create revision is older than it.
        let updates = e.value.is_none() || e.created.is_some_and(|(c, _)| c != e.revision);
        let prev_compacted = e.prev.is_none() && !s.prev_unknown && updates && s.compactions.iter().any(|&c| c >= e.revision);
        if prev_compacted {
            prev_kv_compacted(s, e, i, &on, known);
        }
        if let Some(before) = value_of.get(e.key.as_str()).filter(|_| !s.prev_unknown && !prev_compacted) {
            if e.prev.as_deref() != *before {
                return Some(format!(
                    "revision {} ({}) came with prev_kv {} but the stream's previous event for the key says {}{on}",
                    e.revision,
                    e.key,
                    shown(e.prev.as_deref()),
                    shown(*before)
                ));
            }
        }
        if let (Some((create, version)), Some(_)) = (e.created, &e.value) {
            let is_create = create == e.revision;
            let want = match created_of.get(e.key.as_str()) {
                Some(Some((c, v))) => Some((*c, v + 1)),
                Some(None) => Some((e.revision, 1)),
                // The first event of the key in the session: prev_kv says whether it existed.
                None if !s.prev_unknown && e.prev.is_none() && !prev_compacted => Some((e.revision, 1)),
                None => None,
            };
            let wrong = match want {
                Some(w) => w != (create, version),
                None => !s.prev_unknown && (is_create || version < 2),
            };
            if wrong || is_create != (version == 1) {
                let expected = match want {
                    Some((c, v)) => format!("create revision {c}, version {v}"),
                    None => "an update (create revision below it, version above 1)".into(),
                };
                return Some(format!(
                    "revision {} ({}) came with create revision {create}, version {version} (is_create {is_create}) but the key's history implies {expected}{on}",
                    e.revision, e.key
                ));
            }
        }
        created_of.insert(e.key.as_str(), e.value.as_ref().and(e.created));
        value_of.insert(e.key.as_str(), e.value.as_deref());
        if let Some(w) = written.filter(|_| s.range.is_some()) {
            if e.revision <= w.covered && !w.writes.contains(&(e.key.as_str(), e.value.as_deref())) {
                return Some(format!(
                    "revision {} delivered {} = {}, which no client wrote (event #{i}{on})",
                    e.revision,
                    e.key,
                    shown(e.value.as_deref())
                ));
            }
        }
    }
    // Increasing by revision (checked above): found by binary search.
    let events: Vec<&WatchEvent> = s.events.iter().collect();
    if let Some(p) = progress_after_events(s, &events, members, known) {
        return Some(p);
    }
    let d = durability?;
    // Writes acknowledged after the stack came back from the last restore (the session started
    // after it: a restore restarts every watch), expected present, within what the stream has
    // delivered.
    let since = d.marks.last_restore_end();
    let declared = |r: i64| s.compacted.iter().any(|g| (g.from..g.to).contains(&r));
    let expected: Vec<&Ack> = d
        .acked
        .iter()
        .enumerate()
        .filter(|(i, a)| {
            a.start >= since.max(s.start_ack)
                && a.revision >= s.start_revision
                && !declared(a.revision)
                && expect_write(*i, a.start, &d.marks) == Expect::Present
        })
        .map(|(_, a)| a)
        .collect();
    let mut missing = Vec::new();
    for a in &expected {
        if a.revision > last {
            continue;
        }
        let at = &events[events.partition_point(|e| e.revision < a.revision)..events.partition_point(|e| e.revision <= a.revision)];
        // A transaction writes several keys at one revision: this write's event is the one of
        // its key. An event at the revision of a key no write acknowledged there is another
        // write than the ones acknowledged there.
        let other = || at.iter().find(|e| !expected.iter().any(|b| b.revision == a.revision && b.key == e.key));
        match at.iter().find(|e| e.key == a.key).or_else(other) {
            // etcd-io/etcd#18089: a compaction to exactly a delete's revision removed its
            // tombstone, and a stream from that revision on (the first revision etcd still
            // serves) never delivers it — beside the events of the same transaction's other
            // writes, which the compaction keeps. Named on a release that has it; missing
            // anywhere else.
            None if a.value.is_none() && s.compactions.contains(&a.revision) => {
                let at = events.partition_point(|e| e.revision < a.revision);
                match version_at(s, at, members).filter(|(_, v)| crate::known::compaction_drops_tombstone(v)) {
                    Some((member, v)) => {
                        let key = format!("{}/{}/tombstone/{}", s.name, s.start_revision, a.revision);
                        let seen = format!(
                            "{}: the delete of {} acknowledged at revision {}, the revision a compaction was asked for, was never delivered though the stream went past it — {member} runs etcd {v}",
                            s.name, a.key, a.revision
                        );
                        let about = "a compaction to exactly a delete's revision removes its tombstone, so a watch from that revision (the oldest etcd still serves: where a watch told it was compacted resumes) never delivers the delete (etcd-io/etcd#18089; 3.4.23 and 3.5.1 have it, 3.5.16 does not); a cache built from that watch keeps the deleted key";
                        report_known(known, "etcd-io/etcd#18089", key, seen, about);
                    }
                    None => missing.push((a.revision, a.key.as_str())),
                }
            }
            None => missing.push((a.revision, a.key.as_str())),
            Some(e) if e.key != a.key || e.value != a.value => {
                return Some(format!(
                    "revision {} delivered as {} = {} but the write acknowledged at it was {} = {}",
                    a.revision,
                    e.key,
                    shown(e.value.as_deref()),
                    a.key,
                    shown(a.value.as_deref())
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(p) = progress_ahead_of_writes(s, &events, &expected, members, known) {
        return Some(p);
    }
    if missing.is_empty() {
        return None;
    }
    missing.sort();
    let head: Vec<String> = missing.iter().take(3).map(|(r, k)| format!("{r} ({k})")).collect();
    Some(format!(
        "{} acknowledged write(s) never delivered though the stream went past them to revision {last}: revision {}{} (session from revision {}, {} resumptions)",
        missing.len(),
        head.join(", "),
        if missing.len() > 3 { ", …" } else { "" },
        s.start_revision,
        s.resumptions
    ))
}

/// A progress notification at R followed by an event at or below R: the promise came before
/// the event it covered.
fn progress_after_events(
    s: &WatchSession,
    events: &[&WatchEvent],
    members: &[MemberStatus],
    known: &mut Vec<KnownDefect>,
) -> Option<String> {
    for p in &s.progress {
        let Some(e) = events.get(p.delivered) else { continue };
        if e.revision <= p.revision {
            let said = format!(
                "a progress notification at revision {} (after event #{}) promised every event up to it, but revision {} ({}) came after it",
                p.revision, p.delivered, e.revision, e.key,
            );
            if let Some(p) = early(s, p, said, members, known) {
                return Some(p);
            }
        }
    }
    None
}

/// A progress notification at R while an acknowledged write of the range at or below R had not
/// been delivered (and never was, or the session ended first).
fn progress_ahead_of_writes(
    s: &WatchSession,
    events: &[&WatchEvent],
    expected: &[&Ack],
    members: &[MemberStatus],
    known: &mut Vec<KnownDefect>,
) -> Option<String> {
    let mut revisions: Vec<(i64, &str)> = expected.iter().map(|a| (a.revision, a.key.as_str())).collect();
    revisions.sort_unstable();
    for p in &s.progress {
        let delivered_to = match p.delivered.checked_sub(1) {
            None => s.start_revision - 1,
            Some(j) => events.get(j).map_or(i64::MAX, |e| e.revision),
        };
        let from = revisions.partition_point(|(r, _)| *r <= delivered_to);
        if let Some(&(r, key)) = revisions.get(from).filter(|(r, _)| *r <= p.revision) {
            let said = format!(
                "a progress notification at revision {} promised every event up to it, but the write acknowledged at revision {r} ({key}) had not been delivered (the stream had reached revision {delivered_to})",
                p.revision
            );
            if let Some(p) = early(s, p, said, members, known) {
                return Some(p);
            }
        }
    }
    None
}

/// The member whose stream delivered event `i` of `s` and the etcd release it ran when the
/// stream was created (else what it runs now).
fn version_at<'a>(s: &'a WatchSession, i: usize, members: &'a [MemberStatus]) -> Option<(&'a str, &'a str)> {
    let stream = s.stream_at(i)?;
    let version =
        stream.version.as_deref().or_else(|| members.iter().find(|m| m.name == stream.member).and_then(|m| m.version.as_deref()))?;
    Some((stream.member.as_str(), version))
}

/// An early progress notification: on a member whose release has etcd-io/etcd#15220 (3.4
/// before 3.4.25, 3.5 before 3.5.8) it is that defect, recorded in `known` by name (`None`);
/// anywhere else it is a violation (`Some`, naming the member).
fn early(s: &WatchSession, p: &WatchProgress, said: String, members: &[MemberStatus], known: &mut Vec<KnownDefect>) -> Option<String> {
    let member = s.member_at(p.delivered);
    let on = member.map(|m| format!(" (sent by {m})")).unwrap_or_default();
    let Some(v) = version_at(s, p.delivered, members).map(|(_, v)| v).filter(|v| crate::known::progress_ahead_of_events(v)) else {
        return Some(format!("{said}{on}"));
    };
    let key = format!("{}/{}/{}", s.name, s.start_revision, p.revision);
    let seen = format!("{}: {said} — {} runs etcd {v}", s.name, member.unwrap_or("the member"));
    let about = "a requested progress notification is sent outside the watch stream and can overtake events still queued for the watcher (etcd-io/etcd#15220, fixed in 3.4.25 and 3.5.8); a client that trusts it (kube-apiserver's watch cache) serves a state older than it claims";
    report_known(known, "etcd-io/etcd#15220", key, seen, about);
    None
}

/// Adds a known defect of `watch` to `known`, once per `key` (one occurrence).
fn report_known(known: &mut Vec<KnownDefect>, defect: &str, key: String, seen: String, about: &str) {
    if known.iter().any(|k| k.key == key) {
        return;
    }
    known.push(KnownDefect {
        invariant: InvariantId::Watch,
        defect: defect.into(),
        key,
        message: format!("{seen}: {about}"),
        seen,
        about: about.into(),
    });
}

/// Reports event `i` of `s`, an update or delete that came without its `prev_kv` after a
/// compaction at or above its revision had been requested (etcd-io/etcd#10681, every release).
fn prev_kv_compacted(s: &WatchSession, e: &WatchEvent, i: usize, on: &str, known: &mut Vec<KnownDefect>) {
    let key = format!("{}/{}/{}/{}", s.name, s.start_revision, e.revision, e.key);
    let seen = format!("{}: revision {} ({}) came without prev_kv though it is not a create (event #{i}{on})", s.name, e.revision, e.key);
    let about = "etcd reads an event's prev_kv at the revision before it and leaves it out, silently, when a compaction has removed that revision (etcd-io/etcd#10681, open; kube-apiserver refuses such an event); a client that needs the old value (to know what a delete removed) does not get it";
    report_known(known, "etcd-io/etcd#10681", key, seen, about);
}

fn shown(v: Option<&str>) -> String {
    v.map_or("(deleted)".to_string(), |v| format!("{v:?}"))
}
