//! The command line without a stack: plans, profiles, bad input and its exit codes.

mod common;

use common::{bin, dirs, run, text};

#[test]
fn plan_is_deterministic_and_matches_the_library() {
    let a = bin().args(["plan", "--seed", "42", "--format", "toml"]).output().unwrap();
    let b = bin().args(["plan", "--seed", "42", "--format", "toml"]).output().unwrap();
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout);
    let profile = shakedown::profiles::load("default").unwrap();
    let lib = toml::to_string(&shakedown::faults::generate(42, &profile)).unwrap();
    assert_eq!(text(&a.stdout), lib);
}

/// Issue 10: every u64 is a seed. Above i64::MAX the TOML plan carries it as a string (TOML
/// integers are signed), and it reads back as the same plan.
#[test]
fn plan_of_a_seed_above_i64_max_prints_as_toml_and_reads_back() {
    for seed in ["9223372036854775808", "18000000000000000000", "18446744073709551615"] {
        let out = bin().args(["plan", "--seed", seed, "--format", "toml"]).output().unwrap();
        assert!(out.status.success(), "seed {seed}: {}", text(&out.stderr));
        let plan: shakedown::faults::Plan = toml::from_str(&text(&out.stdout)).unwrap();
        assert_eq!(plan.seed.to_string(), seed);
        assert_eq!(plan, shakedown::faults::generate(plan.seed, &shakedown::profiles::load("default").unwrap()));
    }
    let out = bin().args(["plan", "--seed", "18446744073709551616"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "a seed past u64 is a usage error");
}

/// A plan length past the limit is refused before anything is generated (it used to run
/// without end).
#[test]
fn a_plan_too_long_is_a_usage_error() {
    let out = bin().args(["plan", "--seed", "1", "--steps", "1000000000"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("more than the 100000 a plan may have"), "{}", text(&out.stderr));
    let d = dirs();
    std::fs::create_dir_all(&d.runs).unwrap();
    let p = d.runs.join("long.toml");
    std::fs::write(&p, "name = \"long\"\nsteps = 1000000000\nversions = [\"3.4\"]\n").unwrap();
    let out = bin().args(["plan", "--seed", "1", "--profile", p.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("more than the 100000"), "{}", text(&out.stderr));
}

#[test]
fn plan_text_lists_seed_weights_and_ops() {
    let out = bin().args(["plan", "--seed", "7", "--steps", "5"]).output().unwrap();
    let s = text(&out.stdout);
    assert!(s.starts_with("seed 7 · profile default · 5 ops · weights crash="), "{s}");
    assert_eq!(s.lines().count(), 6, "{s}");
}

/// The nightly tier draws etcd's flags per seed: `shakedown plan` prints them beside the
/// weights and its TOML plan carries them. The default tier pins its one (printed too) and its
/// plans carry none of their own.
#[test]
fn plan_prints_etcd_flags_beside_the_weights() {
    let nightly = shakedown::profiles::load("nightly").unwrap();
    for seed in [3u64, 4] {
        let flags = shakedown::faults::generate(seed, &nightly).etcd.expect("the nightly tier draws").summary();
        for f in ["snapshot_count=", "heartbeat=", "election=", "compaction_batch_limit="] {
            assert!(flags.contains(f), "{flags}");
        }
        let out = bin().args(["plan", "--seed", &seed.to_string(), "--profile", "nightly", "--steps", "2"]).output().unwrap();
        let s = text(&out.stdout);
        assert!(s.lines().next().unwrap().ends_with(&format!(" · etcd {flags}")), "{s}");
        let out = bin().args(["plan", "--seed", &seed.to_string(), "--profile", "nightly", "--format", "toml"]).output().unwrap();
        let plan: shakedown::faults::Plan = toml::from_str(&text(&out.stdout)).unwrap();
        assert_eq!(plan.etcd.map(|f| f.summary()), Some(flags));
    }
    let out = bin().args(["plan", "--seed", "7", "--steps", "2"]).output().unwrap();
    assert!(text(&out.stdout).lines().next().unwrap().ends_with(" · etcd snapshot_count=1000"), "{}", text(&out.stdout));
    let out = bin().args(["plan", "--seed", "7", "--format", "toml"]).output().unwrap();
    assert!(!text(&out.stdout).contains("etcd"), "{}", text(&out.stdout));
}

#[test]
fn unknown_profile_is_a_usage_error_listing_the_known_ones() {
    let out = bin().args(["plan", "--seed", "1", "--profile", "nightlyy"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("unknown profile \"nightlyy\": known profiles are default, smoke, nightly"), "{err}");
}

#[test]
fn profile_file_with_an_unknown_op_or_invariant_is_rejected() {
    let d = dirs();
    std::fs::create_dir_all(&d.runs).unwrap();
    let p = d.runs.join("p.toml");
    std::fs::write(&p, "name = \"mine\"\nsteps = 3\nversions = [\"3.4\"]\n[weights]\nreboot = 2\n").unwrap();
    let out = bin().args(["plan", "--seed", "1", "--profile", p.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown variant `reboot`, expected one of `crash`, `restart`"), "{}", text(&out.stderr));
    std::fs::write(&p, "name = \"mine\"\nsteps = 3\nversions = [\"3.4\"]\ninvariants = [\"latency\"]\n").unwrap();
    let out = bin().args(["plan", "--seed", "1", "--profile", p.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown invariant \"latency\"; known: membership"), "{}", text(&out.stderr));
}

#[test]
fn every_shipped_profile_loads_and_every_op_appears_in_one() {
    let mut seen = std::collections::BTreeSet::new();
    for (name, _) in shakedown::profiles::BUILTIN {
        let p = shakedown::profiles::load(name).unwrap();
        for seed in 0..50 {
            seen.extend(shakedown::faults::generate(seed, &p).ops.iter().map(|o| o.kind()));
        }
    }
    assert_eq!(seen, shakedown::faults::OpKind::ALL.into_iter().collect());
}

fn replay_file(contents: &str) -> (std::process::Output, common::Dirs) {
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    let f = d.seeds.join("bad.toml");
    std::fs::write(&f, contents).unwrap();
    let out = run(&["replay", f.to_str().unwrap()], &d);
    (out, d)
}

fn good_record() -> String {
    let profile = shakedown::profiles::load("default").unwrap();
    let plan = shakedown::faults::generate(3, &profile);
    let rec = shakedown::record::SeedRecord {
        format: shakedown::record::FORMAT,
        shakedown_version: "0.1.0".into(),
        seed: 3,
        run_id: "sd-test".into(),
        started: "2026-11-30T00:00:00Z".into(),
        expect: Default::default(),
        versions: Default::default(),
        failure: shakedown::record::Failure {
            kind: shakedown::record::FailureKind::Violation,
            step: 2,
            op: "crash(m0)".into(),
            invariant: Some(shakedown::invariants::InvariantId::Quorum),
            also: vec![],
            message: "x".into(),
            at: "2026-11-30T00:00:01Z".into(),
        },
        profile,
        plan,
        duration_ms: None,
        shrunk: None,
        matching: None,
        reproduction: Vec::new(),
        target: shakedown::targets::TargetSpec::Local(shakedown::targets::local::LocalSpec { testbed_bug: None }),
    };
    rec.to_toml()
}

#[test]
fn seed_record_round_trips() {
    let text = good_record();
    let rec = shakedown::record::SeedRecord::parse(&text).unwrap();
    assert_eq!(rec.to_toml(), text);
    assert!(text.contains("[[plan.ops]]") && text.contains("[failure]"), "{text}");
}

#[test]
fn malformed_seed_record_is_a_usage_error_and_nothing_runs() {
    let (out, d) = replay_file("this is [ not toml");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not a valid seed record (malformed or truncated TOML)"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "no run directory for a rejected record");
}

/// A record's errors say where, as a profile's do (they lost the line and column).
#[test]
fn seed_record_errors_name_the_line_and_column() {
    let (out, _d) = replay_file("format = 2\nseed = 3\nthis is [ not toml\n");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("(malformed or truncated TOML) at line 3, column"), "{}", text(&out.stderr));
    let bad = good_record().replacen("step = 2\n", "step = \"two\"\n", 1);
    let line = bad.lines().position(|l| l == "step = \"two\"").unwrap() + 1;
    let (out, _d) = replay_file(&bad);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains(&format!("not a valid seed record at line {line}, column")), "{}", text(&out.stderr));
}

#[test]
fn truncated_seed_record_is_rejected() {
    let full = good_record();
    let (out, _d) = replay_file(&full[..full.len() / 2]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("seed record"), "{}", text(&out.stderr));
}

#[test]
fn seed_record_from_another_format_version_is_rejected_clearly() {
    let (out, _d) = replay_file(&good_record().replace("format = 2", "format = 9"));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("seed record format 9 is not supported"), "{}", text(&out.stderr));
}

/// A failure at a step the plan does not have (it once loaded, and replay judged a step that
/// never runs).
#[test]
fn seed_record_whose_failure_step_is_past_its_plan_is_rejected() {
    let good = good_record();
    let ops = good.matches("[[plan.ops]]").count();
    let (out, d) = replay_file(&good.replacen("step = 2\n", "step = 4000\n", 1));
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("failure.step = 4000 is past the recorded plan's {ops} ops")), "{err}");
    assert!(!d.runs.exists(), "no run directory for a rejected record");
    let healed = good.replacen("step = 2\n", &format!("step = {}\n", ops + 1), 1);
    assert!(shakedown::record::SeedRecord::parse(&healed).is_ok(), "the check after healing is a step of the plan");
}

#[test]
fn seed_record_whose_plan_breaks_a_precondition_is_rejected() {
    let bad = good_record().replacen("[[plan.ops]]", "[[plan.ops]]\nop = \"restart\"\nmember = 0\n\n[[plan.ops]]", 1);
    let (out, _d) = replay_file(&bad);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("step 1 (restart(m0)) breaks its precondition"), "{}", text(&out.stderr));
}

