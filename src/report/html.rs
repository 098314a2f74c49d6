//! The self-contained HTML report of a run: outcome, an SVG plot of workload latency and
//! availability over time with the fault windows shaded (after Jepsen's latency plots), the
//! timeline of ops with every invariant's verdict, and the plan. No scripts, no external assets.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use shakedown_faults::{Model, Op, OpKind, Plan, Profile};

use crate::events::{self, Check, CheckVerdict, Event, RunOutcome};
use crate::targets::TargetSpec;

/// Everything the report shows, read from a run directory.
#[derive(Debug, Default)]
struct RunData {
    seed: Option<u64>,
    profile: Option<Profile>,
    plan: Option<Plan>,
    run_id: String,
    bug: Option<String>,
    t0: u64,
    t_end: u64,
    steps: BTreeMap<usize, Step>,
    /// (unix ms, op text) of each healing op.
    heals: Vec<(u64, Op)>,
    liveness: Option<Check>,
    bring_up_ms: Option<u64>,
    outcome: Option<RunOutcome>,
    failure: Option<(String, String)>,
    forensics: Vec<String>,
    skipped: Vec<(usize, String, String)>,
    unchecked: Vec<(shakedown_invariants::InvariantId, String)>,
    /// Known defects of the stack's releases the checks saw: (defect, what it is, what was seen).
    known: Vec<(String, String, String)>,
    /// What the target said at its start (`local · versions 3.4, 3.5`).
    target: Option<String>,
    /// Whether the target runs etcd of its own (the local target: etcd's flags apply).
    runs_etcd: bool,
    /// Each component's version, from the bring-up.
    versions: BTreeMap<String, String>,
    /// The machine the run ran on.
    machine: BTreeMap<String, String>,
}

/// How a failing run is got back: its seed record and the command that replays it.
#[derive(Debug, Clone, Copy)]
pub struct Replay<'a> {
    pub record: &'a Path,
    pub command: &'a str,
}

#[derive(Debug, Default, Clone)]
struct Step {
    op: Option<Op>,
    text: String,
    family: String,
    start: u64,
    op_ms: Option<u64>,
    op_error: Option<String>,
    check: Option<Check>,
}

/// One write of the workload.
#[derive(Debug, Clone, Copy)]
struct Write {
    at: u64,
    latency_us: u32,
    ok: bool,
}

/// Builds the report of the run in `run_dir` (`events.jsonl`, `workload.csv`, `plan.toml`,
/// `profile.toml`); a failing run's report says how to replay it when a record was written.
pub fn run_report(run_dir: &Path, replay: Option<Replay<'_>>) -> Result<String, events::EventsError> {
    let data = read_run(run_dir)?;
    let writes = read_writes(&run_dir.join("workload.csv"));
    // The Kubernetes API workload's requests (the control-plane stack, the kube target's [api]).
    let api = read_writes(&run_dir.join("api-workload.csv"));
    let mut html = render(&data, &writes, &api, replay);
    if let Some(section) = history_window(&data, run_dir) {
        // After the failure's own paragraph: before the workload section.
        if let Some(at) = html.find("<h2>Workload</h2>") {
            html.insert_str(at, &section);
        }
    }
    Ok(html)
}

/// For a run that failed `linearizability`, the requests that cannot be ordered, drawn from the
/// run's `history.jsonl` (checked again whole: the finding the run stopped at, or the first one).
fn history_window(d: &RunData, run_dir: &Path) -> Option<String> {
    let (inv, _) = d.failure.as_ref()?;
    let file = match inv.as_str() {
        "linearizability" => "history.jsonl",
        "api-linearizability" => "api-history.jsonl",
        "app-linearizability" => "app-history.jsonl",
        _ => return None,
    };
    let text = std::fs::read_to_string(run_dir.join(file)).ok()?;
    let h = crate::history::History::parse(&text).ok()?;
    let report = crate::history::check(&h, crate::history::DEFAULT_BOUND);
    let crate::history::Verdict::Violation { first, .. } = &report.verdict else { return None };
    let svg = super::window::svg(&h, first)?;
    Some(format!(
        r#"<h2>The requests that cannot be ordered</h2><p class="legend">clients as rows, each request a bar from its call to its answer (dashed: no answer) · <span style="background:#e66">&nbsp;the one no order can place&nbsp;</span> <span style="background:#f4b860">&nbsp;the others the finding names&nbsp;</span> <span style="background:#cfd8e3">&nbsp;the same key's other requests&nbsp;</span> · hover a bar for the request</p>{svg}<p class="muted">{}</p>"#,
        esc(&report.summary())
    ))
}

