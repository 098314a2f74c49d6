//! Measures the kube target's issue-5 targets against the real test apiserver and the stand-in
//! controller, and prints them (never asserted on timing):
//! - non-watch API requests per kind while waiting on a rollout (target: ≤ 2 per kind per step);
//! - how long after the apiserver accepted a status change the target's watch cache has it
//!   (target: median ≤ 200 ms).
//!
//! Run: `CARGO_TARGET_DIR=... cargo test --test kube_measure -- --ignored --nocapture`
#![allow(clippy::await_holding_lock, reason = "a std Mutex serializes the tests that share the machine: held across awaits on purpose")]

mod kube_common;

use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube_common::{cluster, namespace, require_apiserver, standin, KubeEnv};
use serde_json::{json, Value};
use shakedown::faults::{Model, Op, Profile, Version};
use shakedown::targets::kube::capi::{capi, CapiVersion};
use shakedown::targets::kube::profile::KubeProfile;
use shakedown::targets::kube::{KubeConfig, KubeTarget};
use shakedown::targets::Target;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn measure_requests_while_waiting_and_notice_latency() {
    let bin = require_apiserver();
    let env = KubeEnv::start(&bin).await;
    let client = env.client().await;
    namespace(&client, "m").await;
    cluster(&client, "m", "c", 3, &["fd-a", "fd-b", "fd-c"], true, "v1.29.0").await;
    let _standin = standin::start(client.clone(), "m", "c", Duration::from_millis(300), None);
    let profile = Profile::from_toml("name = \"m\"\nsteps = 2\nversions = [\"3.4\", \"3.5\"]").unwrap();
    let kube_profile = KubeProfile::from_toml("[versions.\"3.5\"]\nkubernetes = \"v1.30.0\"\n[timeouts]\nrollout = \"120s\"").unwrap();
    let model = profile.initial_model();
    let cfg = KubeConfig {
        kubeconfig: Some(env.kubeconfig.clone()),
        context: None,
        namespace: "m".into(),
        name: "c".into(),
        dry_run: false,
        profile: kube_profile,
        run_id: "sd-measure".into(),
        run_dir: None,
    };
    let mut target = KubeTarget::connect(cfg, &profile, &model).await.expect("connect");
    // Wait until the stand-in brought up 3 healthy Machines.
    assert!(
        target
            .wait_machines(Duration::from_secs(60), |ms| ms
                .iter()
                .filter(|m| m.data.pointer("/status/conditions/0/status") == Some(&json!("True")))
                .count()
                == 3)
            .await
    );
    let mut model: Model = model;
    println!("\n== non-watch API requests while waiting on a rollout (per step, by kind)");
    for op in [Op::RollingReplace, Op::RollingUpgrade { to: Version::new(3, 5) }, Op::RollingReplace] {
        let before = model.clone();
        model.apply(&op).unwrap();
        let t0 = Instant::now();
        target.execute(&op, &before, &model).await.expect("op");
        for shakedown::targets::Note { kind, detail: v } in target.take_notes() {
            if kind == "kube-wait" {
                println!("{:<26} wait {:>6}ms  non-watch requests while waiting: {}", op.to_string(), v["ms"], v["non_watch_requests"]);
            }
            if kind == "kube-requests" {
                println!(
                    "{:<26} step {:>6}ms  non-watch requests in the whole step (writes included): {}",
                    op.to_string(),
                    t0.elapsed().as_millis(),
                    v["non_watch_requests"]
                );
            }
        }
        target.end_step().await;
    }

    println!("\n== status change noticed by the watch cache after the apiserver accepted it");
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), "m", &capi("Machine", CapiVersion::V1Beta2));
    let name = machines.list(&Default::default()).await.unwrap().items[0].metadata.name.clone().unwrap();
    let mut lat = vec![];
    let mut from_send = vec![];
    for i in 0..40 {
        let marker = format!("probe {i}");
        let body = json!({"status": {"lastUpdated": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(), "addresses": [{"type": "Hostname", "address": marker}]}});
        let t_sent = Instant::now();
        machines.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body)).await.unwrap();
        let t_accepted = Instant::now();
        let seen = target
            .wait_machines(Duration::from_secs(5), |ms| {
                ms.iter().any(|m| m.data.pointer("/status/addresses/0/address").and_then(Value::as_str) == Some(marker.as_str()))
            })
            .await;
        assert!(seen, "change {i} not noticed within 5s");
        // From the request's answer (the apiserver accepted it) to the cache having it; a
        // notice before the answer arrived counts as 0.
        lat.push(t_accepted.elapsed().as_secs_f64() * 1000.0);
        // An upper bound: from sending the request (includes the apiserver's own write).
        from_send.push(t_sent.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (what, v) in [("after the apiserver's answer", &mut lat), ("after the request was sent", &mut from_send)] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!(
            "{} changes, noticed {what}: median {:.1}ms, p90 {:.1}ms, max {:.1}ms",
            v.len(),
            v[v.len() / 2],
            v[v.len() * 9 / 10],
            v[v.len() - 1]
        );
    }
    target.teardown().await;
}