#[test]
fn missing_etcd_binary_is_an_environment_error_naming_the_fix() {
    let d = dirs();
    let out = run(&["run", "--seed", "1", "--steps", "2", "--etcd", "3.5=/nonexistent/etcd"], &d);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("/nonexistent/etcd is not an etcd 3.5 binary"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "nothing is created when the environment cannot run the stack");
    // A soak checks the same before its own directory exists (it left an empty soak-*/).
    let out = run(&["soak", "--for", "1m", "--profile", "control-plane", "--kube-apiserver", "/nonexistent/kube-apiserver"], &d);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is not a kube-apiserver binary"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "a soak that cannot start leaves no soak directory");
}

/// Inputs that would change what runs without a word are refused before anything is created:
/// an `--etcd` for a version the profile does not run (it was ignored and the run went ahead on
/// the default binaries), two for one version, a plain etcd for a failpoint tier, a reap filter
/// without `--kube`.
#[test]
fn flags_that_would_be_ignored_are_refused_before_anything_runs() {
    let d = dirs();
    let out = run(&["run", "--seed", "1", "--steps", "2", "--etcd", "9.9=/bin/true"], &d);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("--etcd 9.9=: profile default does not run etcd 9.9 (its versions: 3.4, 3.5)"), "{err}");
    assert!(!d.runs.exists(), "nothing is created for a refused flag");
    let out = run(&["run", "--seed", "1", "--steps", "2", "--etcd", "3.5=/a/etcd", "--etcd", "3.5=/b/etcd"], &d);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--etcd 3.5= is given twice"), "{}", text(&out.stderr));
    assert!(!d.runs.exists());
    // A failpoint tier on a plain etcd would draw failpoint ops its etcd has no endpoint for.
    let out = run(&["run", "--seed", "1", "--steps", "2", "--profile", "failpoints", "--etcd", "3.4=/usr/bin/etcd"], &d);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("/usr/bin/etcd is not a failpoint build of etcd"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("./scripts/build-etcd-failpoints.sh"), "{}", text(&out.stderr));
    assert!(!d.runs.exists());
    for filter in [["--namespace", "team-a"], ["--context", "prod"], ["--kubeconfig", "/tmp/kc"]] {
        let out = bin().arg("reap").args(filter).arg("--runs-dir").arg(&d.runs).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "reap {filter:?} without --kube");
        assert!(text(&out.stderr).contains("--kube"), "{}", text(&out.stderr));
    }
}

