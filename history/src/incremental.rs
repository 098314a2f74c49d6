//! Checking an etcd history as it grows: after every step, only what is new.
//!
//! A partition (one key in one epoch) is *cut* where it is quiescent: every operation before the
//! cut was answered before every operation after it was sent, and before any request still in
//! flight was sent (the caller's *horizon*). Every order real time allows places the operations
//! before a cut first, so the partition is linearisable exactly when some state the operations
//! before the cut can end in explains the rest. A cut keeps those end states, each with the
//! operations of unknown outcome that may still take effect after it (*pending*), and forgets the
//! operations before it. A check searches only what came after the last cut, from those states.
//!
//! The end states are enumerated exactly (every order of the few operations between two cuts), so
//! nothing is lost: the verdict is the whole check's. A violation found here is confirmed, and
//! worded, by [`check`](crate::check()) over the whole history, which is what a step that fails
//! gets anyway. The revision-order check keeps its orderings and looks only at what is new.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::check::{check, revision_of, same_group, MemberChain, Names, Report, Verdict};
use crate::format::{History, ModelKind, Operation, Request};
use crate::kv::{may_still_apply, Kv, KvOp, State};
use crate::search::{linearizable, Model, Search, Timed};
use crate::serializable::{misread, KeyWrites};

/// Operations (pending and between two cuts) an enumeration of end states takes at most: the
/// set placed is a bit mask.
const SEGMENT: usize = 128;
/// Steps an enumeration of end states takes at most before the cut waits for a later check.
const SEGMENT_STEPS: u64 = 100_000;
/// End states a cut keeps at most.
const CONFIGS: usize = 64;

/// One operation of a partition, for the search: its answer in the model's terms.
#[derive(Debug, Clone)]
struct Item {
    call: u64,
    /// `None`: no answer (unknown outcome).
    ret: Option<u64>,
    op: KvOp,
}

/// A state the operations before the cut can end in, with the unknown operations (indices into
/// [`Part::unknowns`], ascending) that may still take effect.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Config {
    state: State,
    pending: Vec<u32>,
}

#[derive(Debug)]
struct Part {
    /// The operations after the cut, in call order.
    tail: Vec<Item>,
    /// Unknown operations from before the cut.
    unknowns: Vec<Item>,
    configs: Vec<Config>,
    /// The instant of the cut: every operation after it was sent later.
    cut: u64,
    /// New operations since the last check.
    dirty: bool,
    /// The last check's outcome, while nothing changed.
    outcome: Outcome,
    /// Every write of the key (for its serializable reads).
    writes: KeyWrites,
    /// Its serializable reads (indices of the fed requests): judged again whenever the key
    /// changes, since a write acknowledged later may contradict them.
    serializable: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    Violation,
    Undecided,
}

impl Part {
    fn new(epoch: u32) -> Part {
        let init = if epoch == 0 { State::empty() } else { State::unseen() };
        Part {
            tail: vec![],
            unknowns: vec![],
            configs: vec![Config { state: init, pending: vec![] }],
            cut: 0,
            dirty: false,
            outcome: Outcome::Ok,
            writes: KeyWrites::default(),
            serializable: vec![],
        }
    }
}

/// The revision-order check of one epoch, kept between checks.
#[derive(Debug, Default)]
struct Epoch {
    /// Answered requests with a revision: (answer instant, revision, op), by answer instant.
    by_ret: Vec<(u64, i64, usize)>,
    /// The highest revision among `by_ret[..=k]` and its op (the first to reach it).
    prefix_max: Vec<(i64, usize)>,
    /// Where `prefix_max` is stale from.
    stale_from: usize,
    /// (call instant, op), by call instant.
    by_call: Vec<(u64, usize)>,
    writes: HashMap<i64, usize>,
}

