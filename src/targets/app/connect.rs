//! The start of a run: the connection (the kube target's kubeconfig and context), the checks of
//! the application, the data workload's first write, and the run's ConfigMap (what `reap
//! --kube` reads after a kill -9).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};
use kube::Client;
use shakedown_faults::Profile;

use super::data::Writer;
use super::resources::resource_kinds;
use super::spec::{AppProfile, AppSpec};
use super::{bounded, opted_in, selector_of, AppTarget, FIRST_ACK_BOUND};
use crate::exit::Fatal;
use crate::k8s::{client, RunOwner, OPT_IN};
use crate::targets::StartContext;

impl AppTarget {
    /// Connects to the cluster and checks the application (the namespace's opt-in, the
    /// StatefulSet's replicas against the profile's members, the operator), starts the data
    /// workload and awaits its first acknowledged write, then creates the run's ConfigMap.
    pub(super) async fn connect(spec: &AppSpec, ctx: &StartContext<'_>) -> Result<AppTarget, Fatal> {
        let p = &spec.app_profile;
        crate::targets::stack_fits(crate::targets::TargetKind::App, ctx.profile)?;
        let (client, evict_client, server) = clients(spec, ctx).await?;
        check_namespace(&client, &server, p).await?;
        let sts_selector = check_statefulset(&client, p, ctx.profile).await?;
        let operator_replicas = operator_replicas(&client, p).await?;
        let version = client.apiserver_version().await.map(|v| v.git_version).unwrap_or_else(|_| "unknown".into());
        let mut notes = vec![];
        if p.data.is_none() {
            notes.push("app-durability and app-linearizability not checked: the app profile has no [data] commands".into());
        }
        let cm = run_configmap(ctx.run_id, p, operator_replicas);
        let dry_run = ctx.options.kube.dry_run;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &p.namespace);
        let mut dry_run_writes = vec![];
        // A dry run starts no data workload (its commands write) and creates no ConfigMap: both
        // are printed, as every later write is.
        let writer = match &p.data {
            Some(d) if dry_run => {
                let w = match &d.session {
                    None => format!(
                        "exec in the Ready pods of {}: {:?} every {}ms (the data workload; its first acknowledged write awaited for up to {}s)",
                        d.selector,
                        d.write,
                        d.interval.as_millis(),
                        p.op_timeout.min(FIRST_ACK_BOUND).as_secs()
                    ),
                    Some(s) => format!(
                        "exec in a Ready pod of {}: {:?} per writer ({}), fed a write every {}ms (the data workload; its first acknowledged write awaited for up to {}s)",
                        s.selector.as_deref().unwrap_or(&d.selector),
                        s.command,
                        d.writers,
                        d.interval.as_millis(),
                        p.op_timeout.min(FIRST_ACK_BOUND).as_secs()
                    ),
                };
                println!("dry-run: {w}");
                dry_run_writes.push(w);
                None
            }
            // The data workload writes before the first fault: durability is checked on writes
            // made before it and under it, not on nothing.
            Some(d) => {
                let samples = crate::targets::samples::Samples::create(Some(&ctx.run_dir.join("workload.csv")));
                let w = Writer::start(client.clone(), &p.namespace, d.clone(), ctx.run_id, samples);
                w.first_ack(p.op_timeout.min(FIRST_ACK_BOUND)).await.map_err(|e| Fatal::environment(e.to_string()))?;
                Some(w)
            }
            None => None,
        };
        if dry_run {
            let w = format!("POST {} {}", cms.resource_url(), serde_json::to_value(&cm).unwrap_or_default());
            println!("dry-run: {w}");
            dry_run_writes.push(w);
        } else {
            bounded("create the run's ConfigMap", cms.create(&PostParams::default(), &cm))
                .await
                .map_err(|e| Fatal::environment(e.to_string()))?;
        }
        Ok(AppTarget {
            client,
            evict_client,
            server,
            spec: spec.clone(),
            run_id: ctx.run_id.to_string(),
            run_dir: ctx.run_dir.to_path_buf(),
            operator_replicas,
            sts_selector,
            writer,
            notes,
            version,
            log: vec![],
            backups: BTreeMap::new(),
            last_restore: None,
            restores: 0,
            probe_jobs: Default::default(),
            torn_down: false,
            dry_run,
            dry_run_writes: std::sync::Mutex::new(dry_run_writes),
        })
    }
}

/// The clients of the kubeconfig's cluster: the target's, one without kube-rs's retry (for
/// evictions), and the server's address.
async fn clients(spec: &AppSpec, ctx: &StartContext<'_>) -> Result<(Client, Client, String), Fatal> {
    let config = client::load_config(ctx.options.kube.kubeconfig.as_deref(), spec.context.as_deref()).await.map_err(Fatal::from)?;
    let counter = client::RequestCounter::default();
    let (client, server) = client::build(config.clone(), &counter).map_err(Fatal::from)?;
    // Evictions answer 429 when a PodDisruptionBudget refuses them: that answer is the
    // drain's to see, not kube-rs's own retry's (429, 503, 504; on by default).
    let mut no_retry = config;
    no_retry.default_retry = false;
    let (evict_client, _) = client::build(no_retry, &counter).map_err(Fatal::from)?;
    Ok((client, evict_client, server))
}