/// Under `--log-format json` every line of stderr is a JSON object, the final error included
/// (it was plain text: a log pipeline dropped or mangled the one line that said why).
#[test]
fn json_logs_end_with_a_json_error() {
    let out = bin().args(["--log-format", "json", "plan", "--seed", "1", "--profile", "no-such-profile"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let last = err.lines().last().expect("an error line");
    let v: serde_json::Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {err}"));
    assert_eq!(v["level"], "ERROR", "{v}");
    assert_eq!(v["fields"]["exit"], 2, "{v}");
    assert!(v["fields"]["message"].as_str().unwrap().contains("no-such-profile"), "{v}");
    for line in err.lines() {
        assert!(serde_json::from_str::<serde_json::Value>(line).is_ok(), "not JSON: {line}");
    }
}

/// Outputs that could not be written are found before anything runs, not when the run (or an
/// 8-hour soak) ends.
#[test]
fn unwritable_outputs_are_refused_at_the_start() {
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    let file = d.seeds.join("a-file");
    std::fs::write(&file, "").unwrap();
    let file_s = file.to_str().unwrap();
    let under_file = file.join("junit.xml");
    for (args, want) in [
        (
            vec!["run", "--seed", "1", "--junit", under_file.to_str().unwrap()],
            format!("--junit {}: {file_s} is not a directory", under_file.display()),
        ),
        (vec!["run", "--seed", "1", "--junit", d.seeds.to_str().unwrap()], "it is a directory; give the file to write".to_string()),
        (vec!["soak", "--for", "1m", "--junit", under_file.to_str().unwrap()], "is not a directory".to_string()),
    ] {
        let out = run(&args, &d);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(&want), "{args:?}: {}", text(&out.stderr));
        assert!(!d.runs.exists(), "nothing created for {args:?}");
    }
    let out = bin().args(["run", "--seed", "1", "--runs-dir", file_s, "--seeds-dir"]).arg(&d.seeds).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("--runs-dir {file_s}: it is a file, not a directory")), "{}", text(&out.stderr));
}