/// An etcd history's checker that remembers what earlier checks decided. Feed it the requests
/// that ended, in the order they ended; [`Incremental::check`] then judges them with the requests
/// still in flight.
pub struct Incremental {
    bound: u64,
    names: Names,
    ops: Vec<Operation>,
    parts: HashMap<(u32, String), Part>,
    epochs: BTreeMap<u32, Epoch>,
    /// Ops fed since the last check (revision order looks at them and what they may affect).
    fresh: Vec<usize>,
    /// A revision-order problem was found (the whole check words it).
    order_broken: bool,
    /// An operation arrived with a call before its partition's cut: the caller's horizon was
    /// wrong (or a request of another model came). The check falls back to the whole check
    /// from then on.
    horizon_broken: bool,
    /// Violations found here that the whole check did not confirm (a defect of this module;
    /// the whole check's verdict is the one given).
    overturned: usize,
    /// Member names by the ids requests recorded (those that ended before the names were known),
    /// for the whole check's wording.
    members: HashMap<String, String>,
    /// Each client's run of serializable reads from one member.
    chains: HashMap<u64, MemberChain>,
}

impl std::fmt::Debug for Incremental {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Incremental {{ {} operations, {} partitions }}", self.ops.len(), self.parts.len())
    }
}

impl Incremental {
    /// A checker of an etcd history, each search bounded by `bound` steps.
    pub fn new(bound: u64) -> Incremental {
        Incremental {
            bound,
            names: Names::default(),
            ops: vec![],
            parts: HashMap::new(),
            epochs: BTreeMap::new(),
            fresh: vec![],
            order_broken: false,
            horizon_broken: false,
            overturned: 0,
            members: HashMap::new(),
            chains: HashMap::new(),
        }
    }

    /// Violations this checker found that the whole check did not confirm: always 0 unless this
    /// module has a defect (its tests assert it).
    pub fn overturned(&self) -> usize {
        self.overturned
    }

