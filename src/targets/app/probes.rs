//! The probes of `app-ready`, the app profile's `[[probes]]`: a command exec'd in a Ready pod, a
//! GET through the apiserver's service proxy, an object's field, or a checker Job (created as
//! `shakedown-<run>-check-N`, waited for, deleted).

use std::collections::BTreeMap;
use std::time::Instant;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use super::data::ready_pod;
use super::resources::resource_api_of;
use super::spec::{self, HttpProbe, ObjectProbe, ProbeCheck};
use super::{bounded, AppTarget, POLL, PROBE_BOUND, PROBE_JOB_BOUND};
use crate::k8s::exec::exec;

impl AppTarget {
    pub(super) async fn probes(&self) -> Vec<(String, Option<String>)> {
        let mut out = vec![];
        for p in &self.spec.app_profile.probes {
            let result = match p.check() {
                Ok(ProbeCheck::Exec { selector, container, command }) => self.exec_probe(selector, container, command).await,
                Ok(ProbeCheck::Http(h)) => self.http_probe(h).await,
                Ok(ProbeCheck::Object(o)) => self.object_probe(o).await,
                Ok(ProbeCheck::Job(spec)) => self.job_probe(spec).await,
                Err(e) => Some(e.to_string()),
            };
            out.push((p.name.clone(), result));
        }
        out
    }

    /// `command` in the first Ready pod of `selector`: why it failed, if it did.
    async fn exec_probe(&self, selector: &str, container: Option<&str>, command: &[String]) -> Option<String> {
        let Some(pod) = ready_pod(&self.client, self.ns(), selector, None).await else {
            return Some(format!("no Ready pod of {selector}"));
        };
        let pod = pod.metadata.name.unwrap_or_default();
        let refs: Vec<&str> = command.iter().map(String::as_str).collect();
        match exec(&self.client, self.ns(), &pod, container, &refs, PROBE_BOUND).await {
            Ok(o) if o.code == 0 => None,
            Ok(o) => Some(format!("in {pod}: exit {}: {}", o.code, o.stderr.trim())),
            Err(e) => Some(e.to_string()),
        }
    }

    /// A GET through the apiserver's service proxy: why it failed, if it did.
    async fn http_probe(&self, h: &HttpProbe) -> Option<String> {
        let path = format!("/api/v1/namespaces/{}/services/{}:{}/proxy/{}", self.ns(), h.service, h.port, h.path.trim_start_matches('/'));
        let request = match http::Request::get(&path).body(Vec::new()) {
            Ok(r) => r,
            Err(e) => return Some(format!("GET {path}: {e}")),
        };
        match tokio::time::timeout(PROBE_BOUND, self.client.request_text(request)).await {
            Err(_) => Some(format!("GET {path}: no answer within {}s", PROBE_BOUND.as_secs())),
            Ok(Err(e)) => Some(format!("GET {path}: {e}")),
            Ok(Ok(body)) => match &h.contains {
                Some(want) if !body.contains(want.as_str()) => {
                    Some(format!("GET {path}: the answer does not contain {want:?}: {}", body.chars().take(200).collect::<String>()))
                }
                _ => None,
            },
        }
    }

    /// A checker Job: created from the probe's spec, waited for, deleted (with its pods). Why it
    /// did not complete, if it did not: its pod's last log lines.
    async fn job_probe(&self, spec: &serde_json::Value) -> Option<String> {
        let n = self.probe_jobs.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let name = format!("shakedown-{}-check-{n}", self.run_id.trim_start_matches("sd-"));
        let template = serde_json::json!({"apiVersion": "batch/v1", "kind": "Job", "spec": spec});
        let mut body = spec::instantiate(
            &template,
            &name,
            &self.run_labels(),
            &BTreeMap::from([("namespace", self.ns().to_string()), ("statefulset", self.spec.app_profile.statefulset.clone())]),
        );
        // A checker runs once: the checks are retried until the step converges.
        if body["spec"].get("backoffLimit").is_none() {
            body["spec"]["backoffLimit"] = 0.into();
        }
        let job: Job = match serde_json::from_value(body) {
            Ok(j) => j,
            Err(e) => return Some(format!("the job's spec: {e}")),
        };
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), self.ns());
        if let Err(e) = bounded(&format!("create Job {name}"), jobs.create(&PostParams::default(), &job)).await {
            return Some(e.to_string());
        }
        let deadline = Instant::now() + PROBE_JOB_BOUND;
        let result = loop {
            let status = jobs.get_opt(&name).await.ok().flatten().and_then(|j| j.status).unwrap_or_default();
            let failed = status.conditions.as_ref().is_some_and(|c| c.iter().any(|c| c.type_ == "Failed" && c.status == "True"));
            if status.succeeded.unwrap_or(0) > 0 {
                break None;
            }
            if failed || Instant::now() > deadline {
                let how = if failed { "failed".to_string() } else { format!("not complete within {}s", PROBE_JOB_BOUND.as_secs()) };
                break Some(format!("Job {name} {how}: {}", self.job_logs(&name).await));
            }
            tokio::time::sleep(POLL).await;
        };
        let _ = bounded(&format!("delete Job {name}"), jobs.delete(&name, &DeleteParams::background())).await;
        result
    }

    /// The last log lines of a Job's newest pod.
    async fn job_logs(&self, job: &str) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let listed = bounded("the job's pods", pods.list(&ListParams::default().labels(&format!("job-name={job}"))))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let Some(pod) = listed.into_iter().max_by_key(|p| p.metadata.creation_timestamp.clone()).and_then(|p| p.metadata.name) else {
            return "no pod".into();
        };
        let params = kube::api::LogParams { tail_lines: Some(5), ..Default::default() };
        match bounded("logs", pods.logs(&pod, &params)).await {
            Ok(l) if !l.trim().is_empty() => format!("{pod}: {}", l.trim().replace('\n', " | ")),
            Ok(_) => format!("{pod}: no output"),
            Err(e) => format!("{pod}: {e}"),
        }
    }

    /// An object's field: why it is not `equals`, if it is not.
    async fn object_probe(&self, o: &ObjectProbe) -> Option<String> {
        let what = format!("{} {}/{}", o.kind, self.ns(), o.name);
        let api = match resource_api_of(&self.client, self.ns(), &format!("{}/{}", o.api_version, o.kind)).await {
            Ok(api) => api,
            Err(e) => return Some(e.to_string()),
        };
        match bounded(&what, api.get_opt(&o.name)).await {
            Err(e) => Some(e.to_string()),
            Ok(None) => Some(format!("{what} does not exist")),
            Ok(Some(obj)) => {
                let value = serde_json::to_value(&obj).unwrap_or_default();
                let m = spec::FieldMatch { field: o.field.clone(), equals: o.equals.clone() };
                (!m.matches(&value)).then(|| {
                    format!(
                        "{what}: {} = {} (wanted {:?})",
                        o.field,
                        m.value(&value).map_or("absent".into(), |v| format!("{v:?}")),
                        o.equals
                    )
                })
            }
        }
    }
}