/// The app's namespace exists and has opted in to chaos.
async fn check_namespace(client: &Client, server: &str, p: &AppProfile) -> Result<(), Fatal> {
    let ns: Api<Namespace> = Api::all(client.clone());
    let namespace = bounded(&format!("namespace {}", p.namespace), ns.get_opt(&p.namespace))
        .await
        .map_err(|e| Fatal::environment(format!("{server}: {e}")))?;
    let Some(namespace) = namespace else { return Err(Fatal::usage(format!("namespace {} does not exist on {server}", p.namespace))) };
    if !opted_in(namespace.metadata.annotations.as_ref()) {
        return Err(Fatal::environment(format!(
            "namespace {} has not opted in to chaos: annotate it with {OPT_IN}=\"true\" (kubectl annotate namespace {} {OPT_IN}=true)",
            p.namespace, p.namespace
        )));
    }
    Ok(())
}

/// The StatefulSet exists with as many replicas as the profile has members: its selector.
async fn check_statefulset(client: &Client, p: &AppProfile, profile: &Profile) -> Result<String, Fatal> {
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), &p.namespace);
    let set = bounded("statefulset", sts.get_opt(&p.statefulset))
        .await
        .map_err(|e| Fatal::environment(e.to_string()))?
        .ok_or_else(|| Fatal::usage(format!("StatefulSet {}/{} does not exist", p.namespace, p.statefulset)))?;
    let replicas = set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let sts_selector = selector_of(set.spec.as_ref().map(|s| &s.selector));
    if replicas as u32 != profile.members {
        return Err(Fatal::usage(format!(
            "StatefulSet {}/{} has {replicas} replicas; the profile {} has members = {}: they must match",
            p.namespace, p.statefulset, profile.name, profile.members
        )));
    }
    Ok(sts_selector)
}

/// The replicas of the operator the profile names (at least 1), which it goes back to.
async fn operator_replicas(client: &Client, p: &AppProfile) -> Result<Option<i32>, Fatal> {
    let Some(name) = &p.operator else { return Ok(None) };
    let d: Api<Deployment> = Api::namespaced(client.clone(), &p.namespace);
    let dep = bounded("operator", d.get_opt(name))
        .await
        .map_err(|e| Fatal::environment(e.to_string()))?
        .ok_or_else(|| Fatal::usage(format!("the operator's Deployment {}/{name} does not exist", p.namespace)))?;
    Ok(Some(dep.spec.and_then(|s| s.replicas).unwrap_or(1).max(1)))
}

/// The run's object, for `reap --kube` after a kill -9: which process runs (`host`, `pid`), and
/// its [`RunRecord`] — the operator's replicas to scale it back to, the kinds of objects to delete.
fn run_configmap(run_id: &str, p: &AppProfile, operator_replicas: Option<i32>) -> ConfigMap {
    let mut data = BTreeMap::from([("app".to_string(), p.statefulset.clone())]);
    RunRecord::of(p, operator_replicas).write(&mut data);
    RunOwner::this_process().configmap(&format!("shakedown-{run_id}"), run_id, data)
}

/// What an application-target run writes in its ConfigMap beside the process (`app`, `host`,
/// `pid`, `started`): what its cleanup undoes, read back by `reap --kube` after a kill -9.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRecord {
    /// The operator's Deployment and the replicas it goes back to (`app-operator`,
    /// `app-operator-replicas`).
    pub operator: Option<(String, i32)>,
    /// The kinds (`group/version/Kind`) of the operator's objects the run may create: its
    /// `[backup]` and `[restore]` (`app-resources`).
    pub resources: Vec<String>,
}

impl RunRecord {
    /// The record of a run of app profile `p` whose operator had `operator_replicas` at its start.
    pub fn of(p: &AppProfile, operator_replicas: Option<i32>) -> RunRecord {
        RunRecord {
            operator: p.operator.clone().zip(operator_replicas),
            resources: resource_kinds(p).iter().map(|(v, k)| format!("{v}/{k}")).collect(),
        }
    }

    /// Its keys, into a ConfigMap's `data`.
    fn write(&self, data: &mut BTreeMap<String, String>) {
        if let Some((op, r)) = &self.operator {
            data.insert("app-operator".into(), op.clone());
            data.insert("app-operator-replicas".into(), r.to_string());
        }
        if !self.resources.is_empty() {
            data.insert("app-resources".into(), self.resources.join(","));
        }
    }

    /// The record in a run's ConfigMap data, if an application-target run wrote it (it has `app`).
    pub fn read(data: &BTreeMap<String, String>) -> Option<RunRecord> {
        let replicas = data.get("app-operator-replicas").and_then(|r| r.parse::<i32>().ok());
        data.contains_key("app").then(|| RunRecord {
            operator: data.get("app-operator").cloned().zip(replicas),
            resources: data
                .get("app-resources")
                .map(|r| r.split(',').filter(|k| !k.is_empty()).map(String::from).collect())
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run writes is what `reap --kube` reads back; a kube-target run's ConfigMap is none.
    #[test]
    fn a_run_record_reads_back_as_written() {
        for record in [
            RunRecord::default(),
            RunRecord { operator: Some(("etcd-operator".into(), 2)), resources: vec![] },
            RunRecord { operator: None, resources: vec!["etcd.example/v1/EtcdBackup".into(), "etcd.example/v1/EtcdRestore".into()] },
        ] {
            let mut data = BTreeMap::from([("app".to_string(), "etcd".to_string())]);
            record.write(&mut data);
            let data = RunOwner::this_process().configmap("shakedown-r", "r", data).data.unwrap();
            assert_eq!(RunRecord::read(&data), Some(record));
        }
        let kube_run = BTreeMap::from([("cluster".to_string(), "c".to_string()), ("pid".to_string(), "1".to_string())]);
        assert_eq!(RunRecord::read(&kube_run), None);
    }
}
