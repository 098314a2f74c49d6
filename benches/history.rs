//! `cargo bench --bench history`: the history checker's throughput (operations checked per
//! second) on etcd histories of 10k, 100k and 1M operations, median of 3 runs each, beside a
//! reference measured in the same run: reading the same history from its file (`History::parse`).
//!
//! The histories are drawn from a correct store with the kube workload's shape: clients creating,
//! updating and deleting shared keys with transactions guarded by the key's mod revision (some
//! refused, some of unknown outcome), and reads; about 8 requests in flight at any instant.
//! `SHAKEDOWN_BENCH_SIZES` (default `10000,100000,1000000`) and `SHAKEDOWN_BENCH_KEYS` (default
//! 500, the kube workload's keyspace) change them.
//!
//! Then the check after every step, as a run makes it: a 10-minute history at 1,000 requests
//! a second (the local workload reaches 300–1,000), 2-second steps, each check judging what
//! ended since the last one with what is still in flight (`Incremental`): median and p99 per
//! check, beside the whole check of the same history at ten of those steps (the reference).
//! `SHAKEDOWN_BENCH_MINUTES` (default 10) changes the length. Writes `target/bench/history.json`.

use std::collections::HashMap;
use std::time::Instant;

use shakedown::history::format::{Kv, ReadAnswer, Request, Then, TxnAnswer};
use shakedown::history::{check, History, Incremental, ModelKind, Operation, Verdict, DEFAULT_BOUND};

/// splitmix64: a fixed stream, so every run checks the same histories.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn history(n: usize, keys: u64, clients: u64) -> History {
    let mut rng = Rng(n as u64);
    let mut rev = 1i64;
    // key → (value, mod, create, version)
    let mut store: HashMap<u64, (String, i64, i64, i64)> = HashMap::new();
    let mut ops = Vec::with_capacity(n);
    for i in 0..n {
        // Each request takes effect 10 µs after the previous one, inside an interval of up to
        // 80 µs around that instant.
        let point = 100 + 10 * i as u64;
        let (call, ret) = (point - rng.below(40), point + rng.below(40));
        let k = rng.below(keys);
        let key = format!("/o/{k:06}");
        let kv = |s: &HashMap<u64, (String, i64, i64, i64)>| {
            s.get(&k).map(|(v, m, c, n)| Kv { value: v.clone(), mod_revision: *m, create_revision: Some(*c), version: Some(*n) })
        };
        let request = if rng.below(10) < 3 {
            Request::Get { key, serializable: false, answer: Some(ReadAnswer { revision: rev, kv: kv(&store) }) }
        } else {
            let current = store.get(&k).map_or(0, |e| e.1);
            // A guard on the current revision most of the time, a stale one otherwise.
            let expect = if rng.below(10) == 0 { (current - 1).max(0) } else { current };
            let then = if current != 0 && rng.below(5) == 0 { Then::Delete } else { Then::Put(format!("c{}-{i}", i as u64 % clients)) };
            let unknown = rng.below(50) == 0;
            let answer = if expect == current {
                let applies = !unknown || rng.below(2) == 0;
                let before = kv(&store);
                rev += 1;
                if applies {
                    match &then {
                        Then::Put(v) => {
                            let (c, n) = before.map_or((rev, 1), |b| (b.create_revision.unwrap_or(rev), b.version.unwrap_or(0) + 1));
                            store.insert(k, (v.clone(), rev, c, n));
                        }
                        Then::Delete => {
                            store.remove(&k);
                        }
                    }
                } else {
                    rev -= 1;
                }
                TxnAnswer { succeeded: true, revision: rev, kv: None }
            } else {
                TxnAnswer { succeeded: false, revision: rev, kv: kv(&store) }
            };
            Request::Txn { key, if_mod_revision: expect, then, answer: (!unknown).then_some(answer) }
        };
        ops.push(Operation { client: i as u64 % clients, member: None, epoch: 0, group: None, call, ret: Some(ret), request });
    }
    History { model: ModelKind::Etcd, ops }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The process's peak resident memory (MiB), from /proc.
fn peak_mib() -> Option<f64> {
    status_mib("VmHWM:")
}

/// A memory field of /proc/self/status, in MiB.
fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status.lines().find_map(|l| l.strip_prefix(field))?.trim().trim_end_matches(" kB").trim().parse().ok()?;
    Some(kb / 1024.0)
}

/// Resets the peak resident memory to the current one (Linux ≥ 4.0): what follows is measured
/// alone.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn main() {
    let sizes: Vec<usize> = std::env::var("SHAKEDOWN_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);
    let keys: u64 = std::env::var("SHAKEDOWN_BENCH_KEYS").ok().and_then(|s| s.parse().ok()).unwrap_or(500);
    let mut rows = Vec::new();
    println!(
        "{:>10}  {:>14}  {:>12}  {:>12}  {:>10}  {:>9}",
        "operations", "checked ops/s", "check (ms)", "parse (ms)", "check/parse", "peak MiB"
    );
    for &n in &sizes {
        let h = history(n, keys, 16);
        let text = h.to_jsonl();
        let (mut checks, mut parses) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let t = Instant::now();
            let parsed = History::parse(&text).expect("the bench writes valid histories");
            parses.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            let report = check(&parsed, DEFAULT_BOUND);
            checks.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(report.verdict, Verdict::Linearizable, "a correct store's history: {}", report.summary());
        }
        let (check_ms, parse_ms) = (median(&mut checks), median(&mut parses));
        let rate = n as f64 / (check_ms / 1000.0);
        let peak = peak_mib().unwrap_or(f64::NAN);
        println!("{n:>10}  {rate:>14.0}  {check_ms:>12.1}  {parse_ms:>12.1}  {:>10.2}  {peak:>9.0}", check_ms / parse_ms);
        rows.push(serde_json::json!({"operations": n, "keys": keys, "checked_ops_per_s": rate, "check_ms": check_ms, "parse_ms": parse_ms, "peak_mib": peak}));
    }
    let minutes: u64 = std::env::var("SHAKEDOWN_BENCH_MINUTES").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let steps = stepwise(minutes, keys);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let out = serde_json::json!({"whole": rows, "per_step": steps});
    let _ = std::fs::write(dir.join("history.json"), serde_json::to_string_pretty(&out).unwrap());
}

