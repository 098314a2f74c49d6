//! The search for an order: is there one order of a partition's operations, consistent with
//! real time, in which every answer is what the model gives?
//!
//! Lowe's just-in-time linearisation with Wing & Gong's backtracking, as porcupine does it: the
//! operations' call and return events in time order in a doubly linked list; an operation is
//! linearised by lifting its call and return out of the list, and the search backtracks when it
//! meets the return of an operation it has not linearised. States already reached with the same
//! set of linearised operations are not explored again. The model may be nondeterministic (an
//! operation of unknown outcome leads to more than one state, or to the same state it started
//! from); an operation with no answer has no return event: it may be linearised at any point
//! after its call.

use std::collections::HashSet;
use std::hash::Hash;

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Op;
    /// The states `op`, with the answer it got, can lead to from `s`; empty when the answer is
    /// impossible in `s`.
    fn step(&self, s: &Self::State, op: &Self::Op) -> Vec<Self::State>;
}

/// An operation for the search: when it was called and answered (`None`: unknown, never
/// returns), and what it did.
pub struct Timed<'a, O> {
    pub call: u64,
    pub ret: Option<u64>,
    pub op: &'a O,
}

/// The outcome of a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Search<S> {
    /// Some order explains every answer.
    Ok,
    /// No order does. The deepest dead end: `linearized` operations were placed, in `state`,
    /// and then operation `blocked` (an index into the input) could not be placed, nor could
    /// any operation called before it returned.
    Impossible { linearized: usize, blocked: usize, state: S },
    /// The search took more than its bound of steps: neither proven nor refuted.
    Undecided { steps: u64, deepest: usize },
}

const NIL: usize = usize::MAX;

struct Frame<S> {
    entry: usize,
    before: S,
    alternatives: Vec<S>,
    tried: usize,
}

/// Decides whether `ops` (one partition) are linearisable from `init`, taking at most `bound`
/// steps.
/// Returns the outcome and the steps taken.
pub fn linearizable<M: Model>(model: &M, init: M::State, ops: &[Timed<'_, M::Op>], bound: u64) -> (Search<M::State>, u64) {
    let n = ops.len();
    if n == 0 {
        return (Search::Ok, 0);
    }
    // Events: (time, is_return, op). A call sorts before a return at the same instant, so
    // operations that touch are concurrent (the conservative reading of equal timestamps).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, o) in ops.iter().enumerate() {
        events.push((o.call, false, i));
        events.push((o.ret.unwrap_or(u64::MAX), true, i));
    }
    events.sort_unstable();
    // Node 0 is the head; event k is node k + 1.
    let len = events.len() + 1;
    let mut next = vec![NIL; len];
    let mut prev = vec![NIL; len];
    for k in 0..len {
        next[k] = if k + 1 < len { k + 1 } else { NIL };
        prev[k] = if k == 0 { NIL } else { k - 1 };
    }
    let mut ret_node = vec![0usize; n];
    for (k, &(_, is_ret, i)) in events.iter().enumerate() {
        if is_ret {
            ret_node[i] = k + 1;
        }
    }
    let op_of = |node: usize| events[node - 1].2;
    let is_call = |node: usize| !events[node - 1].1;

    let lift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize, ret: usize| {
        for x in [node, ret] {
            let (p, nx) = (prev[x], next[x]);
            next[p] = nx;
            if nx != NIL {
                prev[nx] = p;
            }
        }
    };
    let unlift = |next: &mut Vec<usize>, prev: &mut Vec<usize>, node: usize, ret: usize| {
        for x in [ret, node] {
            let (p, nx) = (prev[x], next[x]);
            next[p] = x;
            if nx != NIL {
                prev[nx] = x;
            }
        }
    };

    // The set of linearised operations, as a Zobrist hash: 128 random bits per operation,
    // XORed in and out (a collision between two sets is a 2^-128 event).
    let zobrist: Vec<u128> = (0..n as u64).map(zobrist_key).collect();
    let mut linearized: u128 = 0;
    let mut seen: HashSet<(u128, M::State)> = HashSet::new();
    let mut stack: Vec<Frame<M::State>> = Vec::new();
    let mut state = init;
    let mut node = next[0];
    let mut steps = 0u64;
    let mut deepest: Option<(usize, usize, M::State)> = None;

    // Takes the first alternative from `from` on that leads somewhere new.
    let take = |seen: &mut HashSet<(u128, M::State)>, with: u128, alts: &[M::State], from: usize| {
        (from..alts.len()).find(|&a| seen.insert((with, alts[a].clone())))
    };

    loop {
        if next[0] == NIL {
            return (Search::Ok, steps);
        }
        steps += 1;
        if steps > bound {
            let deepest = deepest.map_or(stack.len(), |d| d.0.max(stack.len()));
            return (Search::Undecided { steps: steps - 1, deepest }, steps - 1);
        }
        if node != NIL && is_call(node) {
            let i = op_of(node);
            let alternatives = model.step(&state, ops[i].op);
            if let Some(a) = take(&mut seen, linearized ^ zobrist[i], &alternatives, 0) {
                let new = alternatives[a].clone();
                stack.push(Frame { entry: node, before: std::mem::replace(&mut state, new), alternatives, tried: a });
                linearized ^= zobrist[i];
                lift(&mut next, &mut prev, node, ret_node[i]);
                node = next[0];
            } else {
                node = next[node];
            }
            continue;
        }
        // A return of an operation not linearised yet (or the end of the list): backtrack.
        if node != NIL && deepest.as_ref().is_none_or(|d| stack.len() > d.0) {
            deepest = Some((stack.len(), op_of(node), state.clone()));
        }
        let Some(mut frame) = stack.pop() else {
            let (linearized, blocked, state) = deepest.unwrap_or((0, op_of(node), state));
            return (Search::Impossible { linearized, blocked, state }, steps);
        };
        let i = op_of(frame.entry);
        linearized ^= zobrist[i];
        unlift(&mut next, &mut prev, frame.entry, ret_node[i]);
        state = frame.before.clone();
        if let Some(a) = take(&mut seen, linearized ^ zobrist[i], &frame.alternatives, frame.tried + 1) {
            frame.tried = a;
            state = frame.alternatives[a].clone();
            linearized ^= zobrist[i];
            lift(&mut next, &mut prev, frame.entry, ret_node[i]);
            stack.push(frame);
            node = next[0];
        } else {
            node = next[frame.entry];
        }
    }
}

/// splitmix64, twice: a fixed, well-spread 128-bit key for operation `i`.
fn zobrist_key(i: u64) -> u128 {
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    (u128::from(mix(2 * i)) << 64) | u128::from(mix(2 * i + 1))
}
