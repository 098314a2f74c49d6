//! The shipped regression corpus (`seeds/`) replayed on the stacks its records name: the real
//! local stack (root, what `.ci/run` installs) and the simulated one. Shrinking, soaking, rates
//! and the reports they leave are shakedown's own logic, tested on the simulated target in
//! `tests/sim.rs`.

mod common;

use std::path::Path;
use std::sync::Mutex;

use common::{dirs, leftovers, run, seed_records, text};

static STACK: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    STACK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The corpus shipped in `seeds/` (planted bugs kept to show detection, and plans that once
/// raised false alarms, kept as `expect = "pass"`) replays as each record expects.
#[test]
fn the_shipped_regression_corpus_replays_as_expected() {
    let _l = lock();
    let d = dirs();
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let records = seed_records(&corpus);
    assert!(records.len() >= 3, "{records:?}");
    let out = run(&["replay", corpus.to_str().unwrap()], &d);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains(&format!("{} records, {} as expected, 0 mismatched", records.len(), records.len())), "{stdout}");
    assert!(seed_records(&d.seeds).is_empty(), "replaying writes no record");
    assert_eq!(leftovers(&d.runs), Vec::<String>::new());
}
