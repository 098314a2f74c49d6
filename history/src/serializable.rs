//! Serializable reads against the revision they claim.
//!
//! A serializable read is answered by one member from its own store, with that store's revision
//! in the header. It may be behind the cluster (that is what serializable allows), but what it
//! returns must be exactly the key's state at the revision it claims: the value of the last
//! write of the key at or below that revision, or nothing if that write was a delete. So a member
//! that serves an older state than the revision it claims (a store that lost writes, a
//! divergence) is caught even though linearizability does not apply to its reads.
//!
//! The writes are the history's, per key and epoch: acknowledged ones at their revisions, and
//! those of unknown outcome (which may have taken any revision nobody saw). Judged leniently
//! where an unknown write could explain the answer, never where only a known one could.

use std::collections::BTreeMap;

use crate::format::{Operation, Request, Then};

/// One key's writes in one epoch.
#[derive(Debug, Clone, Default)]
pub struct KeyWrites {
    /// Acknowledged writes by revision: the value written, or `None` for a delete.
    known: BTreeMap<i64, (Option<String>, usize)>,
    /// Writes of unknown outcome: the values they would write (`None`: a delete).
    unknown: Vec<Option<String>>,
}

impl KeyWrites {
    /// Adds request `i` if it is a write of this key (or may have been one).
    pub fn add(&mut self, i: usize, op: &Operation) {
        let answered = op.request.answered();
        match &op.request {
            Request::Put { value, answer, .. } => match answer {
                Some(a) if answered => {
                    self.known.insert(a.revision, (Some(value.clone()), i));
                }
                _ => self.unknown.push(Some(value.clone())),
            },
            Request::Delete { answer, .. } => match answer {
                Some(a) if a.deleted > 0 => {
                    self.known.insert(a.revision, (None, i));
                }
                Some(_) => {}
                None => self.unknown.push(None),
            },
            Request::Txn { if_mod_revision, then, answer, .. } => {
                let value = match then {
                    Then::Put(v) => Some(v.clone()),
                    Then::Delete => None,
                };
                match answer {
                    // A guarded delete of an absent key writes nothing.
                    Some(a) if a.succeeded && !(value.is_none() && *if_mod_revision == 0) => {
                        self.known.insert(a.revision, (value, i));
                    }
                    Some(_) => {}
                    None => self.unknown.push(value),
                }
            }
            Request::Get { .. } | Request::GetAt { .. } | Request::Read { .. } | Request::Write { .. } | Request::Cas { .. } => {}
        }
    }

    /// The writes still in flight, as writes of unknown outcome.
    pub fn with_unknown<'a>(&self, ops: impl IntoIterator<Item = &'a Operation>) -> KeyWrites {
        let mut w = self.clone();
        for op in ops {
            w.add(usize::MAX, op);
        }
        w
    }

    fn unknown_write(&self, value: Option<&str>) -> bool {
        self.unknown.iter().any(|u| u.as_deref() == value)
    }
}