/// A profile whose ops run out before its steps (only `crash`: once `max_down` members are
/// down no op can run) plans a shorter plan, and says so instead of running it silently.
#[test]
fn a_plan_shorter_than_its_steps_is_said() {
    let d = dirs();
    std::fs::create_dir_all(&d.runs).unwrap();
    let path = d.runs.join("crash-only.toml");
    std::fs::write(&path, "name = \"crash-only\"\nsteps = 5\nversions = [\"3.4\"]\nops = [\"crash\"]\n").unwrap();
    let out = bin().args(["plan", "--seed", "1", "--profile"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("· 1 op ·"), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("seed 1: the plan has 1 of the 5 steps asked for") && err.contains("(crash)"), "{err}");
    assert!(!err.contains('\u{1b}'), "no colour codes when stderr is not a terminal: {err:?}");
    let out = bin().args(["plan", "--seed", "1"]).output().unwrap();
    assert!(!text(&out.stderr).contains("steps asked for"), "a full plan says nothing: {}", text(&out.stderr));
}

#[test]
fn missing_kube_apiserver_for_the_control_plane_stack_is_an_environment_error_naming_the_fix() {
    let d = dirs();
    let out =
        run(&["run", "--profile", "control-plane", "--seed", "1", "--steps", "2", "--kube-apiserver", "/nonexistent/kube-apiserver"], &d);
    assert_eq!(out.status.code(), Some(4));
    let err = text(&out.stderr);
    assert!(
        err.contains("/nonexistent/kube-apiserver is not a kube-apiserver binary (cannot run") && err.contains("--kube-apiserver PATH"),
        "{err}"
    );
    assert!(!d.runs.exists(), "nothing is created when the environment cannot run the stack");
}

#[test]
fn unknown_planted_bug_is_a_usage_error() {
    let out = bin().args(["run", "--testbed-bug", "typo"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("known: upgrade-no-wait"), "{}", text(&out.stderr));
}

#[test]
fn help_documents_the_exit_codes() {
    let out = bin().arg("--help").output().unwrap();
    let s = text(&out.stdout);
    for line in [
        "0    every invariant held",
        "1    an invariant was violated",
        "2    usage error",
        "3    liveness failure",
        "4    environment",
        "6    check-history: undecided",
        "130  interrupted",
    ] {
        assert!(s.contains(line), "missing {line:?} in\n{s}");
    }
}

#[test]
fn a_corpus_with_a_foreign_file_is_rejected_before_anything_runs() {
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    std::fs::write(d.seeds.join("a-good.toml"), good_record()).unwrap();
    std::fs::write(d.seeds.join("b-notes.toml"), "title = \"my notes\"\n").unwrap();
    let out = run(&["replay", d.seeds.to_str().unwrap()], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("b-notes.toml: not a shakedown seed record"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "nothing ran");
}

#[test]
fn records_without_expect_default_to_fail() {
    let text = good_record().replace("expect = \"fail\"\n", "");
    assert!(!text.contains("expect ="));
    assert_eq!(shakedown::record::SeedRecord::parse(&text).unwrap().expect, shakedown::record::Expect::Fail);
}

#[test]
fn zero_or_negative_durations_are_usage_errors() {
    for args in [&["soak", "--for", "0s"][..], &["soak", "--for=-5m"], &["shrink", "x.toml", "--budget", "0m"]] {
        let out = bin().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains("more than zero") || err.contains("90s, 20m"), "{args:?}: {err}");
    }
    let out = bin().args(["shrink", "x.toml", "--max-runs", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_shrink_budget_too_small_for_one_candidate_is_refused_and_the_record_is_untouched() {
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    let f = d.seeds.join("r.toml");
    let record = good_record().replacen("expect =", "duration_ms = 60000\nexpect =", 1);
    std::fs::write(&f, &record).unwrap();
    let out = run(&["shrink", f.to_str().unwrap(), "--budget", "30s"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--budget 30s is too small to run a single candidate: the recorded run took 1m"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&f).unwrap(), record, "the record is untouched");
    assert!(!d.runs.exists(), "nothing ran");
}

#[test]
fn shrink_of_a_malformed_record_is_a_usage_error() {
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    let f = d.seeds.join("r.toml");
    std::fs::write(&f, "format = 1\nseed = ").unwrap();
    let out = run(&["shrink", f.to_str().unwrap()], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("not a valid seed record"), "{}", text(&out.stderr));
}

#[test]
fn the_release_tier_is_shipped_destructive_and_switches_every_op_on() {
    let out = bin().arg("profiles").output().unwrap();
    let s = text(&out.stdout);
    for name in ["default", "smoke", "nightly", "release"] {
        assert!(s.lines().any(|l| l.starts_with(name)), "{name} missing in\n{s}");
    }
    let p = shakedown::profiles::load("release").unwrap();
    assert!(p.max_down() > p.members as usize / 2, "release allows losing quorum");
    let mut all = std::collections::BTreeSet::new();
    for seed in 0..20 {
        let plan = shakedown::faults::generate(seed, &p);
        assert!(plan.weights.values().all(|&w| w > 0), "no op is drawn off: {:?}", plan.weights);
        let kinds: std::collections::BTreeSet<_> = plan.ops.iter().map(|o| o.kind()).collect();
        assert!(kinds.len() >= 9, "seed {seed}: only {kinds:?}");
        all.extend(kinds);
    }
    assert_eq!(all, shakedown::faults::OpKind::ALL.into_iter().filter(|k| p.has_kind(*k)).collect());
}

/// Issue 11: an option of another target is refused before anything runs, never ignored.
#[test]
fn options_of_another_target_are_refused() {
    let d = dirs();
    let out = run(&["soak", "--for", "1m", "--cluster", "ns/c"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--cluster (or SHAKEDOWN_CLUSTER) is for the kube target; --target local does not take it"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["run", "--target", "kube", "--cluster", "ns/c", "--testbed-bug", "ack-before-write", "--disks", "plain"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--testbed-bug, --disks are for the local target; --target kube does not take them"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["run", "--target", "kube"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--target kube needs --cluster NAMESPACE/NAME"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "nothing was created");
}

/// Issue 14: `--partition i/n` (flag or SHAKEDOWN_PARTITION) is checked before anything runs:
/// garbage, n = 0, i >= n, an unexpanded `$(JOB_COMPLETION_INDEX)` and a partition without a
/// base seed are usage errors (exit 2) saying what to write.
#[test]
fn bad_partitions_are_usage_errors() {
    let d = dirs();
    for cmd in [&["run", "--seed", "1"][..], &["soak", "--for", "1m", "--seed", "1"]] {
        for (bad, says) in [
            ("8/8", "index 8 is not below the number of pods 8"),
            ("0/0", "the number of pods must be at least 1"),
            ("three/8", "is not a whole number"),
            ("3", "is not a partition: write i/n"),
            ("$(JOB_COMPLETION_INDEX)/8", "only in the pods of an Indexed Job"),
        ] {
            let mut args = cmd.to_vec();
            args.extend(["--partition", bad]);
            let out = run(&args, &d);
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            let err = text(&out.stderr);
            assert!(err.contains("--partition") && err.contains(says), "{args:?}: {err}");
            // The same value from the environment, as an Indexed Job's pod gets it.
            let out = bin().args(cmd).arg("--runs-dir").arg(&d.runs).env("SHAKEDOWN_PARTITION", bad).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "SHAKEDOWN_PARTITION={bad} {cmd:?}");
            assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
        }
        let mut args: Vec<&str> = cmd.iter().copied().filter(|a| *a != "--seed" && *a != "1").collect();
        args.extend(["--partition", "2/8"]);
        let out = run(&args, &d);
        assert_eq!(out.status.code(), Some(2));
        assert!(text(&out.stderr).contains("--partition 2/8 needs --seed S: every pod of the Indexed Job must start from the same base seed (partition 2/8 runs S+2, S+10, …)"), "{}", text(&out.stderr));
    }
    let out = run(&["run", "--seed", "1", "--count", "0"], &d);
    assert_eq!(out.status.code(), Some(2), "--count 0");
    // Environment variables of the kube target given to the local target are refused like flags.
    let out = bin().args(["run", "--seed", "1"]).arg("--runs-dir").arg(&d.runs).env("SHAKEDOWN_CLUSTER", "ns/c").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--cluster (or SHAKEDOWN_CLUSTER) is for the kube target"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "nothing was created");
}

/// The options the ci/k8s manifests set through the environment are shown in `--help`.
#[test]
fn help_names_the_environment_variables() {
    let out = bin().args(["run", "--help"]).output().unwrap();
    let h = text(&out.stdout);
    for v in [
        "SHAKEDOWN_TARGET",
        "SHAKEDOWN_CLUSTER",
        "SHAKEDOWN_KUBE_PROFILE",
        "SHAKEDOWN_PROFILE",
        "SHAKEDOWN_CONTEXT",
        "SHAKEDOWN_PARTITION",
        "SHAKEDOWN_JUNIT",
        "SHAKEDOWN_SEEDS_DIR",
        "SHAKEDOWN_RUNS_DIR",
    ] {
        assert!(h.contains(&format!("[env: {v}=")), "run --help lacks {v}:\n{h}");
    }
    let out = bin().args(["soak", "--help"]).output().unwrap();
    let h = text(&out.stdout);
    for v in ["SHAKEDOWN_SOAK_FOR", "SHAKEDOWN_MAX_FAILURES", "SHAKEDOWN_PARTITION", "SHAKEDOWN_JUNIT", "SHAKEDOWN_TARGET"] {
        assert!(h.contains(&format!("[env: {v}=")), "soak --help lacks {v}:\n{h}");
    }
}

/// Issue 12: `--needs J` is at most `--confirm K`; more is refused before anything runs (even
/// before the record is read).
#[test]
fn shrink_needs_more_than_confirm_is_a_usage_error() {
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    let f = d.seeds.join("r.toml");
    std::fs::write(&f, good_record()).unwrap();
    let out = run(&["shrink", f.to_str().unwrap(), "--confirm", "2", "--needs", "3"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--needs 3 is more than --confirm 2"), "{}", text(&out.stderr));
    let out = run(&["shrink", f.to_str().unwrap(), "--needs", "2"], &d);
    assert_eq!(out.status.code(), Some(2), "--confirm defaults to 1");
    for args in
        [&["shrink", "x.toml", "--needs", "0"][..], &["shrink", "x.toml", "--match", "sometimes"], &["replay", "x.toml", "--match", "any"]]
    {
        assert_eq!(bin().args(args).output().unwrap().status.code(), Some(2), "{args:?}");
    }
    assert_eq!(std::fs::read_to_string(&f).unwrap(), good_record(), "the record is untouched");
    assert!(!d.runs.exists(), "nothing ran");
}

#[test]
fn write_rate_of_a_directory_is_a_usage_error() {
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    std::fs::write(d.seeds.join("a.toml"), good_record()).unwrap();
    let out = run(&["replay", d.seeds.to_str().unwrap(), "--times", "3", "--write-rate"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--write-rate writes into one record"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "nothing ran");
}

fn with_rates(record: &str) -> String {
    format!(
        "{}\n[[reproduction]]\nruns = 8\nreproduced = 2\nmatched = \"invariant\"\nplan = \"original\"\nat = \"2026-12-01T00:00:00Z\"\n\n[reproduction.versions]\n\"etcd-3.5\" = \"3.5.1\"\n\n[[reproduction]]\nruns = 8\nreproduced = 0\nmatched = \"invariant\"\nplan = \"original\"\nat = \"2026-12-01T01:00:00Z\"\n\n[reproduction.versions]\n\"etcd-3.5\" = \"3.5.16\"\n",
        record.replacen("expect = \"fail\"\n", "expect = \"fail\"\nmatch = \"invariant\"\n", 1)
    )
}

/// Records with `[[reproduction]]` measurements load; records without (every older one) load
/// with none; a malformed measurement is bad input naming the file.
#[test]
fn records_with_and_without_reproduction_rates_load() {
    use shakedown::record::{Match, SeedRecord, WhichPlan};
    let old = SeedRecord::parse(&good_record()).unwrap();
    assert!(old.reproduction.is_empty() && old.matching.is_none());
    let rated = SeedRecord::parse(&with_rates(&good_record())).unwrap();
    assert_eq!(rated.matching, Some(Match::Invariant));
    assert_eq!(rated.reproduction.len(), 2);
    assert_eq!((rated.reproduction[0].runs, rated.reproduction[0].reproduced), (8, 2));
    assert_eq!(rated.reproduction[1].versions["etcd-3.5"], "3.5.16");
    assert_eq!(rated.planning_rate(Match::Invariant, WhichPlan::Original), Some(0.25));
    assert_eq!(SeedRecord::parse(&rated.to_toml()).unwrap(), rated, "written back, it loads the same");
    // Through the binary: a corpus is checked before anything runs; both records pass the
    // check, the foreign file after them is the one named.
    let d = dirs();
    std::fs::create_dir_all(&d.seeds).unwrap();
    std::fs::write(d.seeds.join("a-old.toml"), good_record()).unwrap();
    std::fs::write(d.seeds.join("b-rated.toml"), with_rates(&good_record())).unwrap();
    std::fs::write(d.seeds.join("c-notes.toml"), "title = \"my notes\"\n").unwrap();
    let out = run(&["replay", d.seeds.to_str().unwrap()], &d);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("c-notes.toml: not a shakedown seed record") && !err.contains("a-old") && !err.contains("b-rated"), "{err}");
    std::fs::remove_file(d.seeds.join("c-notes.toml")).unwrap();
    std::fs::write(d.seeds.join("b-rated.toml"), with_rates(&good_record()).replace("matched = \"invariant\"", "matched = \"sometimes\""))
        .unwrap();
    let out = run(&["replay", d.seeds.to_str().unwrap()], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("b-rated.toml: not a valid seed record"), "{}", text(&out.stderr));
    assert!(!d.runs.exists(), "nothing ran");
}

#[test]
fn help_documents_match_write_rate_and_needs() {
    let words = |args: &[&str]| text(&bin().args(args).output().unwrap().stdout).split_whitespace().collect::<Vec<_>>().join(" ");
    let s = words(&["replay", "--help"]);
    for w in ["--match <step|invariant|defect>", "--write-rate", "[[reproduction]]", "95% interval", "at most 20, never fewer than --times"]
    {
        assert!(s.contains(w), "missing {w:?} in\n{s}");
    }
    let s = words(&["shrink", "--help"]);
    for w in ["--needs <J>", "--match <step|invariant|defect>", "[default: invariant]"] {
        assert!(s.contains(w), "missing {w:?} in\n{s}");
    }
}

/// Issue 32: a reader that closes stdout early (`shakedown plan | head -5`) once made a panic
/// (exit 5, "the stack was torn down" with no stack). It ends quietly with the SIGPIPE
/// convention, 141. (The plan is larger than a pipe's buffer, so the write meets the closed
/// pipe whatever the timing.)
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let mut child = bin()
        .args(["plan", "--seed", "1", "--steps", "20000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(141), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("panicked") && !text(&out.stderr).contains("internal error"), "{}", text(&out.stderr));
}

/// Issue 32: profile weights whose sum overflows u32 once panicked in generation; every weight
/// pinned to 0 once planned every kind at weight 1. Both are refused with the reason (exit 2).
#[test]
fn weights_that_overflow_or_disable_everything_are_refused() {
    let d = dirs();
    let huge = d.runs.parent().unwrap().join("huge.toml");
    std::fs::write(&huge, "name = \"huge\"\nsteps = 5\nversions = [\"3.4\"]\n[weights]\ncrash = 4294967295\nrestart = 4294967295\n")
        .unwrap();
    let out = bin().args(["plan", "--seed", "1", "--profile"]).arg(&huge).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("weights.crash = 4294967295 is more than 1000000"), "{}", text(&out.stderr));
    let zero = d.runs.parent().unwrap().join("zero.toml");
    std::fs::write(
        &zero,
        "name = \"zero\"\nsteps = 5\nversions = [\"3.4\"]\nops = [\"crash\", \"restart\"]\n[weights]\ncrash = 0\nrestart = 0\n",
    )
    .unwrap();
    let out = bin().args(["plan", "--seed", "1", "--profile"]).arg(&zero).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("every op kind this tier may use has weight 0"), "{}", text(&out.stderr));
}

/// Every relative link of the README, ARCHITECTURE.md and docs/ points at a file that exists,
/// and every `#anchor` at a heading of it (GitHub's slugs): the README's reference moved to
/// docs/ and its links must follow it.
#[test]
fn every_relative_link_and_anchor_of_the_docs_resolves() {
    fn slug(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }
    fn without_code_blocks(text: &str) -> String {
        let mut fenced = false;
        let mut out = String::new();
        for line in text.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if !fenced {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
    fn anchors(text: &str) -> Vec<String> {
        without_code_blocks(text).lines().filter(|l| l.starts_with('#')).map(|l| slug(l.trim_start_matches('#'))).collect()
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    files.extend(
        std::fs::read_dir(root.join("docs")).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    let link = markdown_links();
    let mut broken = Vec::new();
    for file in &files {
        let text = without_code_blocks(&std::fs::read_to_string(file).unwrap());
        for target in link(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let resolved = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            if !resolved.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            }
            if let Some(a) = anchor.filter(|_| resolved.extension().is_some_and(|x| x == "md")) {
                if !anchors(&std::fs::read_to_string(&resolved).unwrap()).iter().any(|h| h == a) {
                    broken.push(format!("{}: {target} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The targets of markdown links `[text](target)` in `text`, inline code left out.
fn markdown_links() -> impl Fn(&str) -> Vec<String> {
    |text: &str| {
        let mut out = Vec::new();
        for line in text.lines() {
            // Inline code spans hold examples, not links.
            let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
            let mut rest = plain.as_str();
            while let Some(i) = rest.find("](") {
                let after = &rest[i + 2..];
                let Some(end) = after.find(')') else { break };
                let target = &after[..end];
                if !target.contains(' ') && !target.is_empty() {
                    out.push(target.to_string());
                }
                rest = &after[end..];
            }
        }
        out
    }
}

fn history_file(d: &common::Dirs, name: &str, text: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(&d.runs).unwrap();
    let p = d.runs.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const REGISTER: &str = "{\"format\":\"shakedown-history\",\"version\":1,\"model\":\"register\"}\n";

/// Issue 28: a history recorded elsewhere (a single register, the simplest kind) is checked
/// by `check-history`; the verdict and the exit code say whether one order explains it.
#[test]
fn check_history_judges_a_register_history_and_says_so_in_its_exit_code() {
    let d = dirs();
    // Client 1 reads 1 after client 0's write of 1 was acknowledged, then client 2 reads the
    // initial nothing after that: no order explains the second read.
    let ok = format!(
        "{REGISTER}{}\n{}\n",
        r#"{"client":0,"call":0,"return":10,"type":"write","value":1,"answer":{}}"#,
        r#"{"client":1,"call":20,"return":30,"type":"read","answer":{"value":1}}"#
    );
    let out = bin().args(["check-history"]).arg(history_file(&d, "ok.jsonl", &ok)).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).starts_with("linearizable: one order explains every answer (2 operations"), "{}", text(&out.stdout));

    let stale = format!("{ok}{}\n", r#"{"client":2,"call":40,"return":50,"type":"read","answer":{"value":null}}"#);
    let out = bin().args(["check-history"]).arg(history_file(&d, "stale.jsonl", &stale)).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.starts_with("VIOLATION not linearizable: the register: no order of its 3 operations"), "{s}");
    assert!(s.contains("op 2 (client 2, 0.000040 s–0.000050 s): read → nothing"), "the verdict names the read: {s}");

    // A write of unknown outcome may take effect any time after its call: this read is fine.
    let late = format!(
        "{REGISTER}{}\n{}\n",
        r#"{"client":0,"call":0,"return":null,"type":"write","value":7,"answer":null}"#,
        r#"{"client":1,"call":900,"return":950,"type":"read","answer":{"value":7}}"#
    );
    let out = bin().args(["check-history"]).arg(history_file(&d, "late.jsonl", &late)).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

/// Issue 28: a serializable read may lag the cluster, but must return the key's state at the
/// revision it claims: one that claims revision 8 while showing revision 5's value is named.
#[test]
fn check_history_names_a_serializable_read_older_than_the_revision_it_claims() {
    let d = dirs();
    let etcd = "{\"format\":\"shakedown-history\",\"version\":1,\"model\":\"etcd\"}\n";
    let writes = [
        r#"{"client":0,"call":0,"return":10,"type":"put","key":"k","value":"a","answer":{"revision":5}}"#,
        r#"{"client":0,"call":20,"return":30,"type":"put","key":"k","value":"b","answer":{"revision":8}}"#,
    ]
    .join("\n");
    // Behind, but exactly revision 6's state: fine.
    let lagging = format!(
        "{etcd}{writes}\n{}\n",
        r#"{"client":1,"member":"m2","call":40,"return":50,"type":"get","key":"k","serializable":true,"answer":{"revision":6,"kv":{"value":"a","mod_revision":5}}}"#
    );
    let out = bin().args(["check-history"]).arg(history_file(&d, "lagging.jsonl", &lagging)).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let lying = format!(
        "{etcd}{writes}\n{}\n",
        r#"{"client":1,"member":"m2","call":40,"return":50,"type":"get","key":"k","serializable":true,"answer":{"revision":8,"kv":{"value":"a","mod_revision":5}}}"#
    );
    let out = bin().args(["check-history"]).arg(history_file(&d, "lying.jsonl", &lying)).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.starts_with("VIOLATION serializable read: op 2 (client 1 via m2"), "{s}");
    assert!(s.contains("the key was written again at revision 8") && s.contains("op 1 (client 0"), "names the write it missed: {s}");
}

#[test]
fn check_history_of_a_bad_file_is_a_usage_error_naming_the_line() {
    let d = dirs();
    let bad = format!("{REGISTER}{}\n", r#"{"client":0,"call":0,"return":10,"type":"write","value":1}"#);
    let out = bin().args(["check-history"]).arg(history_file(&d, "bad.jsonl", &bad)).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad.jsonl: line 2: missing field `answer` (null when the request got no answer)"),
        "{}",
        text(&out.stderr)
    );
    let out = bin().args(["check-history", "/nonexistent/history.jsonl"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A search that runs out of its bound is undecided (exit 6), never a pass.
#[test]
fn check_history_past_its_bound_is_undecided() {
    let d = dirs();
    let mut h = String::from(REGISTER);
    for c in 0..12 {
        h.push_str(&format!("{{\"client\":{c},\"call\":0,\"return\":100,\"type\":\"write\",\"value\":{c},\"answer\":{{}}}}\n"));
    }
    h.push_str(r#"{"client":99,"call":0,"return":100,"type":"read","answer":{"value":1000}}"#);
    let file = history_file(&d, "wide.jsonl", &h);
    let out = bin().args(["check-history", "--bound", "50"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stdout));
    assert!(text(&out.stdout).starts_with("UNDECIDED: 1 key(s) not decided within 50 steps each"), "{}", text(&out.stdout));
    let out = bin().args(["check-history"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "with the default bound it is decided: {}", text(&out.stdout));
}

/// Every shakedown command line in the README's and docs' code blocks is one this shakedown
/// accepts (clap parses it: subcommands, flags and values exist), and every subcommand of
/// `--help` is in the README's command table: the help and the docs cannot drift apart.
#[test]
fn the_docs_command_lines_parse_and_the_readme_lists_every_subcommand() {
    use clap::{CommandFactory, Parser};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    files.extend(
        std::fs::read_dir(root.join("docs")).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")),
    );
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let mut in_block = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_block = !in_block;
                continue;
            }
            let line = line.trim().trim_start_matches("$ ");
            let args = ["shakedown ", "cargo run --release -- ", "cargo run --profile quick -- ", "./target/release/shakedown "]
                .iter()
                .find_map(|p| line.strip_prefix(p));
            let (true, Some(args)) = (in_block, args) else { continue };
            // A trailing comment is the docs' own.
            let args = args.split("  #").next().unwrap().trim();
            let words = shlex::split(args).unwrap_or_else(|| panic!("{}:{}: unbalanced quotes: {line}", file.display(), n + 1));
            let argv = std::iter::once("shakedown".to_string()).chain(words);
            if let Err(e) = shakedown::cli::Cli::try_parse_from(argv) {
                panic!("{}:{}: `{line}` is not a valid command line:\n{e}", file.display(), n + 1);
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "the docs' command lines were found ({checked})");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for sub in shakedown::cli::Cli::command().get_subcommands().map(|c| c.get_name().to_string()) {
        if sub == "help" {
            continue;
        }
        assert!(readme.contains(&format!("| `shakedown {sub}")), "README's command table lists `shakedown {sub}`");
    }
}

/// The repository's own inputs, each by path from the crate root.
fn repo(path: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path).display().to_string()
}

/// The whole app profile of docs/app-target.md, written to `dir`.
fn documented_app_profile(dir: &std::path::Path) -> std::path::PathBuf {
    let page = std::fs::read_to_string(repo("docs/app-target.md")).unwrap();
    let from = page.find("2. Describe the application in an app profile").expect("the app target page's app profile step");
    let block = page[from..].split("```toml").nth(1).and_then(|b| b.split("```").next()).expect("its toml block");
    let text: String = block.lines().map(|l| l.strip_prefix("   ").unwrap_or(l)).collect::<Vec<_>>().join("\n");
    let p = dir.join("app.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// Every file under `dir`, as paths relative to it.
fn listing(dir: &std::path::Path) -> Vec<String> {
    walkdir(dir).into_iter().map(|p| p.strip_prefix(dir).unwrap().display().to_string()).collect()
}

fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        out.push(e.path());
        if e.path().is_dir() {
            out.extend(walkdir(&e.path()));
        }
    }
    out.sort();
    out
}

/// `validate` recognises and accepts, offline, what the repository ships: every profile of
/// ci/profiles (by file and by name), the kube profile of ci/k8s, the app profile of
/// docs/app-target.md, and the seed records of seeds/ (given as a directory); one `ok:` line
/// each with its kind and a summary, exit 0, nothing created where it ran.
#[test]
fn validate_accepts_the_shipped_profiles_app_and_kube_profiles_and_seed_records() {
    let cwd = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let app = documented_app_profile(files.path());
    let profiles: Vec<String> = std::fs::read_dir(repo("ci/profiles"))
        .unwrap()
        .flatten()
        .map(|e| e.path().display().to_string())
        .filter(|p| p.ends_with(".toml"))
        .collect();
    assert!(profiles.len() >= 8, "{profiles:?}");
    let records: Vec<String> = std::fs::read_dir(repo("seeds"))
        .unwrap()
        .flatten()
        .map(|e| e.path().display().to_string())
        .filter(|p| p.ends_with(".toml"))
        .collect();
    assert!(!records.is_empty());
    let mut args =
        vec!["validate".to_string(), "default".into(), repo("ci/k8s/kube-profile.toml"), app.display().to_string(), repo("seeds")];
    args.extend(profiles.iter().cloned());
    let out = bin().current_dir(cwd.path()).args(&args).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert_eq!(stdout.lines().count(), 3 + records.len() + profiles.len(), "one line per input: {stdout}");
    assert!(stdout.lines().all(|l| l.starts_with("ok: ")), "{stdout}");
    let line = |path: &str| {
        stdout.lines().find(|l| l.starts_with(&format!("ok: {path}: "))).unwrap_or_else(|| panic!("no line for {path}: {stdout}"))
    };
    assert!(line("default").contains(": profile default · stack etcd · 3 members on 3 sites"), "{stdout}");
    for p in &profiles {
        assert!(line(p).contains(": profile "), "{p}: {stdout}");
    }
    assert!(line(&repo("ci/profiles/app-smoke.toml")).contains("runs on --target app"), "{stdout}");
    assert!(line(&repo("ci/k8s/kube-profile.toml")).contains(": kube profile · upgrades to 3.5 (v1.30.0)"), "{stdout}");
    assert!(line(&app.display().to_string()).contains(": app profile "), "{stdout}");
    for r in &records {
        assert!(line(r).contains(": seed record seed "), "{r}: {stdout}");
    }
    assert!(listing(cwd.path()).is_empty(), "validate created {:?}", listing(cwd.path()));
}

/// `validate` refuses each bad input with its file and the loader's reason — malformed TOML at
/// its line and column, a value out of range, a record whose failure.step is past its plan, a
/// record cut short, an app profile with an empty namespace, a kube profile with a zero bound, a
/// file whose kind cannot be told, a file that does not exist — exits 2, still says ok for the
/// valid input beside them, and creates nothing.
#[test]
fn validate_refuses_bad_inputs_with_the_file_and_the_reason() {
    let cwd = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let f = |name: &str, body: &str| {
        let p = files.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let record = std::fs::read_to_string(repo("seeds/seed-4-leaks-recover-leaves-rule.toml")).unwrap();
    assert!(record.contains("\nstep = 4\n"));
    let cases: Vec<(Vec<String>, String, &str)> = vec![
        (vec![], f("malformed.toml", "name = \"x\"\nsteps = \n"), "line 2, column 9"),
        (
            vec!["--profile".into()],
            f("malformed-profile.toml", "name = \"x\"\nsteps = \n"),
            "not a valid profile: TOML parse error at line 2, column 9",
        ),
        (vec![], f("zero.toml", "name = \"zero\"\nsteps = 0\nversions = [\"3.5\"]\n"), "profile \"zero\": steps must be at least 1"),
        (vec![], f("members.toml", "name = \"big\"\nsteps = 5\nmembers = 12\nversions = [\"3.5\"]\n"), "members = 12 is more than the 9"),
        (
            vec![],
            f("past.toml", &record.replacen("\nstep = 4\n", "\nstep = 4000\n", 1)),
            "failure.step = 4000 is past the recorded plan's 8 ops",
        ),
        (vec!["--record".into()], f("cut.toml", &record[..record.len() / 2]), "not a valid seed record"),
        (vec![], f("empty-ns.toml", "namespace = \"\"\nstatefulset = \"db\"\n"), "namespace = \"\" is not a Kubernetes name: it is empty"),
        (vec!["--kube-profile".into()], f("rollout.toml", "[timeouts]\nrollout = \"0s\"\n"), "[timeouts] rollout must be more than zero"),
        (
            vec![],
            f("which.toml", "versions = [\"3.5\"]\n"),
            "cannot tell what it is: its keys (versions) fit a profile and a kube profile equally",
        ),
        (vec![], f("nothing.toml", "colour = \"blue\"\n"), "cannot tell what it is: none of its keys (colour)"),
        (vec![], files.path().join("missing.toml").display().to_string(), "cannot read it: No such file"),
        (vec!["--app-profile".into()], files.path().join("missing-app.toml").display().to_string(), "cannot read app profile"),
    ];
    for (flag, path, want) in &cases {
        let out = bin().current_dir(cwd.path()).arg("validate").args(flag).arg(path).arg("smoke").output().unwrap();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(2), "{path}: {stdout}\n{stderr}");
        assert!(stderr.contains(&format!("error: {path}: ")) && stderr.contains(want), "{path}: wanted {want:?} in {stderr}");
        assert!(stderr.contains("error: 1 of 2 inputs are not valid"), "{stderr}");
        assert!(stdout.starts_with("ok: smoke: profile smoke"), "the valid input beside it: {stdout}");
    }
    let out = bin().current_dir(cwd.path()).arg("validate").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "nothing to validate is a usage error");
    assert!(listing(cwd.path()).is_empty(), "validate created {:?}", listing(cwd.path()));
}

/// The top-level help names the three targets, the application target included.
#[test]
fn the_top_level_help_names_every_target() {
    let out = bin().arg("--help").output().unwrap();
    let help = text(&out.stdout);
    assert!(help.contains("--target kube") && help.contains("--target app") && help.contains("local etcd testbed"), "{help}");
    assert!(help.contains("validate"), "{help}");
}

/// `--dry-run` is taken by `run --target app` (it then fails on what it reads first, here the
/// kubeconfig, not on the flag) and refused, with the targets that take it, by the local target
/// and by a soak.
#[test]
fn dry_run_is_taken_by_the_app_target_and_refused_elsewhere() {
    let d = dirs();
    std::fs::create_dir_all(&d.runs).unwrap();
    let app = d.runs.join("app.toml");
    std::fs::write(&app, "namespace = \"db\"\nstatefulset = \"db\"\n").unwrap();
    let app = app.display().to_string();
    let out = run(
        &[
            "run",
            "--target",
            "app",
            "--dry-run",
            "--app-profile",
            &app,
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--profile",
            "app-smoke",
            "--seed",
            "1",
        ],
        &d,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot load the kubeconfig /nonexistent/kubeconfig"), "{}", text(&out.stderr));
    let left: Vec<_> = std::fs::read_dir(&d.runs).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, ["app.toml"], "a run refused at connect leaves no run directory");
    // Nor the runs directory, when the run made it.
    let fresh = dirs();
    std::fs::create_dir_all(&fresh.seeds).unwrap();
    let app2 = fresh.seeds.join("app.toml");
    std::fs::write(&app2, "namespace = \"db\"\nstatefulset = \"db\"\n").unwrap();
    let args = ["run", "--target", "app", "--app-profile", app2.to_str().unwrap(), "--kubeconfig", "/nonexistent/kubeconfig"];
    let out = run(&[&args[..], &["--profile", "app-smoke", "--seed", "1"]].concat(), &fresh);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(!fresh.runs.exists(), "the runs directory the refused run made is gone too");
    let out = run(&["run", "--target", "local", "--dry-run", "--seed", "1"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--dry-run is for the kube and app targets; --target local does not take it"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["soak", "--target", "app", "--for", "1m", "--dry-run", "--app-profile", &app, "--profile", "app-smoke"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("a soak sends its writes"), "{}", text(&out.stderr));
    // A dry replay or shrink could only say "did not reproduce": refused before the record is read.
    for (cmd, why) in [("replay", "a replay must send its writes"), ("shrink", "a shrink must send its writes")] {
        let out = run(&[cmd, "seeds/seed-1-durability-ack-before-write.toml", "--dry-run"], &d);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert!(text(&out.stderr).contains(why), "{cmd}: {}", text(&out.stderr));
    }
}