fn read_run(dir: &Path) -> Result<RunData, events::EventsError> {
    let lines = events::read(&dir.join("events.jsonl"))?;
    let mut d = RunData {
        plan: std::fs::read_to_string(dir.join("plan.toml")).ok().and_then(|t| toml::from_str(&t).ok()),
        profile: std::fs::read_to_string(dir.join("profile.toml")).ok().and_then(|t| Profile::from_toml(&t).ok()),
        ..RunData::default()
    };
    for line in lines {
        let ts = line.ts_ms;
        if d.t0 == 0 {
            d.t0 = ts;
        }
        d.t_end = d.t_end.max(ts);
        match line.event {
            Event::RunStart { seed, run_id, target, .. } => {
                d.seed = Some(seed);
                d.run_id = run_id;
                d.target = Some(target.describe());
                d.runs_etcd = matches!(target, TargetSpec::Local(_));
                d.bug = match target {
                    TargetSpec::Local(l) => l.testbed_bug.map(|b| b.to_string()),
                    _ => None,
                };
            }
            Event::BringUp { ms, versions, machine, .. } => {
                d.bring_up_ms = Some(ms);
                d.versions = versions;
                d.machine = machine;
            }
            Event::Unchecked { invariants, .. } => d.unchecked = invariants,
            Event::OpStart { step, op, text, family } => {
                let s = d.steps.entry(step).or_default();
                s.op = Some(op);
                s.text = text;
                s.family = family.to_string();
                s.start = ts;
            }
            Event::OpEnd { step, ms, error } => {
                let s = d.steps.entry(step).or_default();
                s.op_ms = Some(ms);
                s.op_error = error;
            }
            Event::OpSkipped { step, op, reason } => d.skipped.push((step, op.to_string(), reason)),
            Event::Check(c) => {
                let n = c.step;
                let t0 = d.t0;
                let s = d.steps.entry(n).or_default();
                if n == 0 {
                    s.text = "bring-up".into();
                    s.start = t0;
                }
                if c.verdict == CheckVerdict::Fail {
                    d.failure = Some((c.invariant.map(|i| i.to_string()).unwrap_or_default(), c.message.clone().unwrap_or_default()));
                }
                s.check = Some(c);
            }
            Event::Heal { op, .. } => d.heals.push((ts, op)),
            Event::Liveness(c) => {
                if c.verdict == CheckVerdict::Fail {
                    d.failure = Some((
                        format!("liveness{}", c.invariant.map(|i| format!(" ({i})")).unwrap_or_default()),
                        c.message.clone().unwrap_or_default(),
                    ));
                }
                d.liveness = Some(c);
            }
            Event::Forensics { files, .. } => d.forensics = files,
            Event::RunEnd { outcome, .. } => d.outcome = Some(outcome),
            // An event log from before `seen` and `about`: the whole message is what was seen.
            Event::KnownDefect { defect, message, seen, about, .. } => {
                d.known.push(if seen.is_empty() { (defect, String::new(), message) } else { (defect, about, seen) })
            }
            Event::Stopped { .. } | Event::Teardown { .. } | Event::Target { .. } => {}
        }
    }
    Ok(d)
}

/// Workload samples; a missing or torn file gives what could be read.
fn read_writes(path: &Path) -> Vec<Write> {
    let Ok(text) = std::fs::read_to_string(path) else { return vec![] };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut it = l.split(',');
            let at = it.next()?.parse().ok()?;
            let latency_us = it.next()?.parse::<u64>().ok()?.min(u32::MAX as u64) as u32;
            let ok = it.next()? == "1";
            Some(Write { at, latency_us, ok })
        })
        .collect()
}

pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Intervals (start, end, what is down) during which the model says a fault is in effect.
fn fault_windows(d: &RunData) -> Vec<(u64, u64, String)> {
    let Some(profile) = &d.profile else { return vec![] };
    let mut model: Model = match &d.plan {
        Some(plan) => plan.run_profile(profile).initial_model(),
        None => profile.initial_model(),
    };
    let mut changes: Vec<(u64, Op)> = d.steps.values().filter_map(|s| s.op.clone().map(|o| (s.start, o))).collect();
    changes.extend(d.heals.iter().cloned());
    changes.sort_by_key(|(t, _)| *t);
    let mut windows = Vec::new();
    let mut open: Option<(u64, String)> = None;
    for (t, op) in changes {
        if model.apply(&op).is_err() {
            continue;
        }
        let down = degraded(&model);
        match (&open, down) {
            (None, Some(what)) => open = Some((t, what)),
            (Some((start, what)), None) => {
                windows.push((*start, t, what.clone()));
                open = None;
            }
            (Some((start, prev)), Some(what)) if *prev != what => {
                windows.push((*start, t, prev.clone()));
                open = Some((t, what));
            }
            _ => {}
        }
    }
    if let Some((start, what)) = open {
        windows.push((start, d.t_end, what));
    }
    // Ops that take members down while they run and leave the model whole when done (a restore
    // stops every member; a rolling op one at a time; a partition until snapshot cuts one off; a
    // failpoint stalls one, and after a panic the model has it down anyway).
    for st in d.steps.values() {
        let (Some(op), Some(ms)) = (&st.op, st.op_ms) else { continue };
        let what = match op.kind() {
            OpKind::Restore => "every member stopped and restored from the backup",
            OpKind::RestorePitr => "the cluster restored from the backup and recovered to an instant after it",
            OpKind::RollingUpgrade | OpKind::RollingReplace => "one member at a time stopped and replaced",
            OpKind::DiskReplace => "a member stopped for a new disk",
            OpKind::PartitionUntilSnapshot => "a member's raft traffic cut",
            OpKind::Failpoint => "a member driven to one of etcd's failpoints (stalled there, or cut off until the leader's snapshot)",
            _ => continue,
        };
        windows.push((st.start, st.start + ms.max(1), format!("{}: {what}", st.text)));
    }
    windows.sort_by_key(|w| w.0);
    windows
}

