//! `--target kube`: a Cluster API Cluster on a management cluster (see `shakedown::target::kube`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use shakedown::events::EventLog;
use shakedown::exit::{Exit, Fatal};
use shakedown::faults::{Plan, Profile};
use shakedown::invariants::InvariantId;
use shakedown::profiles;
use shakedown::record::{now_rfc3339, KubeRecord};
use shakedown::target::kube::profile::KubeProfile;
use shakedown::target::kube::{KubeConfig, KubeError, KubeTarget};
use shakedown::target::Target;

use super::session::{create_run_dir, drive, new_run_id, weights_text, Exec, Interrupted, RunResult};
use super::{KubeOpts, RunOpts};

pub fn kube_fatal(e: KubeError) -> Fatal {
    match e {
        KubeError::Usage(m) => Fatal::usage(m),
        KubeError::Refused(m) | KubeError::Environment(m) => Fatal::environment(m),
    }
}

/// The Cluster and kube profile of a kube run: from the flags, else from the record replayed.
pub fn kube_record(opts: &KubeOpts, recorded: Option<&KubeRecord>) -> Result<KubeRecord, Fatal> {
    let cluster = match (&opts.cluster, recorded) {
        (Some(c), _) => c.clone(),
        (None, Some(r)) => r.cluster.clone(),
        (None, None) => return Err(Fatal::usage("--target kube needs --cluster NAMESPACE/NAME (the Cluster API Cluster under test)")),
    };
    match cluster.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {}
        _ => return Err(Fatal::usage(format!("--cluster {cluster:?}: expected NAMESPACE/NAME"))),
    }
    let kube_profile = match (&opts.kube_profile, recorded) {
        (Some(p), _) => KubeProfile::load(p).map_err(Fatal::usage)?,
        (None, Some(r)) => r.kube_profile.clone(),
        (None, None) => KubeProfile::default(),
    };
    let context = opts.context.clone().or_else(|| recorded.and_then(|r| r.context.clone()));
    Ok(KubeRecord { cluster, context, kube_profile })
}

/// What the replay command of a kube record needs besides the file.
pub fn replay_flags(opts: &KubeOpts, kube: Option<&KubeRecord>) -> String {
    if kube.is_none() {
        return String::new();
    }
    opts.kubeconfig.as_ref().map(|k| format!(" --kubeconfig {}", k.display())).unwrap_or_default()
}

fn kube_config(opts: &RunOpts, kube: &KubeRecord, run_id: &str) -> KubeConfig {
    let (ns, name) = kube.cluster.split_once('/').expect("checked by kube_record");
    KubeConfig {
        kubeconfig: opts.kube.kubeconfig.clone(),
        context: kube.context.clone(),
        namespace: ns.into(),
        name: name.into(),
        dry_run: opts.kube.dry_run,
        profile: kube.kube_profile.clone(),
        run_id: run_id.into(),
    }
}

/// The invariants the kube target can observe: consistency and durability need etcd itself (not
/// reached by the kube target), reachability needs a probe or check in the kube profile.
fn kube_invariants(profile: &Profile, kube: &KubeRecord) -> Result<(Vec<InvariantId>, Vec<String>), Fatal> {
    let p = &kube.kube_profile;
    let mut dropped = Vec::new();
    let ids = profiles::invariants(profile)?
        .into_iter()
        .filter(|id| {
            let keep = match id {
                InvariantId::Consistency | InvariantId::Durability => false,
                InvariantId::Reachability => !(p.probes.is_empty() && p.commands.is_empty() && p.conditions.is_empty()),
                _ => true,
            };
            if !keep {
                dropped.push(id.to_string());
            }
            keep
        })
        .collect();
    Ok((ids, dropped))
}

