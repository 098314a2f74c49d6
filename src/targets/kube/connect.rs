//! Connecting: the kubeconfig, the opt-in, the Cluster's shape, the watch caches, the run's lock
//! object and the first bindings of members to Machines.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use kube::api::{Api, DynamicObject};
use kube::runtime::watcher::Config as WatchConfig;
use serde_json::Value;
use shakedown_faults::{Model, OpKind, Profile};
use shakedown_invariants::ServingSample;
use tokio::sync::watch;
use tokio::time::Instant;

use super::capi::{capi, discover_capi, Discovery};
use super::command::{error_chain, HttpProber};
use super::workload::Workload;
use super::*;
use crate::k8s::client;
use crate::k8s::client::Watched;

impl KubeTarget {
    /// Connects, checks the opt-in and the Cluster's shape, fills the watch caches, takes the
    /// run's lock object (a ConfigMap labelled with the run id) and binds the plan's members
    /// to the control-plane Machines.
    pub async fn connect(cfg: KubeConfig, profile: &Profile, model: &Model) -> Result<KubeTarget, KubeError> {
        // The probes' HTTP clients first: a bad CA file is the profile's error, found before
        // anything is asked of the cluster.
        let probers = cfg
            .profile
            .probes
            .iter()
            .map(|p| {
                HttpProber::new(p.ca_file.as_deref(), p.insecure)
                    .map_err(|e| KubeError::Usage(format!("kube profile probe {}: {e}", p.url)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (client, counter, server) = client::connect(cfg.kubeconfig.as_deref(), cfg.context.as_deref()).await?;
        let (ns, name) = (cfg.namespace.clone(), cfg.name.clone());
        let reach = |e: kube::Error, what: String| match &e {
            kube::Error::Api(r) if r.code == 404 => KubeError::Usage(format!("{what} not found on {server}")),
            kube::Error::Api(r) if r.code == 403 => KubeError::Environment(format!(
                "{what}: forbidden ({}): the identity of the kubeconfig needs the RBAC of ci/k8s/rbac.yaml",
                r.message
            )),
            _ => KubeError::Environment(format!("cannot reach the management cluster at {server} ({what}): {}", error_chain(&e))),
        };
        let capi_version = discover_capi(&client).await.map_err(|e| match e {
            Discovery::Unreachable(e) => {
                KubeError::Environment(format!("cannot reach the management cluster at {server} (discovering its API groups): {e}"))
            }
            Discovery::NoClusterApi(e) => KubeError::Environment(format!("{e} (on {server})")),
        })?;
        let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &capi("Cluster", capi_version));
        let cluster = clusters.get(&name).await.map_err(|e| reach(e, format!("Cluster {ns}/{name}")))?;
        let opted_in = |m: Option<&BTreeMap<String, String>>| m.and_then(|m| m.get(OPT_IN)).is_some_and(|v| v == "true");
        if !opted_in(cluster.metadata.annotations.as_ref()) && !opted_in(cluster.metadata.labels.as_ref()) {
            return Err(KubeError::Refused(format!(
                "Cluster {ns}/{name} has not opted in to chaos: shakedown acts only on a Cluster annotated {OPT_IN}=\"true\" (kubectl annotate cluster -n {ns} {name} {OPT_IN}=true)"
            )));
        }
        let cref = cluster.data.pointer("/spec/controlPlaneRef").cloned().unwrap_or(Value::Null);
        let kind = cref.get("kind").and_then(Value::as_str).unwrap_or_default();
        let Some(kcp_name) = cref.get("name").and_then(Value::as_str).filter(|_| kind == "KubeadmControlPlane").map(str::to_string) else {
            return Err(KubeError::Usage(format!("Cluster {ns}/{name} has no KubeadmControlPlane as spec.controlPlaneRef (found {cref}): the kube target drives KubeadmControlPlane")));
        };
        let kcp_ar = capi("KubeadmControlPlane", capi_version);
        let kcps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kcp_ar);
        let kcp = kcps.get(&kcp_name).await.map_err(|e| reach(e, format!("KubeadmControlPlane {ns}/{kcp_name}")))?;
        let replicas = kcp.data.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(1);
        if replicas != profile.members as i64 {
            return Err(KubeError::Usage(format!(
                "the profile has {} members but KubeadmControlPlane {ns}/{kcp_name} has spec.replicas {replicas}: use a profile with members = {replicas}",
                profile.members
            )));
        }
        let infra_ref = capi_version.kcp_infra_ref(&kcp.data);
        let server_version = client.apiserver_version().await.map(|v| v.git_version).unwrap_or_else(|_| "unknown".into());

        // Watch caches.
        let (tx, rx) = watch::channel(0u64);
        let errors = Arc::new(Mutex::new(None));
        let sampler = Arc::new(Mutex::new(Sampler::default()));
        let by_name = |n: &str| WatchConfig::default().fields(&format!("metadata.name={n}"));
        let by_cluster = WatchConfig::default().labels(&format!("{CLUSTER_NAME_LABEL}={name}"));
        let s2 = sampler.clone();
        let on_machines: client::OnChange = Arc::new(move |store| {
            let mut s = s2.lock().unwrap_or_else(|e| e.into_inner());
            let Some(start) = s.start else { return };
            let ms = cp_machines(&store.state());
            let live: Vec<&CpMachine> = ms.iter().filter(|m| !m.deleting).collect();
            let serving: Vec<String> = live.iter().filter(|m| m.healthy).map(|m| m.name.clone()).collect();
            let size = live.len();
            if s.samples.last().is_some_and(|l| l.serving == serving && l.cluster_size == size) {
                return;
            }
            s.samples.push(ServingSample { at_ms: start.elapsed().as_millis() as u64, serving, cluster_size: size });
        });
        // The workload cluster (a note, not an error, when its Secret is missing).
        let mut notes = Vec::new();
        let mut workload_config = None;
        let workload = match workload::client_from_secret(&client, &counter, &ns, &name).await {
            Ok((wc, wserver, config)) => {
                workload_config = Some(config);
                Some(Workload::watch(wc, wserver, &tx, &errors))
            }
            Err(note) => {
                notes.push(note);
                None
            }
        };
        // The API workload in the workload cluster ([api]); never in a dry run (it writes).
        // Checked now (a named namespace must exist: bad input), started once the run's
        // ConfigMap exists (so that `reap --kube` finds what it writes).
        let api_plan = match (&cfg.profile.api, workload_config) {
            (None, _) => Err("needs an [api] table in the kube profile".to_string()),
            (Some(_), _) if cfg.dry_run => Err("a dry run sends no API traffic".to_string()),
            (Some(_), None) => Err("needs the workload cluster (see the note on its kubeconfig)".to_string()),
            (Some(spec), Some(config)) => match super::api::KubeApi::check(&config, spec).await {
                Ok(()) => Ok((spec.clone(), config)),
                Err(KubeError::Environment(e)) => {
                    notes.push(format!("API workload not started: {e}"));
                    Err(e)
                }
                Err(other) => return Err(other),
            },
        };
        // etcd through Cluster API's path ([etcd]): read-only, so a dry run reads it too.
        let etcd = match &cfg.profile.etcd {
            None => Err("needs an [etcd] table in the kube profile (etcd read through Cluster API's port-forward path)".to_string()),
            Some(spec) => {
                Ok(super::etcd_view::EtcdView::open(&client, workload.as_ref().map(|w| w.client.clone()), &ns, &name, spec, &cfg.run_id)
                    .await?)
            }
        };
        if let Ok(view) = &etcd {
            notes.push(view.note());
        }
        // Velero (backup and restore), unless hooks do both.
        let hooks = &cfg.profile.hooks;
        let velero_ns = cfg.profile.velero.namespace.clone();
        let velero = if hooks.contains_key(&OpKind::Backup) && hooks.contains_key(&OpKind::Restore) {
            Err("hooks set".to_string())
        } else {
            probe_velero(&client).await.map_err(|e| e.to_string())
        };
        let mut velero_watches = Vec::new();
        if velero.is_ok() {
            let by_run = WatchConfig::default().labels(&format!("{RUN_LABEL}={}", cfg.run_id));
            for kind in ["Backup", "Restore"] {
                velero_watches.push(Watched::start(
                    &client,
                    &velero_ar(kind),
                    &velero_ns,
                    by_run.clone(),
                    tx.clone(),
                    errors.clone(),
                    None,
                ));
            }
        }
        let mut infra = Vec::new();
        for spec in &cfg.profile.infra_machine_kinds {
            let ar = client::resource_of(spec).map_err(|e| KubeError::Usage(e.to_string()))?;
            infra.push(Watched::start(&client, &ar, &ns, by_cluster.clone(), tx.clone(), errors.clone(), None));
        }
        // Condition checks read watch caches too: observing makes no requests.
        let mut conditions = Vec::new();
        for c in &cfg.profile.conditions {
            let ar = c.resource();
            let lp = match (&c.name, &c.selector) {
                (Some(n), _) => by_name(n),
                (None, Some(sel)) => WatchConfig::default().labels(sel),
                (None, None) => WatchConfig::default(),
            };
            let ns = c.namespace.clone().unwrap_or_else(|| ns.clone());
            conditions.push(Watched::start(&client, &ar, &ns, lp, tx.clone(), errors.clone(), None));
        }
        let cache = Cache {
            cluster: Watched::start(&client, &capi("Cluster", capi_version), &ns, by_name(&name), tx.clone(), errors.clone(), None),
            kcp: Watched::start(&client, &kcp_ar, &ns, by_name(&kcp_name), tx.clone(), errors.clone(), None),
            machines: Watched::start(
                &client,
                &capi("Machine", capi_version),
                &ns,
                by_cluster.clone(),
                tx.clone(),
                errors.clone(),
                Some(on_machines),
            ),
            deployments: Watched::start(
                &client,
                &capi("MachineDeployment", capi_version),
                &ns,
                by_cluster,
                tx.clone(),
                errors.clone(),
                None,
            ),
            infra,
            velero: velero_watches,
            conditions,
            workload,
            changed: rx,
            errors,
        };
        let deadline = Instant::now() + cfg.profile.timeouts.sync;
        let mut changed = cache.changed.clone();
        while !cache.all().all(|w| w.synced()) {
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                let pending: Vec<&str> = cache.all().filter(|w| !w.synced()).map(|w| w.kind.as_str()).collect();
                return Err(KubeError::Environment(format!(
                    "the watches of {} did not start within {}s on {server}: {}",
                    pending.join(", "),
                    cfg.profile.timeouts.sync.as_secs(),
                    cache.last_error().unwrap_or_else(|| "no error reported".into())
                )));
            }
        }

        // Failure domains standing for the sites.
        let mut fds = cfg.profile.failure_domains.clone();
        if fds.is_empty() {
            let fd_field = cluster.data.pointer("/status/failureDomains").cloned().unwrap_or(Value::Null);
            fds = match fd_field {
                Value::Array(a) => a.iter().filter_map(|f| f.get("name").and_then(Value::as_str).map(str::to_string)).collect(),
                Value::Object(o) => o.keys().cloned().collect(),
                _ => vec![],
            };
        }
        if fds.is_empty() {
            fds = cp_machines(&cache.machines.objects()).into_iter().filter_map(|m| m.fd).collect::<BTreeSet<_>>().into_iter().collect();
        }
        fds.sort();
        fds.dedup();
        if fds.len() < profile.sites as usize {
            return Err(KubeError::Usage(format!(
                "the profile has {} sites but Cluster {ns}/{name} has {} failure domain(s) ({}): use a profile with sites = {}, or list them under failure_domains in the kube profile",
                profile.sites,
                fds.len(),
                fds.join(", "),
                fds.len().max(1)
            )));
        }
        if cfg.profile.failure_domains.is_empty() {
            fds.truncate(profile.sites as usize);
        }
        let mut versions = BTreeMap::new();
        versions.insert("kube-apiserver".into(), server_version);
        if let Some(v) = kcp.data.pointer("/spec/version").and_then(Value::as_str) {
            versions.insert("kubernetes".into(), v.to_string());
        }
        versions.insert("cluster".into(), format!("{ns}/{name}"));
        versions.insert("cluster-api".into(), capi_version.as_str().into());
        let op_timeout = cfg.profile.timeouts.rollout;
        // The disk ops' volume: the PersistentVolume named, or the one the claim is bound to.
        let disk_pv = match (&cfg.profile.disk, &cache.workload) {
            (None, _) => {
                Err("the kube profile names no [disk] volume (pvc = \"namespace/name\" of a probe workload, or pv = \"name\")".to_string())
            }
            (Some(_), None) => Err("the workload cluster is not observed (see the note at the start)".to_string()),
            (Some(d), Some(w)) => match (&d.pv, &d.pvc) {
                (Some(pv), _) => Ok(pv.clone()),
                (None, Some(claim)) => Ok(workload::volume_of_claim(&w.client, claim)
                    .await
                    .map_err(|e| KubeError::Usage(format!("kube profile [disk]: {e}")))?),
                (None, None) => Err("[disk] names no volume".to_string()),
            },
        };
        if let Err(why) = &velero {
            if why != "hooks set" {
                notes.push(format!("backup and restore: {why}; they need [hooks.backup] and [hooks.restore] in the kube profile"));
            }
        }
        let mut t = KubeTarget {
            client,
            counter,
            cfg,
            kcp_name,
            kcp_ar,
            capi_version,
            infra_ref,
            probers,
            site_fds: fds,
            cache,
            bindings: BTreeMap::new(),
            model: model.clone(),
            sampler,
            log: vec![],
            paused: false,
            versions,
            op_timeout,
            torn_down: false,
            lock_created: false,
            written_generation: BTreeMap::new(),
            retired: BTreeSet::new(),
            dry_run_writes: vec![],
            notes,
            disk_pv,
            detached: BTreeSet::new(),
            velero,
            velero_objects: vec![],
            lost: None,
            wait_failed: None,
            connected: BTreeMap::new(),
            api: Err("not started".into()),
            etcd,
        };
        t.take_lock().await.map_err(|e| KubeError::Environment(e.to_string()))?;
        t.api = match api_plan {
            Ok((spec, config)) => super::api::KubeApi::start(config, &spec, &t.cfg.run_id, t.cfg.run_dir.as_deref()).await.map_err(|e| {
                t.notes.push(format!("API workload not started: {e}"));
                e.to_string()
            }),
            Err(why) => Err(why),
        };
        t.rebind();
        if let Ok(view) = &mut t.etcd {
            if let Some(v) = view.versions(&cp_machines(&t.cache.machines.objects())).await {
                t.versions.insert("etcd".into(), v);
            }
        }
        t.connected = t.counter.snapshot();
        Ok(t)
    }
}