/// Why serializable read `read` (a serializable get with an answer) is not the key's state at
/// the revision it claims, given the key's writes in its epoch (`epoch_zero`: the store started
/// empty, so a value must have been written in the history). The requests involved: the write
/// it contradicts, if one.
pub fn misread(read: &Operation, writes: &KeyWrites, epoch_zero: bool) -> Option<(String, Option<usize>)> {
    let (at, kv, keys_only) = match &read.request {
        Request::Get { serializable: true, answer: Some(a), .. } => (a.revision, &a.kv, false),
        Request::GetAt { at, keys_only, answer: Some(a), .. } => (*at, &a.kv, *keys_only),
        _ => return None,
    };
    // The last acknowledged write at or below the claimed revision.
    let last = writes.known.range(..=at).next_back();
    match kv {
        Some(kv) => {
            if kv.mod_revision > at {
                return Some((format!("its value's mod revision {} is above the revision it claims", kv.mod_revision), None));
            }
            let later = if kv.mod_revision < at { writes.known.range(kv.mod_revision + 1..=at).next_back() } else { None };
            if let Some((&r, (_, j))) = later {
                return Some((
                    format!("the key was written again at revision {r} (at or below the revision it claims), which it does not show"),
                    Some(*j),
                ));
            }
            match writes.known.get(&kv.mod_revision) {
                Some((Some(v), _)) if keys_only || *v == kv.value => None,
                Some((None, j)) if keys_only => {
                    Some((format!("revision {} deleted the key, which it shows present", kv.mod_revision), Some(*j)))
                }
                Some((written, j)) => Some((
                    format!(
                        "revision {} wrote {} to the key, not {:?}",
                        kv.mod_revision,
                        written.as_ref().map_or("a delete".to_string(), |v| format!("{v:?}")),
                        kv.value
                    ),
                    Some(*j),
                )),
                // No acknowledged write at that revision: one of unknown outcome may have taken it,
                // or (after a restore) the value came with the backup.
                None if !epoch_zero || (keys_only && writes.unknown.iter().any(Option::is_some)) => None,
                None if !keys_only && writes.unknown_write(Some(&kv.value)) => None,
                None if keys_only => Some((format!("no put of the key at revision {} is in the history", kv.mod_revision), None)),
                None => Some((format!("no write of {:?} to the key is in the history", kv.value), None)),
            }
        }
        None => match last {
            Some((&r, (Some(v), j))) if !writes.unknown_write(None) => Some((
                format!("the key held {v:?} from revision {r} (at or below the revision it claims), and no delete followed"),
                Some(*j),
            )),
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Kv, ReadAnswer, WriteAnswer};

    fn op(request: Request) -> Operation {
        Operation { client: 0, member: None, epoch: 0, group: None, call: 0, ret: Some(1), request }
    }

    fn put(value: &str, revision: Option<i64>) -> Operation {
        op(Request::Put { key: "k".into(), value: value.into(), answer: revision.map(|revision| WriteAnswer { revision }) })
    }

    fn read(revision: i64, kv: Option<(&str, i64)>) -> Operation {
        let kv = kv.map(|(v, m)| Kv { value: v.into(), mod_revision: m, create_revision: None, version: None });
        op(Request::Get { key: "k".into(), serializable: true, answer: Some(ReadAnswer { revision, kv }) })
    }

    fn writes(ops: &[Operation]) -> KeyWrites {
        let mut w = KeyWrites::default();
        for (i, o) in ops.iter().enumerate() {
            w.add(i, o);
        }
        w
    }

    #[test]
    fn a_read_behind_the_cluster_is_fine_if_it_is_the_state_at_its_revision() {
        let w = writes(&[put("a", Some(5)), put("b", Some(8))]);
        assert_eq!(misread(&read(6, Some(("a", 5))), &w, true), None, "behind, but exactly revision 6's state");
        assert_eq!(misread(&read(9, Some(("b", 8))), &w, true), None);
        assert_eq!(misread(&read(8, Some(("b", 8))), &w, true), None, "at the write's own revision");
        assert_eq!(misread(&read(4, None), &w, true), None, "before the first write: absent");
    }

    #[test]
    fn a_read_that_claims_a_revision_its_state_is_older_than_is_caught() {
        let w = writes(&[put("a", Some(5)), put("b", Some(8))]);
        let (why, op) = misread(&read(9, Some(("a", 5))), &w, true).expect("stale for its revision");
        assert!(why.contains("written again at revision 8"), "{why}");
        assert_eq!(op, Some(1));
        assert!(misread(&read(9, Some(("c", 8))), &w, true).is_some(), "a value revision 8 did not write");
        assert!(misread(&read(9, None), &w, true).is_some(), "absent while b was there");
        assert!(misread(&read(9, Some(("z", 7))), &w, true).is_some(), "a value nobody wrote");
    }

    #[test]
    fn a_write_of_unknown_outcome_may_explain_a_value() {
        let w = writes(&[put("a", Some(5)), put("u", None)]);
        assert_eq!(misread(&read(9, Some(("u", 7))), &w, true), None);
        // After a restore the value may have come with the backup.
        assert_eq!(misread(&read(9, Some(("old", 3))), &writes(&[]), false), None);
    }
}