/// What the model has down, or `None` when everything is up.
fn degraded(m: &Model) -> Option<String> {
    let mut parts: Vec<String> =
        m.members.values().filter(|x| !m.is_up(x)).map(|x| format!("{} {:?}/{:?}", x.id, x.state, x.disk).to_lowercase()).collect();
    parts.extend(m.outages.iter().map(|(s, mode)| format!("site {} {mode:?}", s.0).to_lowercase()));
    (!parts.is_empty()).then(|| parts.join(", "))
}

const W: f64 = 1000.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const LAT_TOP: f64 = 20.0;
const LAT_H: f64 = 220.0;
const AV_TOP: f64 = 270.0;
const AV_H: f64 = 80.0;
const BINS: usize = 500;

fn plot(d: &RunData, writes: &[Write], api: &[Write]) -> String {
    let t0 = d.t0;
    let t1 = d.t_end.max(writes.last().map_or(0, |w| w.at)).max(t0 + 1);
    let span = (t1 - t0) as f64;
    let x = |t: u64| LEFT + (t.saturating_sub(t0) as f64 / span) * (W - LEFT - RIGHT);
    // Latency: log scale from 0.1 ms to the largest latency (at least 1 s).
    let max_ms = writes.iter().map(|w| w.latency_us as f64 / 1000.0).fold(1000.0, f64::max);
    let (lo, hi) = (0.1f64.log10(), max_ms.log10());
    let y = |ms: f64| LAT_TOP + LAT_H - ((ms.max(0.1).log10() - lo) / (hi - lo)) * LAT_H;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} 380" width="100%" role="img" aria-label="workload latency and availability over time">"#
    );
    s.push_str(r#"<style>text{font:11px sans-serif;fill:#333} .ax{stroke:#999;stroke-width:1} .grid{stroke:#eee} </style>"#);
    // Fault windows, shaded on both panels.
    for (a, b, what) in fault_windows(d) {
        let (xa, xb) = (x(a), x(b).max(x(a) + 1.0));
        let _ = write!(
            s,
            r##"<rect x="{xa:.1}" y="{LAT_TOP}" width="{:.1}" height="{:.1}" fill="#f4a6a6" fill-opacity="0.35"><title>{}: {:.1}s–{:.1}s</title></rect>"##,
            xb - xa,
            AV_TOP + AV_H - LAT_TOP,
            esc(&what),
            (a - t0) as f64 / 1000.0,
            (b - t0) as f64 / 1000.0
        );
    }
    // Grid and axes.
    let mut decade = 0.1f64;
    while decade <= max_ms * 1.0001 {
        let yy = y(decade);
        let label = if decade < 1.0 { format!("{decade}") } else { format!("{}", decade as u64) };
        let _ = write!(
            s,
            r#"<line class="grid" x1="{LEFT}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
            W - RIGHT,
            LEFT - 4.0,
            yy + 4.0
        );
        decade *= 10.0;
    }
    let _ = write!(
        s,
        r#"<text x="12" y="{:.1}" transform="rotate(-90 12 {:.1})" text-anchor="middle">write latency (ms, log)</text>"#,
        LAT_TOP + LAT_H / 2.0,
        LAT_TOP + LAT_H / 2.0
    );
    let _ = write!(
        s,
        r#"<text x="12" y="{:.1}" transform="rotate(-90 12 {:.1})" text-anchor="middle">ok %</text>"#,
        AV_TOP + AV_H / 2.0,
        AV_TOP + AV_H / 2.0
    );
    let ticks = 10;
    for i in 0..=ticks {
        let t = t0 + (span as u64 * i / ticks);
        let _ = write!(
            s,
            r#"<line class="ax" x1="{0:.1}" x2="{0:.1}" y1="{1:.1}" y2="{2:.1}"/><text x="{0:.1}" y="{3:.1}" text-anchor="middle">{4}s</text>"#,
            x(t),
            AV_TOP + AV_H,
            AV_TOP + AV_H + 4.0,
            AV_TOP + AV_H + 16.0,
            seconds((t - t0) as f64 / 1000.0, span)
        );
    }
    let _ = write!(
        s,
        r#"<line class="ax" x1="{LEFT}" x2="{LEFT}" y1="{LAT_TOP}" y2="{:.1}"/><line class="ax" x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}"/>"#,
        AV_TOP + AV_H,
        W - RIGHT,
        AV_TOP + AV_H,
        AV_TOP + AV_H
    );
    // Op starts: a tick with the step number.
    for (n, st) in d.steps.iter().filter(|(n, s)| **n > 0 && s.start > 0) {
        let xx = x(st.start);
        let failed = st.check.as_ref().is_some_and(|c| c.verdict == CheckVerdict::Fail) || st.op_error.is_some();
        let colour = if failed { "#c00" } else { "#555" };
        let _ = write!(
            s,
            r#"<line x1="{xx:.1}" x2="{xx:.1}" y1="{LAT_TOP}" y2="{:.1}" stroke="{colour}" stroke-dasharray="2,3" stroke-width="0.6"><title>step {n}: {}</title></line>"#,
            LAT_TOP + 6.0,
            esc(&st.text)
        );
    }
    // Latency per bin: the median (dot) and the maximum (bar) of acknowledged writes; failed
    // writes as red marks at the top. Availability: share of writes acknowledged per bin.
    let width = span / BINS as f64;
    let mut bins: Vec<(Vec<u32>, u32, u32)> = vec![(Vec::new(), 0, 0); BINS];
    for w in writes {
        let i = (((w.at.saturating_sub(t0)) as f64 / width) as usize).min(BINS - 1);
        let b = &mut bins[i];
        b.2 += 1;
        if w.ok {
            b.0.push(w.latency_us);
            b.1 += 1;
        }
    }
    for (i, (lat, ok, all)) in bins.iter_mut().enumerate() {
        if *all == 0 {
            continue;
        }
        let xx = LEFT + (i as f64 + 0.5) / BINS as f64 * (W - LEFT - RIGHT);
        if !lat.is_empty() {
            lat.sort_unstable();
            let med = lat[lat.len() / 2] as f64 / 1000.0;
            let max = *lat.last().unwrap_or(&0) as f64 / 1000.0;
            let _ = write!(
                s,
                r##"<line x1="{xx:.1}" x2="{xx:.1}" y1="{:.1}" y2="{:.1}" stroke="#7aa6d8" stroke-width="1"/><circle cx="{xx:.1}" cy="{:.1}" r="1.3" fill="#1f5fa8"/>"##,
                y(med),
                y(max),
                y(med)
            );
        }
        if *ok < *all {
            let _ = write!(
                s,
                r##"<rect x="{:.1}" y="{LAT_TOP}" width="2" height="4" fill="#c00"><title>{} failed writes</title></rect>"##,
                xx - 1.0,
                *all - *ok
            );
        }
    }
    // Availability: the etcd workload's share of acknowledged writes per bin (green), and the API
    // workload's share of answered requests (purple, dashed) where there is one.
    for (series, colour, dash) in [(writes, "#2a8a2a", ""), (api, "#7b3fa0", r#" stroke-dasharray="4,2""#)] {
        for line in availability(series, t0, span).iter().filter(|l| !l.is_empty()) {
            let _ = write!(s, r##"<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.2"{dash}/>"##);
        }
    }
    if !api.is_empty() {
        let _ = write!(
            s,
            r##"<line x1="{0:.1}" x2="{1:.1}" y1="{2:.1}" y2="{2:.1}" stroke="#2a8a2a" stroke-width="1.2"/><text x="{3:.1}" y="{4:.1}">etcd writes</text><line x1="{5:.1}" x2="{6:.1}" y1="{2:.1}" y2="{2:.1}" stroke="#7b3fa0" stroke-width="1.2" stroke-dasharray="4,2"/><text x="{7:.1}" y="{4:.1}">API requests</text>"##,
            W - RIGHT - 200.0,
            W - RIGHT - 180.0,
            AV_TOP - 14.0,
            W - RIGHT - 176.0,
            AV_TOP - 10.0,
            W - RIGHT - 100.0,
            W - RIGHT - 80.0,
            W - RIGHT - 76.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}">100</text><text x="{:.1}" y="{:.1}">0</text>"#,
        LEFT - 22.0,
        AV_TOP + 4.0,
        LEFT - 12.0,
        AV_TOP + AV_H
    );
    s.push_str("</svg>");
    s
}

/// The share of requests answered per bin, as polyline point lists; a line breaks where no request
/// started (a request hanging until its deadline).
fn availability(series: &[Write], t0: u64, span: f64) -> Vec<String> {
    let width = span / BINS as f64;
    let mut bins = vec![(0u32, 0u32); BINS];
    for w in series {
        let i = (((w.at.saturating_sub(t0)) as f64 / width) as usize).min(BINS - 1);
        bins[i].1 += 1;
        bins[i].0 += u32::from(w.ok);
    }
    let mut lines: Vec<String> = vec![String::new()];
    for (i, (ok, all)) in bins.into_iter().enumerate() {
        if all == 0 {
            if !lines.last().is_some_and(|l| l.is_empty()) {
                lines.push(String::new());
            }
            continue;
        }
        let xx = LEFT + (i as f64 + 0.5) / BINS as f64 * (W - LEFT - RIGHT);
        let share = ok as f64 / all as f64;
        if let Some(line) = lines.last_mut() {
            let _ = write!(line, "{xx:.1},{:.1} ", AV_TOP + AV_H - share * AV_H);
        }
    }
    lines
}

/// Axis label: whole seconds on long runs, tenths on short ones.
fn seconds(s: f64, span_ms: f64) -> String {
    if span_ms >= 60_000.0 {
        format!("{s:.0}")
    } else {
        format!("{s:.1}")
    }
}

fn render(d: &RunData, writes: &[Write], api: &[Write], replay: Option<Replay<'_>>) -> String {
    let mut h = String::with_capacity(64 * 1024 + d.steps.len() * 600);
    let title = format!(
        "shakedown · seed {} · {}",
        d.seed.map(|s| s.to_string()).unwrap_or("?".into()),
        d.profile.as_ref().map_or("", |p| p.name.as_str())
    );
    let (verdict, class) = match (&d.failure, d.outcome) {
        (Some(_), _) => ("FAIL", "fail"),
        (None, Some(RunOutcome::Pass)) => ("PASS", "pass"),
        (None, Some(RunOutcome::Stopped)) => ("STOPPED", "skip"),
        (None, Some(RunOutcome::Interrupted)) => ("INTERRUPTED", "skip"),
        _ => ("UNFINISHED", "skip"),
    };
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{}</title><style>
body{{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}}
h1{{font-size:20px}} h2{{font-size:16px;margin-top:28px}}
.badge{{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:bold}}
.pass{{background:#2a8a2a}} .fail{{background:#c00}} .skip{{background:#888}}
table{{border-collapse:collapse;font-size:13px}} td,th{{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top}}
td.n{{text-align:right;font-variant-numeric:tabular-nums}}
th.ih{{height:110px;vertical-align:bottom;padding:0 1px;font-weight:normal;font-size:11px}} th.ih div{{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap}}
td.iv{{text-align:center;padding:3px 1px;font-size:11px;color:#fff;min-width:14px}}
td.iv.pass{{background:#6c6}} td.iv.fail{{background:#e66}} td.iv.definite{{background:#a00}}
.box{{border-left:4px solid #c00;background:#fff6f6;padding:6px 12px;margin:12px 0}} .box p{{margin:4px 0}}
dl.facts{{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;font-size:13px}} dl.facts dt{{color:#666}} dl.facts dd{{margin:0}}
tr.failed td{{background:#fff0f0}} .muted{{color:#999}} code{{font-size:12px}} li.failedop{{color:#c00}}
.legend span{{margin-right:16px}}
</style></head><body>"#,
        esc(&title)
    );
    let _ = write!(h, r#"<h1>{} <span class="badge {class}">{verdict}</span></h1>"#, esc(&title));
    let _ = write!(h, "<p>run <code>{}</code>", esc(&d.run_id));
    if let Some(b) = &d.bug {
        let _ = write!(h, " · planted bug <code>{}</code>", esc(b));
    }
    if let Some(p) = &d.plan {
        let weights: Vec<String> = p.weights.iter().map(|(k, w)| format!("{k}={w}")).collect();
        let _ = write!(h, " · {} ops · weights <code>{}</code>", p.ops.len(), esc(&weights.join(" ")));
        let etcd = d.profile.as_ref().filter(|_| d.runs_etcd).map(|profile| p.etcd_flags(profile).summary()).unwrap_or_default();
        if !etcd.is_empty() {
            let _ = write!(h, " · etcd <code>{}</code>", esc(&etcd));
        }
    }
    let _ = write!(h, " · {:.1}s", (d.t_end.saturating_sub(d.t0)) as f64 / 1000.0);
    if let Some(ms) = d.bring_up_ms {
        let _ = write!(h, " · bring-up {ms}ms");
    }
    h.push_str("</p>");
    if let Some((inv, msg)) = &d.failure {
        let _ = write!(h, r#"<div class="box"><p><b>{}</b>: {}</p>"#, esc(inv), esc(msg));
        match replay {
            Some(r) => {
                let _ = write!(
                    h,
                    r#"<p>replay it: <code>{}</code></p><p>seed record: <code>{}</code> (the seed, the profile and the exact ops; <code>shakedown shrink</code> it to the ops that matter)</p>"#,
                    esc(r.command),
                    esc(&r.record.display().to_string())
                );
            }
            None => h.push_str(r#"<p class="muted">no seed record was written for this run: replay its seed and profile (<code>plan.toml</code> and <code>profile.toml</code> beside this report)</p>"#),
        }
        h.push_str("</div>");
    }
    facts(&mut h, d);
    if !d.known.is_empty() {
        // One paragraph per defect: what it is once, then every occurrence.
        let mut by: BTreeMap<&str, (&str, Vec<&str>)> = BTreeMap::new();
        for (defect, about, seen) in &d.known {
            let e = by.entry(defect.as_str()).or_insert((about.as_str(), Vec::new()));
            e.1.push(seen.as_str());
        }
        let _ =
            write!(h, r#"<p class="unchecked">known defects of the stack's releases seen (each reported, none counted as a failure):</p>"#);
        for (defect, (about, seen)) in by {
            let items: Vec<String> = seen.iter().map(|s| format!("<li>{}</li>", esc(s))).collect();
            let about = if about.is_empty() { String::new() } else { format!(": {}", esc(about)) };
            let _ =
                write!(h, r#"<p class="known"><b>{}</b> ×{}{about}</p><ul class="known">{}</ul>"#, esc(defect), seen.len(), items.join(""));
        }
    }
    if !d.forensics.is_empty() {
        let links: Vec<String> = d.forensics.iter().map(|f| format!(r#"<a href="forensics/{0}">{0}</a>"#, esc(f))).collect();
        let _ = write!(h, "<p>forensics: {}</p>", links.join(" · "));
    }
    h.push_str("<h2>Workload</h2>");
    if writes.is_empty() && api.is_empty() {
        // No "0 writes" legend: it would read as a workload that wrote nothing.
        h.push_str(r#"<p class="muted">no workload request was recorded in this run's events (this target records none, or the run ended before its first)</p>"#);
        // The faults and steps over time are still worth their chart.
        h.push_str(&plot(d, writes, api));
    } else {
        workload_section(&mut h, d, writes, api);
    }
    // One labelled column per invariant judged in the run, in checking order.
    let mut judged: Vec<String> = Vec::new();
    for j in d.steps.values().filter_map(|st| st.check.as_ref()).flat_map(|c| &c.invariants) {
        let name = j.invariant.to_string();
        if !judged.contains(&name) {
            judged.push(name);
        }
    }
    h.push_str("<h2>Timeline</h2><table><tr><th>step</th><th>at</th><th>op</th><th>op ms</th><th>checks ms</th>");
    for name in &judged {
        let _ = write!(h, r#"<th class="ih"><div>{}</div></th>"#, esc(name));
    }
    h.push_str("<th>verdict</th></tr>");
    let blank = r#"<td></td>"#.repeat(judged.len());
    for (n, st) in &d.steps {
        let check = st.check.as_ref();
        let failed = check.is_some_and(|c| c.verdict == CheckVerdict::Fail) || st.op_error.is_some();
        let chips: String = judged
            .iter()
            .map(|name| match check.and_then(|c| c.invariants.iter().find(|j| j.invariant.to_string() == *name)) {
                Some(j) => format!(
                    r#"<td class="iv {0}" title="{1}: {0} ({2}µs)">{3}</td>"#,
                    j.verdict.name(),
                    esc(name),
                    j.us,
                    if j.verdict.name() == "pass" { "✓" } else { "✗" }
                ),
                None => "<td></td>".into(),
            })
            .collect();
        let verdict = match (check, &st.op_error) {
            (Some(c), _) if c.verdict == CheckVerdict::Fail => {
                format!("{}: {}", c.invariant.map(|i| i.to_string()).unwrap_or_default(), c.message.as_deref().unwrap_or(""))
            }
            (_, Some(e)) => format!("op failed: {e}"),
            (Some(c), _) => match c.attempts.unwrap_or(1) {
                1 => "ok".to_string(),
                n => format!("ok after {n} attempts"),
            },
            (None, None) => String::new(),
        };
        let _ = write!(
            h,
            r#"<tr{}><td class="n">{n}</td><td class="n">{:.1}s</td><td>{}</td><td class="n">{}</td><td class="n">{}</td>{chips}<td>{}</td></tr>"#,
            if failed { r#" class="failed""# } else { "" },
            st.start.saturating_sub(d.t0) as f64 / 1000.0,
            esc(&st.text),
            st.op_ms.map(|m| m.to_string()).unwrap_or_default(),
            check.and_then(|c| c.ms).map(|m| m.to_string()).unwrap_or_default(),
            esc(&verdict)
        );
    }
    for (n, op, why) in &d.skipped {
        let _ = write!(
            h,
            r#"<tr class="muted"><td class="n">{n}</td><td></td><td>{}</td><td></td><td></td>{blank}<td>skipped: {}</td></tr>"#,
            esc(op),
            esc(why)
        );
    }
    if let Some(l) = &d.liveness {
        let heal: Vec<String> = d.heals.iter().map(|(_, o)| o.to_string()).collect();
        let (what, v) = if l.verdict == CheckVerdict::Pass {
            (format!("converged in {}ms", l.ms.unwrap_or(0)), "pass")
        } else {
            (esc(l.message.as_deref().unwrap_or("")), "fail")
        };
        let _ = write!(
            h,
            r#"<tr><td class="n">✓</td><td></td><td>heal: {}</td><td></td><td></td>{blank}<td>liveness {v}: {what}</td></tr>"#,
            esc(&heal.join(", "))
        );
    }
    h.push_str("</table>");
    if let Some(p) = &d.plan {
        let reached = d.steps.keys().copied().max().unwrap_or(0);
        // The op after which the run failed, marked: where a replay or a shrink starts looking.
        let failed_at = d
            .steps
            .iter()
            .find(|(_, st)| st.op_error.is_some() || st.check.as_ref().is_some_and(|c| c.verdict == CheckVerdict::Fail))
            .map(|(n, _)| *n);
        h.push_str("<h2>Plan</h2><ol>");
        for (i, op) in p.ops.iter().enumerate() {
            let text = esc(&op.to_string());
            let _ = match (Some(i + 1) == failed_at, i + 1 > reached) {
                (true, _) => write!(h, r#"<li class="failedop"><b>{text}</b> ← failed here</li>"#),
                (false, true) => write!(h, r#"<li class="muted">{text}</li>"#),
                (false, false) => write!(h, "<li>{text}</li>"),
            };
        }
        h.push_str("</ol>");
    }
    h.push_str("<p class=\"muted\">shakedown ");
    h.push_str(env!("CARGO_PKG_VERSION"));
    h.push_str("</p></body></html>\n");
    h
}

/// What ran, on what, and what was not checked.
fn facts(h: &mut String, d: &RunData) {
    let mut rows: Vec<(&str, String)> = Vec::new();
    if let Some(t) = &d.target {
        rows.push(("target", esc(t)));
    }
    if !d.versions.is_empty() {
        rows.push(("versions", esc(&d.versions.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(" · "))));
    }
    if !d.machine.is_empty() {
        let m = &d.machine;
        let parts: Vec<String> = [
            m.get("host").cloned(),
            m.get("os").cloned(),
            m.get("kernel").map(|k| format!("Linux {k}")),
            m.get("cpus").map(|c| format!("{c} CPUs")),
            m.get("memory").cloned(),
        ]
        .into_iter()
        .flatten()
        .collect();
        rows.push(("machine", esc(&parts.join(" · "))));
    }
    if !d.unchecked.is_empty() {
        rows.push(("not checked", esc(&super::unchecked_text(&d.unchecked))));
    }
    if rows.is_empty() {
        return;
    }
    h.push_str(r#"<dl class="facts">"#);
    for (k, v) in rows {
        let _ = write!(h, "<dt>{k}</dt><dd>{v}</dd>");
    }
    h.push_str("</dl>");
}

/// What a soak's HTML index shows.
pub struct SoakSummary {
    pub title: String,
    /// (label, value) rows of the summary table.
    pub rows: Vec<(String, String)>,
    pub cases: Vec<super::Case>,
    /// The soak's directory: run reports are linked relative to it.
    pub base: std::path::PathBuf,
    /// (seconds since the start, RSS KiB) after each seed.
    pub rss_kib: Vec<(f64, u64)>,
}

/// A soak's index: the summary, memory over time, and one row per seed linking its report.
pub fn soak_report(s: &SoakSummary) -> String {
    use super::CaseOutcome;
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{0}</title><style>
body{{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}} h1{{font-size:20px}}
table{{border-collapse:collapse;font-size:13px}} td,th{{border-bottom:1px solid #eee;padding:3px 8px;text-align:left}}
.pass{{color:#2a8a2a}} .fail{{color:#c00;font-weight:bold}} .skip{{color:#888}}
</style></head><body><h1>{0}</h1><table>"#,
        esc(&s.title)
    );
    for (k, v) in &s.rows {
        let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
    }
    h.push_str("</table>");
    if s.rss_kib.len() > 1 {
        let t_max = s.rss_kib.last().map_or(1.0, |r| r.0).max(1.0);
        let k_max = s.rss_kib.iter().map(|r| r.1).max().unwrap_or(1).max(1) as f64;
        let pts: Vec<String> =
            s.rss_kib.iter().map(|(t, k)| format!("{:.1},{:.1}", 40.0 + t / t_max * 540.0, 90.0 - *k as f64 / k_max * 80.0)).collect();
        let _ = write!(
            h,
            r##"<h2>Memory</h2><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 600 110" width="600"><polyline points="{}" fill="none" stroke="#1f5fa8"/><line x1="40" x2="580" y1="90" y2="90" stroke="#999"/><text x="0" y="14" font-size="10">{:.1} MiB</text><text x="0" y="94" font-size="10">0</text><text x="560" y="105" font-size="10">{:.0}s</text></svg>"##,
            pts.join(" "),
            k_max / 1024.0,
            t_max
        );
    }
    h.push_str("<h2>Seeds</h2><table><tr><th>seed</th><th>verdict</th><th>ops</th><th>seconds</th><th>report</th></tr>");
    for c in &s.cases {
        let (cls, verdict) = match &c.outcome {
            CaseOutcome::Pass => ("pass", "pass".to_string()),
            CaseOutcome::Fail { message, replay, .. } => {
                ("fail", format!("{message}{}", replay.as_ref().map(|r| format!(" · {r}")).unwrap_or_default()))
            }
            CaseOutcome::Skipped(why) => ("skip", why.clone()),
        };
        let rel = c.run_dir.strip_prefix(&s.base).unwrap_or(&c.run_dir).join("report.html");
        let _ = write!(
            h,
            r#"<tr><td>{}</td><td class="{cls}">{}</td><td>{}</td><td>{:.1}</td><td><a href="{}">report</a></td></tr>"#,
            esc(&c.name),
            esc(&verdict),
            c.steps,
            c.seconds,
            esc(&rel.display().to_string())
        );
    }
    h.push_str("</table></body></html>\n");
    h
}

/// The workload's legend and chart.
fn workload_section(h: &mut String, d: &RunData, writes: &[Write], api: &[Write]) {
    let acked = writes.iter().filter(|w| w.ok).count();
    let _ = write!(
        h,
        r#"<p class="legend">{} writes, {} acknowledged, {} not acknowledged · <span style="color:#1f5fa8">● median latency per interval</span><span style="color:#7aa6d8">│ maximum</span><span style="color:#c00">▪ failed writes</span><span style="color:#2a8a2a">— share acknowledged</span><span style="background:#f4a6a6">&nbsp;fault in effect&nbsp;</span></p>"#,
        writes.len(),
        acked,
        writes.len() - acked
    );
    if acked < writes.len() {
        h.push_str(r#"<p class="muted">A write that is not acknowledged (refused, or no answer within the workload's timeout) is what a client may see while a fault is in effect, and is no failure: the checks fail a run when a write that <i>was</i> acknowledged is lost, or an answer contradicts the others.</p>"#);
    }
    if !api.is_empty() {
        let answered = api.iter().filter(|w| w.ok).count();
        let _ = write!(
            h,
            r#"<p class="legend">Kubernetes API workload: {} requests, {answered} answered, {} failed · <span style="color:#7b3fa0">╌ share answered</span></p>"#,
            api.len(),
            api.len() - answered
        );
    }
    h.push_str(&plot(d, writes, api));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_windows_follow_the_model() {
        let profile = Profile::from_toml("name = \"t\"\nsteps = 3\nversions = [\"3.4\"]\n").unwrap();
        let mut d = RunData { profile: Some(profile), t0: 1000, t_end: 9000, ..Default::default() };
        use shakedown_faults::MemberId;
        d.steps.insert(1, Step { op: Some(Op::Crash { member: MemberId(1) }), start: 2000, ..Default::default() });
        d.steps.insert(2, Step { op: Some(Op::Restart { member: MemberId(1) }), start: 5000, ..Default::default() });
        d.steps.insert(3, Step { op: Some(Op::Pause { member: MemberId(0) }), start: 7000, ..Default::default() });
        let w = fault_windows(&d);
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!((w[0].0, w[0].1), (2000, 5000));
        assert_eq!((w[1].0, w[1].1), (7000, 9000), "a fault still in effect at the end runs to the end");
    }

    #[test]
    fn torn_lines_and_missing_files_do_not_break_the_report() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("events.jsonl"), "{\"v\":1,\"ts_ms\":1,\"event\":\"run-start\",\"run_id\":\"sd-x\",\"seed\":4,\"profile\":\"p\",\"weights\":{},\"ops\":1,\"target\":{\"kind\":\"local\"}}\n{\"ts_ms\":2,\"ev").unwrap();
        std::fs::write(dir.path().join("workload.csv"), "unix_ms,latency_us,ok\n1,500,1\n2,9").unwrap();
        let html = run_report(dir.path(), None).unwrap();
        assert!(html.contains("seed 4") && html.contains("UNFINISHED") && html.contains("<svg"), "{html}");
        assert!(run_report(&dir.path().join("nope"), None).is_err());
    }

    /// A restore stops every member while it runs and leaves the model whole: its run is shaded
    /// as a fault (the acknowledged share drops to 0 there), as are rolling ops; a backup is not.
    #[test]
    fn ops_that_take_members_down_while_they_run_are_shaded() {
        let profile = Profile::from_toml("name = \"t\"\nsteps = 3\nversions = [\"3.4\", \"3.5\"]\n").unwrap();
        let mut d = RunData { profile: Some(profile), t0: 1000, t_end: 20000, ..Default::default() };
        use shakedown_faults::BackupId;
        let step = |op: Op, start: u64, ms: u64| Step { text: op.to_string(), op: Some(op), start, op_ms: Some(ms), ..Default::default() };
        d.steps.insert(1, step(Op::Backup, 2000, 300));
        d.steps.insert(2, step(Op::Restore { backup: BackupId(0) }, 4000, 2500));
        d.steps.insert(3, step(Op::RollingUpgrade { to: shakedown_faults::Version::new(3, 5) }, 9000, 6000));
        let w = fault_windows(&d);
        assert_eq!(w.iter().map(|(a, b, _)| (*a, *b)).collect::<Vec<_>>(), [(4000, 6500), (9000, 15000)], "{w:?}");
        assert!(w[0].2.starts_with("restore(b0): every member stopped"), "{w:?}");
    }

    /// Known defects are listed by defect: what it is once, each occurrence under it; an event
    /// log from before `seen` and `about` shows each whole message.
    #[test]
    fn known_defects_are_listed_once_per_defect_with_every_occurrence() {
        let dir = tempfile::tempdir().unwrap();
        let start = "{\"v\":1,\"ts_ms\":1,\"event\":\"run-start\",\"run_id\":\"sd-x\",\"seed\":4,\"profile\":\"p\",\"weights\":{},\"ops\":1,\"target\":{\"kind\":\"local\"}}";
        let known = |seen: &str| {
            format!("{{\"v\":1,\"ts_ms\":2,\"event\":\"known-defect\",\"invariant\":\"watch\",\"defect\":\"etcd-io/etcd#15220\",\"message\":\"{seen}: early\",\"seen\":\"{seen}\",\"about\":\"early progress\"}}")
        };
        let old = "{\"v\":1,\"ts_ms\":3,\"event\":\"known-defect\",\"invariant\":\"watch\",\"defect\":\"etcd-io/etcd#15220\",\"message\":\"w9: whole message\"}";
        std::fs::write(dir.path().join("events.jsonl"), format!("{start}\n{}\n{}\n{old}\n", known("w0: at 7"), known("w1: at 9"))).unwrap();
        let html = run_report(dir.path(), None).unwrap();
        assert_eq!(html.matches("<b>etcd-io/etcd#15220</b>").count(), 1, "{html}");
        assert!(html.contains("<b>etcd-io/etcd#15220</b> ×3: early progress"), "{html}");
        assert!(html.contains("<li>w0: at 7</li><li>w1: at 9</li><li>w9: whole message</li>"), "{html}");
    }

    /// The API workload's requests (control-plane stack, kube `[api]`) get their own
    /// availability line and legend; without them the plot is the etcd workload's alone.
    #[test]
    fn api_requests_get_their_own_availability_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("events.jsonl"), "{\"v\":1,\"ts_ms\":1,\"event\":\"run-start\",\"run_id\":\"sd-x\",\"seed\":4,\"profile\":\"p\",\"weights\":{},\"ops\":1,\"target\":{\"kind\":\"local\"}}\n").unwrap();
        std::fs::write(dir.path().join("workload.csv"), "unix_ms,latency_us,ok\n1,500,1\n2,600,1\n").unwrap();
        let without = run_report(dir.path(), None).unwrap();
        assert!(!without.contains("#7b3fa0") && !without.contains("Kubernetes API workload"));
        std::fs::write(dir.path().join("api-workload.csv"), "unix_ms,latency_us,ok\n1,900,1\n2,3000000,0\n3,800,1\n").unwrap();
        let with = run_report(dir.path(), None).unwrap();
        assert!(with.contains("Kubernetes API workload: 3 requests, 2 answered, 1 failed"), "{with}");
        assert!(
            with.split("<polyline").skip(1).any(|p| p.split('>').next().is_some_and(|tag| tag.contains("#7b3fa0"))),
            "the API line: {with}"
        );
        assert!(with.contains(">API requests<"), "{with}");
    }
}
