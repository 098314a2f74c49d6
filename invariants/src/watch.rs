//! `watch`: every long-lived watch of the workload's keys delivers each revision of its range
//! once, in order, with the value of the acknowledged write at that revision and the `prev_kv`
//! its own earlier events imply — across resumptions from the last revision + 1 — or reports
//! compaction explicitly.
//!
//! Progress is what a stream delivered: a write acknowledged at a revision at or below the last
//! event a session received must be among its events. Progress notifications are not used as
//! progress: etcd before 3.4.25 / 3.5.8 could send one before every earlier event was delivered
//! (etcd-io/etcd#15220), which would read as a gap here.

use std::collections::HashMap;

use crate::expect_write;
use crate::observation::{Durability, WatchSession};
use crate::{Expect, Observation, Verdict};

pub(crate) fn watch(obs: &Observation) -> Verdict {
    match &obs.watches {
        Some(watches) => sessions(watches, obs.durability.as_ref()),
        None => Verdict::Unobserved("no watch sessions of the workload".into()),
    }
}

/// `api-watch`: the same rule over the Kubernetes API workload's watches and writes.
pub(crate) fn api_watch(obs: &Observation) -> Verdict {
    match &obs.api {
        Some(api) => sessions(&api.watches, api.durability.as_ref()),
        None => Verdict::Unobserved("no Kubernetes API observation".into()),
    }
}

fn sessions(watches: &[WatchSession], durability: Option<&Durability>) -> Verdict {
    if watches.is_empty() {
        return Verdict::Pass;
    }
    let mut problems = Vec::new();
    for s in watches {
        if let Some(p) = session(s, durability) {
            problems.push(format!("{}: {p}", s.name));
        }
    }
    if problems.is_empty() {
        Verdict::Pass
    } else {
        // What a stream delivered cannot be undelivered: waiting changes nothing.
        Verdict::Definite(problems.join("; "))
    }
}

fn session(s: &WatchSession, durability: Option<&Durability>) -> Option<String> {
    let mut last = s.start_revision - 1;
    let mut value_of: HashMap<&str, Option<&str>> = HashMap::new();
    for (i, e) in s.events.iter().enumerate() {
        if e.revision <= last {
            return Some(format!(
                "delivered revision {} ({}) after revision {last}: out of order or twice (event #{i} of the session, {} resumptions)",
                e.revision, e.key, s.resumptions
            ));
        }
        // One key per revision in the workload's object range: every write is a one-key txn.
        last = e.revision;
        if let Some(before) = value_of.get(e.key.as_str()).filter(|_| !s.prev_unknown) {
            if e.prev.as_deref() != *before {
                return Some(format!(
                    "revision {} ({}) came with prev_kv {} but the stream's previous event for the key says {}",
                    e.revision,
                    e.key,
                    shown(e.prev.as_deref()),
                    shown(*before)
                ));
            }
        }
        value_of.insert(e.key.as_str(), e.value.as_deref());
    }
    let d = durability?;
    // Strictly increasing by revision (checked above): found by binary search.
    let events: Vec<_> = s.events.iter().collect();
    // Writes acknowledged after the stack came back from the last restore (the session started
    // after it: a restore restarts every watch), expected present, within what the stream has
    // delivered.
    let since = d.marks.last_restore_end();
    let floor = s.compacted_below.unwrap_or(i64::MIN).max(s.start_revision);
    let mut missing = Vec::new();
    for (i, a) in d.acked.iter().enumerate() {
        if a.start < since.max(s.start_ack)
            || a.revision < floor
            || a.revision > last
            || expect_write(i, a.start, &d.marks) != Expect::Present
        {
            continue;
        }
        match events.binary_search_by_key(&a.revision, |e| e.revision).ok().map(|j| events[j]) {
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

fn shown(v: Option<&str>) -> String {
    v.map_or("(deleted)".to_string(), |v| format!("{v:?}"))
}