/// `--dry-run`: reads the Cluster, then prints every write each op would make, and makes none.
pub async fn dry_run(opts: &RunOpts, kube: &KubeRecord, profile: &Profile, plan: &Plan) -> Result<Exit, Fatal> {
    let run_id = new_run_id();
    let model = profile.initial_model();
    let mut target = KubeTarget::connect(kube_config(opts, kube, &run_id), profile, &model).await.map_err(kube_fatal)?;
    println!("dry run: seed {} · profile {} · {} ops · Cluster {} · no request below is sent", plan.seed, profile.name, plan.ops.len(), kube.cluster);
    for (m, machine) in target.bindings() {
        println!("member {m} = Machine {machine}");
    }
    for note in target.notes() {
        println!("note: {note}");
    }
    let mut model = model;
    for (i, op) in plan.ops.iter().enumerate() {
        println!("step {}: {op}", i + 1);
        if let Err(reason) = target.supports(op) {
            println!("  skipped: {reason}");
            continue;
        }
        let before = model.clone();
        if model.apply(op).is_err() {
            println!("  skipped: an earlier op was skipped");
            continue;
        }
        target.execute(op, &before, &model).await.map_err(|e| Fatal::environment(e.to_string()))?;
    }
    target.teardown().await;
    println!("dry run: {} write request(s) printed, none sent", target.dry_run_writes.len());
    Ok(Exit::Pass)
}

/// Runs `plan` against the Cluster; resumes what it paused and removes its objects whatever
/// happens; then the record and reports, as for the local target.
pub async fn execute_kube(x: &Exec<'_>, kube: &KubeRecord, profile: &Profile, plan: &Plan) -> Result<RunResult, Fatal> {
    let (invariants, dropped) = kube_invariants(profile, kube)?;
    let run_id = new_run_id();
    let run_dir = create_run_dir(x.runs_dir, &run_id)?;
    std::fs::write(run_dir.join("plan.toml"), toml::to_string(plan).expect("plans serialize"))
        .and_then(|_| std::fs::write(run_dir.join("profile.toml"), profile.to_toml()))
        .map_err(|e| Fatal::environment(format!("cannot write the plan into {}: {e}", run_dir.display())))?;
    let say = |text: &str| x.say(text);
    say(&format!("seed {} · profile {} · {} ops · run {run_id} · Cluster {}\nweights {}\nrun directory {}", plan.seed, profile.name, plan.ops.len(), kube.cluster, weights_text(plan), run_dir.display()));
    if !dropped.is_empty() {
        say(&format!("not checked on the kube target: {} (consistency and durability need etcd access; reachability needs probes or checks in the kube profile)", dropped.join(", ")));
    }
    let mut events = EventLog::create(&run_dir.join("events.jsonl"));
    events.emit("run-start", json!({"run_id": run_id, "seed": plan.seed, "profile": profile.name, "weights": plan.weights, "ops": plan.ops.len(), "target": "kube", "cluster": kube.cluster}));
    let model = profile.initial_model();
    let t0 = std::time::Instant::now();
    let mut result = RunResult {
        outcome: Err(Interrupted),
        run_id: run_id.clone(),
        run_dir: run_dir.clone(),
        started: now_rfc3339(),
        elapsed: Duration::ZERO,
        versions: BTreeMap::new(),
        profile: profile.clone(),
        plan: plan.clone(),
        bug: None,
        record: None,
        kube: Some(kube.clone()),
    };
    let mut target = tokio::select! {
        t = KubeTarget::connect(kube_config(x.opts, kube, &run_id), profile, &model) => t.map_err(kube_fatal)?,
        _ = x.interrupt.count(1) => return Ok(result),
    };
    let bindings: Vec<String> = target.bindings().iter().map(|(m, n)| format!("{m}={n}")).collect();
    events.emit("bring-up", json!({"ms": t0.elapsed().as_millis() as u64, "bindings": bindings}));
    say(&format!("connected in {}ms · members {}", t0.elapsed().as_millis(), bindings.join(" ")));
    for note in target.notes() {
        events.emit("kube-note", json!({"note": note}));
        say(&format!("note: {note}"));
    }
    result.versions = target.component_versions();
    drive(x, &mut target, plan, profile, &invariants, events, result, t0, "interrupted: shakedown's objects were removed and the control plane resumed").await
}
