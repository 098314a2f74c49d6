//! The history checker's finding, drawn: the requests that cannot be ordered, those around them
//! on the same key and the last ones before them, clients as rows and requests as bars from their call to their answer
//! (the way porcupine's visualiser shows a history), the one that could not be placed in red.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::html::esc;
use crate::history::{describe, Finding, History, Operation, Request};

/// Requests drawn at most (the finding's own always among them).
const DRAWN: usize = 40;
/// Of those, the last requests on the finding's keys answered before its window: what led up to
/// it.
const BEFORE: usize = 4;

/// The SVG of `finding` in `h`, with its context: the other requests on the finding's keys (and
/// epochs) that overlap its window.
pub fn svg(h: &History, finding: &Finding) -> Option<String> {
    let first = *finding.ops.first()?;
    let named: BTreeSet<usize> = finding.ops.iter().copied().filter(|&i| i < h.ops.len()).collect();
    if named.is_empty() {
        return None;
    }
    let end = |o: &Operation| o.ret.filter(|_| o.request.answered());
    let t0 = named.iter().map(|&i| h.ops[i].call).min()?;
    let t1 = named.iter().map(|&i| end(&h.ops[i]).unwrap_or(h.ops[i].call)).max()?.max(t0 + 1);
    let places: BTreeSet<(u32, &str)> = named.iter().map(|&i| (h.ops[i].epoch, h.ops[i].request.key())).collect();
    // Context: the same keys' requests overlapping the window, nearest to it first.
    let mut context: Vec<usize> = h
        .ops
        .iter()
        .enumerate()
        .filter(|(i, o)| {
            !named.contains(i) && places.contains(&(o.epoch, o.request.key())) && o.call <= t1 && end(o).is_none_or(|r| r >= t0)
        })
        .map(|(i, _)| i)
        .collect();
    context.sort_by_key(|&i| h.ops[i].call.abs_diff(t0));
    context.truncate(DRAWN.saturating_sub(named.len() + BEFORE));
    // And what led up to it: the last requests on those keys answered before the window.
    let mut before: Vec<usize> = h
        .ops
        .iter()
        .enumerate()
        .filter(|(i, o)| !named.contains(i) && places.contains(&(o.epoch, o.request.key())) && end(o).is_some_and(|r| r < t0))
        .map(|(i, _)| i)
        .collect();
    before.sort_by_key(|&i| std::cmp::Reverse(end(&h.ops[i])));
    before.truncate(BEFORE);
    context.extend(before);
    let drawn: Vec<usize> = named.iter().copied().chain(context).collect();
    let lo = drawn.iter().map(|&i| h.ops[i].call).min()?;
    let hi = drawn.iter().map(|&i| end(&h.ops[i]).unwrap_or(t1)).max()?.max(t1).max(lo + 1);
    let clients: BTreeMap<u64, usize> =
        drawn.iter().map(|&i| h.ops[i].client).collect::<BTreeSet<_>>().into_iter().enumerate().map(|(row, c)| (c, row)).collect();
    // Requests of one client may overlap in the window (a read recorded as one get per key): each
    // takes a lane of its client's row.
    let mut lanes: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut placed: Vec<(usize, usize)> = Vec::new();
    let mut by_call = drawn.clone();
    by_call.sort_by_key(|&i| (h.ops[i].call, i));
    for &i in &by_call {
        let o = &h.ops[i];
        let free = lanes.entry(o.client).or_default();
        let stop = end(o).unwrap_or(hi);
        let lane = match free.iter().position(|&busy_until| busy_until < o.call) {
            Some(l) => {
                free[l] = stop;
                l
            }
            None => {
                free.push(stop);
                free.len() - 1
            }
        };
        placed.push((i, lane));
    }
    let (left, width, lane_h, gap) = (90.0, 800.0, 16.0, 10.0);
    let mut row_top: BTreeMap<u64, f64> = BTreeMap::new();
    let mut y = 24.0;
    for c in clients.keys() {
        row_top.insert(*c, y);
        y += lanes.get(c).map_or(1, Vec::len) as f64 * lane_h + gap;
    }
    let height = y + 20.0;
    let x = |t: u64| left + (t.saturating_sub(lo)) as f64 / (hi - lo) as f64 * width;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1000 {height:.0}" width="100%" role="img" aria-label="the requests that cannot be ordered"><style>text{{font:11px sans-serif;fill:#333}}</style>"#
    );
    for (c, top) in &row_top {
        let _ = write!(s, r#"<text x="4" y="{:.1}">client {c}</text>"#, top + 12.0);
    }
    let _ = write!(
        s,
        r#"<text x="{left}" y="14">{:.6} s</text><text x="{:.1}" y="14" text-anchor="end">{:.6} s</text>"#,
        lo as f64 / 1e6,
        left + width,
        hi as f64 / 1e6
    );
    for (i, lane) in placed {
        let o = &h.ops[i];
        let top = row_top[&o.client] + lane as f64 * lane_h;
        let (x0, x1) = (x(o.call), x(end(o).unwrap_or(hi)));
        let (fill, stroke) = if i == first {
            ("#e66", "#a00")
        } else if named.contains(&i) {
            ("#f4b860", "#b07000")
        } else {
            ("#cfd8e3", "#8899aa")
        };
        let dash = if end(o).is_none() { r#" stroke-dasharray="3,2""# } else { "" };
        let _ = write!(
            s,
            r#"<g><title>{}</title><rect x="{x0:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="{stroke}"{dash}/><text x="{:.1}" y="{:.1}">{}</text></g>"#,
            esc(&describe(i, o)),
            (x1 - x0).max(2.0),
            lane_h - 3.0,
            x0 + 2.0,
            top + 11.0,
            esc(&label(o))
        );
    }
    s.push_str("</svg>");
    Some(s)
}

/// A request in a few words, for its bar.
fn label(o: &Operation) -> String {
    match &o.request {
        Request::Get { answer: Some(a), serializable, .. } => {
            let kind = if *serializable { "sget" } else { "get" };
            match &a.kv {
                Some(kv) => format!("{kind} {}@{} r{}", kv.value, kv.mod_revision, a.revision),
                None => format!("{kind} ∅ r{}", a.revision),
            }
        }
        Request::Put { value, answer, .. } => {
            format!("put {value}{}", answer.as_ref().map_or(" ?".into(), |a| format!(" r{}", a.revision)))
        }
        Request::Delete { answer, .. } => format!("del{}", answer.as_ref().map_or(" ?".into(), |a| format!(" r{}", a.revision))),
        Request::Txn { answer, .. } => match answer {
            Some(a) if a.succeeded => format!("txn ok r{}", a.revision),
            Some(a) => format!("txn refused r{}", a.revision),
            None => "txn ?".into(),
        },
        Request::GetAt { at, answer: Some(a), .. } => match &a.kv {
            Some(kv) => format!("get@{at} {}@{}", kv.value, kv.mod_revision),
            None => format!("get@{at} ∅"),
        },
        Request::Get { answer: None, .. } | Request::GetAt { answer: None, .. } => "get ?".into(),
        Request::Read { .. } | Request::Write { .. } | Request::Cas { .. } => o.request.key().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::format::{Kv, ReadAnswer, WriteAnswer};
    use crate::history::{check, ModelKind, Verdict, DEFAULT_BOUND};

    fn op(client: u64, call: u64, ret: u64, request: Request) -> Operation {
        Operation { client, member: None, epoch: 0, group: None, call, ret: Some(ret), request }
    }

    #[test]
    fn a_stale_read_is_drawn_with_the_write_it_missed_and_its_key_around_it() {
        let put = |v: &str, r| Request::Put { key: "k".into(), value: v.into(), answer: Some(WriteAnswer { revision: r }) };
        let get = |v: &str, m, r| Request::Get {
            key: "k".into(),
            serializable: false,
            answer: Some(ReadAnswer {
                revision: r,
                kv: Some(Kv { value: v.into(), mod_revision: m, create_revision: None, version: None }),
            }),
        };
        let h = History {
            model: ModelKind::Etcd,
            ops: vec![
                op(0, 0, 10, put("a", 5)),
                op(1, 20, 30, put("b", 6)),
                op(2, 40, 50, get("a", 5, 5)),
                op(3, 1000, 1010, Request::Put { key: "other".into(), value: "x".into(), answer: Some(WriteAnswer { revision: 7 }) }),
            ],
        };
        let report = check(&h, DEFAULT_BOUND);
        let Verdict::Violation { first, .. } = &report.verdict else { panic!("{}", report.summary()) };
        let svg = svg(&h, first).expect("a drawing");
        assert!(svg.contains("#e66"), "the blocked request in red: {svg}");
        assert!(svg.contains("get a@5 r5") && svg.contains("put b r6"), "the read and the write it missed: {svg}");
        assert!(!svg.contains("put x"), "another key's request is not drawn: {svg}");
        assert!(svg.contains("client 2") && svg.contains("<title>op 2 (client 2"), "{svg}");
    }
}