/// Microseconds between two requests at 1,000 a second (the generator's instants are 10 µs
/// apart: scaled by 100).
const SCALE: u64 = 100;
/// A step's length (µs).
const STEP_US: u64 = 2_000_000;

fn unanswered(r: &Request) -> Request {
    match r.clone() {
        Request::Txn { key, if_mod_revision, then, .. } => Request::Txn { key, if_mod_revision, then, answer: None },
        Request::Get { key, serializable, .. } => Request::Get { key, serializable, answer: None },
        other => other,
    }
}

/// The check after every step of a `minutes`-long run: per-step times of the incremental check,
/// and of the whole check at ten steps.
fn stepwise(minutes: u64, keys: u64) -> serde_json::Value {
    let n = (minutes * 60 * 1000) as usize;
    let empty = status_mib("VmRSS:");
    let mut h = history(n, keys, 16);
    // One copy of the history in memory, as a run holds it.
    let one_copy = status_mib("VmRSS:").zip(empty).map(|(a, b)| a - b).unwrap_or(f64::NAN);
    for o in &mut h.ops {
        o.call *= SCALE;
        o.ret = o.ret.map(|r| r * SCALE);
    }
    let end = |o: &Operation| o.ret.unwrap_or(o.call);
    let mut by_end: Vec<&Operation> = h.ops.iter().collect();
    by_end.sort_by_key(|o| end(o));
    let last = end(by_end[by_end.len() - 1]);
    let count = last / STEP_US + 1;
    let whole_at: Vec<u64> = (1..=10).map(|k| k * count / 10).collect();
    let mut inc = Incremental::new(DEFAULT_BOUND);
    let (mut fed, mut by_call) = (0usize, 0usize);
    let mut calls: Vec<&Operation> = h.ops.iter().collect();
    calls.sort_by_key(|o| o.call);
    let (mut per_step, mut whole) = (Vec::new(), Vec::new());
    let mut whole_mib = None;
    let started = Instant::now();
    for k in 1..=count {
        let t = k * STEP_US;
        let upto = by_end.partition_point(|o| end(o) <= t);
        while by_call < calls.len() && calls[by_call].call <= t {
            by_call += 1;
        }
        // In flight: sent by t, not ended by t (few: scan back from the last call).
        let in_flight: Vec<Operation> = calls[..by_call]
            .iter()
            .rev()
            .take(64)
            .filter(|o| end(o) > t)
            .map(|o| Operation { ret: None, request: unanswered(&o.request), ..(*o).clone() })
            .collect();
        let horizon = in_flight.iter().map(|o| o.call).min().unwrap_or(t);
        let clock = Instant::now();
        inc.feed(by_end[fed..upto].iter().map(|o| (*o).clone()));
        fed = upto;
        let report = inc.check(&in_flight, horizon);
        per_step.push(clock.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(report.verdict, Verdict::Linearizable, "step {k}: {}", report.summary());
        if whole_at.contains(&k) {
            let mut ops: Vec<Operation> = by_end[..upto].iter().map(|o| (*o).clone()).collect();
            ops.extend(in_flight);
            let history = History { model: ModelKind::Etcd, ops };
            // The last one's memory, measured alone: the peak above what the process held
            // before it (the history itself, the incremental checker's state).
            let before = (k == count && reset_peak()).then(|| status_mib("VmRSS:")).flatten();
            let clock = Instant::now();
            let report = check(&history, DEFAULT_BOUND);
            whole.push(clock.elapsed().as_secs_f64() * 1000.0);
            if let (Some(before), Some(peak)) = (before, peak_mib()) {
                whole_mib = Some((peak - before, before));
            }
            assert_eq!(report.verdict, Verdict::Linearizable, "step {k}: {}", report.summary());
        }
    }
    let total = started.elapsed().as_secs_f64();
    let mut sorted = per_step.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p99 = sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)];
    let med = median(&mut per_step);
    let whole_last = *whole.last().unwrap_or(&f64::NAN);
    let whole_med = median(&mut whole);
    println!();
    println!(
        "check after every {} s step of a {minutes}-minute history at 1000 requests/s ({n} requests, {count} steps):",
        STEP_US / 1_000_000
    );
    println!("  incremental: median {med:.2} ms, p99 {p99:.2} ms, max {:.2} ms", sorted[sorted.len() - 1]);
    println!("  whole check at ten of the steps (reference): median {whole_med:.1} ms, at the last step {whole_last:.1} ms");
    println!("  whole/incremental (medians): {:.0}x; bench wall time {total:.1} s", whole_med / med);
    let (added, held) = whole_mib.unwrap_or((f64::NAN, f64::NAN));
    println!("  memory: the history itself {one_copy:.0} MiB; the whole check at the last step peaks {added:.0} MiB above the {held:.0} MiB the bench held before it (copies of the history, the incremental state)");
    serde_json::json!({"minutes": minutes, "requests": n, "steps": count, "median_ms": med, "p99_ms": p99, "whole_median_ms": whole_med, "whole_last_ms": whole_last, "history_mib": one_copy, "whole_last_added_mib": added, "held_before_mib": held})
}