    /// Names for member ids (as answers' headers give them): a violation's wording names the
    /// members, also for requests that ended before the names were known.
    pub fn name_members(&mut self, names: &HashMap<String, String>) {
        self.members.extend(names.iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    /// The bound each search takes.
    pub fn bound(&self) -> u64 {
        self.bound
    }

    /// Requests fed so far.
    pub fn fed(&self) -> usize {
        self.ops.len()
    }

    /// Feeds requests that ended (answered or not), in the order they ended. A request still in
    /// flight is not fed: it is given to [`Incremental::check`] until it ends.
    pub fn feed(&mut self, ops: impl IntoIterator<Item = Operation>) {
        for op in ops {
            let i = self.ops.len();
            if op.request.model() != ModelKind::Etcd {
                self.horizon_broken = true;
                self.ops.push(op);
                continue;
            }
            if let (Some((rev, writes)), Some(ret)) = (revision_of(&op), op.ret) {
                let e = self.epochs.entry(op.epoch).or_default();
                if writes {
                    match e.writes.entry(rev) {
                        std::collections::hash_map::Entry::Occupied(j) if same_group(&op, &self.ops[*j.get()]) => {}
                        std::collections::hash_map::Entry::Occupied(_) => self.order_broken = true,
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert(i);
                        }
                    }
                }
                let at = e.by_ret.partition_point(|x| x.0 <= ret);
                e.by_ret.insert(at, (ret, rev, i));
                e.stale_from = e.stale_from.min(at);
                let at = e.by_call.partition_point(|x| x.0 <= op.call);
                e.by_call.insert(at, (op.call, i));
                self.fresh.push(i);
            }
            let part = self.parts.entry((op.epoch, op.request.key().to_string())).or_insert_with(|| Part::new(op.epoch));
            part.dirty = true;
            part.writes.add(i, &op);
            if op.request.at_claimed_revision() {
                part.serializable.push(i);
                if matches!(op.request, Request::Get { .. }) && op.request.answered() {
                    // The member as the whole check names it.
                    let mut named = op.clone();
                    if let Some(name) = op.member.as_ref().and_then(|m| self.members.get(m)) {
                        named.member = Some(name.clone());
                    }
                    let ops = &self.ops;
                    let ret = |j: usize| ops.get(j).and_then(|o| o.ret);
                    if self.chains.entry(op.client).or_default().next(i, &named, ret).is_some() {
                        self.order_broken = true;
                    }
                }
            } else {
                let item = Item { call: op.call, ret: op.ret.filter(|_| op.request.answered()), op: self.names.kv(&op.request) };
                if op.call <= part.cut && part.cut > 0 {
                    self.horizon_broken = true;
                }
                let at = part.tail.partition_point(|x| x.call <= item.call);
                part.tail.insert(at, item);
            }
            self.ops.push(op);
        }
    }

    /// Judges every request fed so far with `in_flight` (requests sent and not ended: unknown
    /// outcome). `horizon`: no request that ends after this check was sent before this instant
    /// (the earliest call in flight, or now).
    pub fn check(&mut self, in_flight: &[Operation], horizon: u64) -> Report {
        // Registers (the application's data) are judged whole: their histories are small.
        if self.horizon_broken || in_flight.iter().any(|o| o.request.model() != ModelKind::Etcd) {
            return self.whole(in_flight);
        }
        self.revision_order();
        let mut flying: HashMap<(u32, &str), Vec<Item>> = HashMap::new();
        let mut flying_ops: HashMap<(u32, &str), Vec<&Operation>> = HashMap::new();
        for op in in_flight {
            if op.request.at_claimed_revision() {
                continue;
            }
            flying.entry((op.epoch, op.request.key())).or_default().push(Item { call: op.call, ret: None, op: self.names.kv(&op.request) });
            flying_ops.entry((op.epoch, op.request.key())).or_default().push(op);
        }
        let mut steps = 0u64;
        let mut violation = self.order_broken;
        let mut undecided = Vec::new();
        for ((epoch, key), part) in &mut self.parts {
            let flight = flying.get(&(*epoch, key.as_str()));
            if !part.dirty && flight.is_none() {
                match part.outcome {
                    Outcome::Ok => continue,
                    Outcome::Violation => violation = true,
                    Outcome::Undecided => undecided.push(key.clone()),
                }
                continue;
            }
            if !part.serializable.is_empty() {
                let with_flying;
                let writes = match flying_ops.get(&(*epoch, key.as_str())) {
                    Some(f) => {
                        with_flying = part.writes.with_unknown(f.iter().copied());
                        &with_flying
                    }
                    None => &part.writes,
                };
                if part.serializable.iter().any(|&i| misread(&self.ops[i], writes, *epoch == 0).is_some()) {
                    part.outcome = Outcome::Violation;
                    part.dirty = false;
                    violation = true;
                    continue;
                }
            }
            if part.dirty {
                if let Err(()) = advance(part, horizon, &mut steps) {
                    part.outcome = Outcome::Violation;
                    part.dirty = false;
                    violation = true;
                    continue;
                }
            }
            part.outcome = search_tail(part, flight.map_or(&[][..], |f| &f[..]), self.bound, &mut steps);
            part.dirty = false;
            match part.outcome {
                Outcome::Ok => {}
                Outcome::Violation => violation = true,
                Outcome::Undecided => undecided.push(key.clone()),
            }
        }
        if violation {
            // Confirmed and worded by the whole check.
            let whole = self.whole(in_flight);
            if !matches!(whole.verdict, Verdict::Violation { .. }) {
                self.overturned += 1;
            }
            return whole;
        }
        let verdict = if undecided.is_empty() {
            Verdict::Linearizable
        } else {
            undecided.sort();
            let shown: Vec<&str> = undecided.iter().take(3).map(String::as_str).collect();
            Verdict::Undecided {
                message: format!(
                    "{} key(s) not decided within {} steps each (checked since their last quiet point): {}",
                    undecided.len(),
                    self.bound,
                    shown.join(", ")
                ),
                partitions: undecided.len(),
            }
        };
        Report { ops: self.ops.len() + in_flight.len(), partitions: self.parts.len(), steps, verdict }
    }

    /// The whole check of everything fed and in flight.
    fn whole(&self, in_flight: &[Operation]) -> Report {
        let mut ops = self.ops.clone();
        ops.extend(in_flight.iter().cloned());
        for op in &mut ops {
            if let Some(name) = op.member.as_ref().and_then(|m| self.members.get(m)) {
                op.member = Some(name.clone());
            }
        }
        let model = ops.first().map_or(ModelKind::Etcd, |o| o.request.model());
        check(&History { model, ops }, self.bound)
    }

    /// etcd's revisions against real time, for what was fed since the last check: each fresh
    /// request, and each older one sent after the earliest fresh answer (only those can have
    /// an answer before their call that is new).
    fn revision_order(&mut self) {
        let fresh = std::mem::take(&mut self.fresh);
        if fresh.is_empty() {
            return;
        }
        let mut by_epoch: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &i in &fresh {
            by_epoch.entry(self.ops[i].epoch).or_default().push(i);
        }
        for (epoch, fresh) in by_epoch {
            let Some(e) = self.epochs.get_mut(&epoch) else { continue };
            for k in e.stale_from..e.by_ret.len() {
                let (_, rev, i) = e.by_ret[k];
                let best = match k.checked_sub(1).map(|p| e.prefix_max[p]) {
                    Some((m, j)) if m >= rev => (m, j),
                    _ => (rev, i),
                };
                if k < e.prefix_max.len() {
                    e.prefix_max[k] = best;
                } else {
                    e.prefix_max.push(best);
                }
            }
            e.stale_from = e.by_ret.len();
            let earliest = fresh.iter().filter_map(|&i| self.ops[i].ret).min().unwrap_or(u64::MAX);
            let from = e.by_call.partition_point(|x| x.0 <= earliest);
            let mut judge: Vec<usize> = e.by_call[from..].iter().map(|x| x.1).collect();
            judge.extend(fresh.iter().copied());
            for i in judge {
                let op = &self.ops[i];
                let Some((rev, writes)) = revision_of(op) else { continue };
                let before = e.by_ret.partition_point(|x| x.0 < op.call);
                if before == 0 {
                    continue;
                }
                let (m, _) = e.prefix_max[before - 1];
                if rev < m || (writes && rev == m) {
                    self.order_broken = true;
                }
            }
        }
    }
}

/// Cuts `part` wherever it became quiescent before `horizon`, enumerating the end states at each
/// cut. `Err` when the operations before a cut cannot be ordered at all.
fn advance(part: &mut Part, horizon: u64, steps: &mut u64) -> Result<(), ()> {
    // Cut points: p such that every answer in tail[..p] came before every call in tail[p..]
    // and before the horizon.
    let n = part.tail.len();
    let mut suffix_min = vec![u64::MAX; n + 1];
    for k in (0..n).rev() {
        suffix_min[k] = suffix_min[k + 1].min(part.tail[k].call);
    }
    let mut cuts = Vec::new();
    let mut max_ret = 0u64;
    for (p, item) in part.tail.iter().enumerate() {
        if let Some(r) = item.ret {
            max_ret = max_ret.max(r);
        }
        if max_ret < suffix_min[p + 1] && max_ret < horizon {
            cuts.push((p + 1, max_ret));
        }
    }
    let mut from = 0;
    let mut outcome = Ok(());
    for (p, at) in cuts {
        match enumerate(part, from, p, steps) {
            Enumerated::Ends(configs, unknowns) => {
                part.configs = configs;
                part.unknowns = unknowns;
                part.cut = at.max(part.cut);
                from = p;
            }
            // Too much between these cuts: the tail keeps it, the search takes it.
            Enumerated::TooMuch => break,
            Enumerated::Impossible => {
                outcome = Err(());
                break;
            }
        }
    }
    // The configurations are those at the last cut taken: what came before it goes.
    part.tail.drain(..from);
    outcome
}

enum Enumerated {
    Ends(Vec<Config>, Vec<Item>),
    TooMuch,
    Impossible,
}

/// Every state `part.tail[from..to]` can end in from each of the part's configurations, with
/// the unknown operations still pending.
fn enumerate(part: &Part, from: usize, to: usize, steps: &mut u64) -> Enumerated {
    let segment = &part.tail[from..to];
    // The new list of unknowns: the old ones, then the segment's.
    let mut unknowns = part.unknowns.clone();
    let seg_unknown: Vec<u32> = segment
        .iter()
        .filter(|it| it.ret.is_none())
        .map(|it| {
            unknowns.push(it.clone());
            (unknowns.len() - 1) as u32
        })
        .collect();
    let mut ends: HashSet<Config> = HashSet::new();
    let mut budget = SEGMENT_STEPS;
    for config in &part.configs {
        // Items: the pending unknowns, then the segment (its unknowns mapped to their new index).
        let mut items: Vec<(&Item, Option<u32>)> = config.pending.iter().map(|&u| (&unknowns[u as usize], Some(u))).collect();
        let mut next_unknown = seg_unknown.iter();
        for it in segment {
            let u = if it.ret.is_none() { next_unknown.next().copied() } else { None };
            items.push((it, u));
        }
        if items.len() > SEGMENT {
            return Enumerated::TooMuch;
        }
        let known: u128 = items.iter().enumerate().filter(|(_, (it, _))| it.ret.is_some()).fold(0, |m, (k, _)| m | (1u128 << k));
        let mut seen: HashSet<(u128, State)> = HashSet::new();
        let mut stack: Vec<(u128, State)> = vec![(0, config.state.clone())];
        while let Some((placed, state)) = stack.pop() {
            if budget == 0 {
                return Enumerated::TooMuch;
            }
            budget -= 1;
            *steps += 1;
            if placed & known == known {
                let pending: Vec<u32> = items
                    .iter()
                    .enumerate()
                    .filter(|(k, (it, u))| placed & (1u128 << k) == 0 && u.is_some() && may_still_apply(&state, &it.op))
                    .filter_map(|(_, (_, u))| *u)
                    .collect();
                ends.insert(Config { state, pending });
                continue;
            }
            for (k, (it, _)) in items.iter().enumerate() {
                if placed & (1u128 << k) != 0 {
                    continue;
                }
                // k may come next if no unplaced answered operation was answered before k was sent.
                let blocked =
                    items.iter().enumerate().any(|(j, (o, _))| j != k && placed & (1u128 << j) == 0 && o.ret.is_some_and(|r| r < it.call));
                if blocked {
                    continue;
                }
                for s in Kv.step(&state, &it.op) {
                    // An unknown operation that changes nothing now is one still pending.
                    if it.ret.is_none() && s == state {
                        continue;
                    }
                    let with = placed | (1u128 << k);
                    if seen.insert((with, s.clone())) {
                        stack.push((with, s));
                    }
                }
            }
        }
    }
    if ends.is_empty() {
        return Enumerated::Impossible;
    }
    // A configuration whose pending set another with the same state contains adds nothing.
    let ends: Vec<Config> = ends.into_iter().collect();
    let mut kept: Vec<Config> = ends
        .iter()
        .filter(|c| {
            !ends.iter().any(|d| d.state == c.state && d.pending.len() > c.pending.len() && c.pending.iter().all(|u| d.pending.contains(u)))
        })
        .cloned()
        .collect();
    if kept.len() > CONFIGS {
        return Enumerated::TooMuch;
    }
    // Unknowns no configuration keeps pending are gone for good: renumber the rest.
    let mut used: Vec<u32> = kept.iter().flat_map(|c| c.pending.iter().copied()).collect();
    used.sort_unstable();
    used.dedup();
    let renumber: HashMap<u32, u32> = used.iter().enumerate().map(|(new, &old)| (old, new as u32)).collect();
    for c in &mut kept {
        for u in &mut c.pending {
            *u = renumber[u];
        }
        c.pending.sort_unstable();
    }
    let unknowns = used.iter().map(|&u| unknowns[u as usize].clone()).collect();
    Enumerated::Ends(kept, unknowns)
}

/// Whether the operations after the cut, and those in flight, are linearisable from one of the
/// cut's configurations.
fn search_tail(part: &Part, in_flight: &[Item], bound: u64, steps: &mut u64) -> Outcome {
    let mut outcome = Outcome::Violation;
    for config in &part.configs {
        let timed: Vec<Timed<'_, KvOp>> = config
            .pending
            .iter()
            .map(|&u| &part.unknowns[u as usize])
            .chain(&part.tail)
            .chain(in_flight)
            .map(|it| Timed { call: it.call, ret: it.ret, op: &it.op })
            .collect();
        let (search, taken) = linearizable(&Kv, config.state.clone(), &timed, bound);
        *steps += taken;
        match search {
            Search::Ok => return Outcome::Ok,
            Search::Undecided { .. } => outcome = Outcome::Undecided,
            Search::Impossible { .. } => {}
        }
    }
    outcome
}
