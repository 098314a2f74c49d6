//! The application target's spec (what a seed record says: the app profile, the context) and
//! its options (`--app-profile`; the kubeconfig and context are the kube target's flags).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use shakedown_faults::profile::duration_schema;
use shakedown_faults::OpKind;

use crate::clock::human;
use crate::exit::Fatal;

/// An application on a Kubernetes cluster and how it was driven (the kubeconfig is given
/// again on replay).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    pub app_profile: AppProfile,
}

/// The application target's command-line options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AppOptions {
    /// app target: the application under test — its namespace, StatefulSet, operator, data
    /// commands, probes (TOML; see docs/app-target.md). The kubeconfig is `--kubeconfig`.
    #[arg(long, env = "SHAKEDOWN_APP_PROFILE", value_name = "FILE")]
    pub app_profile: Option<PathBuf>,
}

impl AppOptions {
    /// App options given to another target are an error, not silently ignored.
    pub fn refuse_for(&self, target: &str) -> Result<(), Fatal> {
        let given: Vec<&str> = [(self.app_profile.is_some(), "--app-profile (or SHAKEDOWN_APP_PROFILE)")]
            .into_iter()
            .filter_map(|(g, n)| g.then_some(n))
            .collect();
        crate::targets::refuse_options(&given, "app", target)
    }
}

/// The application under test (`--app-profile FILE`, TOML; unknown fields are an error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AppProfile {
    /// The application's namespace. It must carry the annotation `shakedown.dev/allow-chaos: "true"` (the opt-in the kube target asks of a Cluster).
    pub namespace: String,
    /// The StatefulSet whose replicas are the plan's members (`m0` is ordinal 0, …): its
    /// replicas must equal the profile's `members`.
    pub statefulset: String,
    /// The StatefulSet's volumeClaimTemplate that `pvc-loss` deletes (claim `<claim>-<sts>-<i>`).
    /// Absent: `pvc-loss` is skipped with the reason.
    #[serde(default)]
    pub claim: Option<String>,
    /// The operator's Deployment (`operator-restart` scales it to zero and back; `app-ready`
    /// wants it available). Absent: `operator-restart` is skipped with the reason.
    #[serde(default)]
    pub operator: Option<String>,
    /// How long one op's own wait may take (a pod back, a claim bound, the operator available).
    #[serde(with = "human", default = "default_op_timeout")]
    #[schemars(schema_with = "duration_schema")]
    pub op_timeout: Duration,
    /// The data-integrity workload (`[data]`): absent, `app-durability` and `app-linearizability` are not checked.
    #[serde(default)]
    pub data: Option<DataCommands>,
    /// Probes that must pass for `app-ready` (`[[probes]]`): a command exec'd in a Ready pod, an
    /// HTTP GET through the service proxy, an object's field, or a checker Job.
    #[serde(default)]
    pub probes: Vec<Probe>,
    /// The connectivity probe of `partition` (`[partition]`): absent, `partition` is skipped.
    #[serde(default)]
    pub partition: Option<PartitionProbe>,
    /// Which pods `pod-kill-selected` deletes together (`[pod_kill_selected]`): absent, the op is
    /// skipped with the reason.
    #[serde(default)]
    pub pod_kill_selected: Option<PodSelection>,
    /// How `pod-failure` makes a replica fail in place (`[pod_failure]`): absent, the op is
    /// skipped with the reason.
    #[serde(default)]
    pub pod_failure: Option<PodFailure>,
    /// How `backup` asks for a backup (`[backup]`): the operator's custom resource (`template`,
    /// `done`), or a command exec'd in a pod (`command`; pgBackRest, `pg_basebackup`, a
    /// vendor's CLI). Absent: `backup` is skipped with the reason (and `restore` with it).
    #[serde(default)]
    pub backup: Option<OperatorOp>,
    /// How `restore` asks for a backup's restore (`[restore]`): a custom resource naming the
    /// backup's (`{backup}`), or a command given its name. Absent: `restore` is skipped with the
    /// reason.
    #[serde(default)]
    pub restore: Option<OperatorOp>,
    /// How `restore-pitr` asks for a point-in-time restore (`[restore_pitr]`): a command exec'd
    /// in a pod, given the backup's name (`{backup}`) and the instant (`{time}`). Absent:
    /// `restore-pitr` is not drawn.
    #[serde(default)]
    pub restore_pitr: Option<PitrOp>,
    /// How to tell the application's leader (`[leader]`): the primary of a database, the
    /// active one of an active/passive pair. With it, every op is watched for a failover: an
    /// `app-failover` event names the leader before and after and how long no Ready pod led,
    /// and says when the operator kept the old leader (the same pod back as leader).
    #[serde(default)]
    pub leader: Option<LeaderSpec>,
    /// How long `taint` holds its `NoExecute` taint on a replica's node (`[taint]`). Absent:
    /// 10 s.
    #[serde(default)]
    pub taint: Option<TaintSpec>,
    /// How `switchover` asks the operator for a planned failover (`[switchover]`): a command
    /// exec'd in the leader's pod. Needs `[leader]`. Absent: `switchover` is not drawn.
    #[serde(default)]
    pub switchover: Option<SwitchoverSpec>,
}

/// A planned failover through the operator's own interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SwitchoverSpec {
    /// Exec'd in the leader's pod; `{leader}` is the leader's pod name, `{pod}` the
    /// candidate's. A command that names `{pod}` asks for that replica, and the op waits for it
    /// to lead; one that does not leaves the choice to the operator, and any other pod leading
    /// will do (Patroni in synchronous mode accepts only its synchronous standby:
    /// `["patronictl", "-c", "/etc/patroni/patroni.yml", "switchover", "--leader", "{leader}",
    /// "--force"]`). A non-zero exit is a refusal; exit 0 is not taken for a yes (patronictl
    /// exits 0 on a refused switchover): what the command said goes into the verdict when no
    /// pod takes the lead within `op_timeout`.
    pub command: Vec<String>,
    /// The container to exec in (absent: the pod's first).
    #[serde(default)]
    pub container: Option<String>,
}

/// The application's leader: the one Ready pod of `selector` (a label the operator sets on it,
/// as Patroni's `role=master`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaderSpec {
    /// The label selector of the leader's pod, in the app's namespace.
    pub selector: String,
}

/// An op done by the operator: shakedown creates the object of `template` (its
/// `metadata.name` and the run's label set by shakedown) in the app's namespace and waits,
/// within `op_timeout`, until its `done` field says so; its `failed` field ends the wait as a
/// failed op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceOp {
    /// The object, as a TOML table (`[backup.template]`, `[restore.template]`: `apiVersion`, `kind`, `spec`, …). In
    /// its strings, `{backup}` is the name of the backup's object (for `restore`), `{namespace}`
    /// the app's namespace and `{statefulset}` its StatefulSet.
    pub template: serde_json::Value,
    /// When the operator is done: `{ field = "status.phase", equals = "Completed" }`.
    pub done: FieldMatch,
    /// When the operator has given up (absent: only `op_timeout` ends the wait).
    #[serde(default)]
    pub failed: Option<FieldMatch>,
}

/// A backup or a restore: through the operator's custom resource, or a command.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum OperatorOp {
    /// A command exec'd in a pod (a table with `command`).
    Command(CommandOp),
    /// The operator's custom resource (a table with `template` and `done`).
    Resource(ResourceOp),
}

// By the table's keys, so that an error names what is wrong with the form it was meant as
// (an untagged enum could only say that neither form matched).
impl<'de> Deserialize<'de> for OperatorOp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        let command = v.get("command").is_some();
        let resource = v.get("template").is_some() || v.get("done").is_some();
        match (command, resource) {
            (true, true) => Err(D::Error::custom("a command or a custom resource (template, done), not both")),
            (true, false) => CommandOp::deserialize(v).map(OperatorOp::Command).map_err(D::Error::custom),
            (false, _) => ResourceOp::deserialize(v).map(OperatorOp::Resource).map_err(D::Error::custom),
        }
    }
}

/// A command exec'd in a Ready pod of the app's namespace. In its arguments, `{backup}` is the
/// backup's name (shakedown's: `shakedown-<run>-b<N>`, the same for the backup and its
/// restores), `{namespace}` the app's namespace, `{statefulset}` its StatefulSet. Exit 0 means
/// done: the command waits for the operation itself, within the profile's `op_timeout`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandOp {
    /// The command and its arguments (the reference app's backup: `["/etc/patroni/backup.sh", "{backup}"]`).
    pub command: Vec<String>,
    /// The label selector of the pod it runs in (absent: `[leader]`'s, else the StatefulSet's).
    #[serde(default)]
    pub selector: Option<String>,
    /// The container to exec in (absent: the pod's first).
    #[serde(default)]
    pub container: Option<String>,
}

/// A point-in-time restore: a command as `[restore]`'s command form, given also `{time}`, the instant to
/// recover to (RFC 3339, UTC, microseconds: `2026-12-07T18:03:04.123456Z`). It must restore
/// backup `{backup}` and replay the log up to `{time}` inclusive, then serve writes again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PitrOp {
    /// The command and its arguments (`["/etc/patroni/restore.sh", "{backup}", "{time}"]`).
    pub command: Vec<String>,
    /// The label selector of the pod it runs in (absent: `[leader]`'s, else the StatefulSet's).
    #[serde(default)]
    pub selector: Option<String>,
    /// The container to exec in (absent: the pod's first).
    #[serde(default)]
    pub container: Option<String>,
    /// How far the database's clock may be from shakedown's: writes acknowledged within it
    /// before `{time}`, or sent within it after, may be either (default 0 s: the same machine's
    /// clock, as on `shakedown node up`).
    #[serde(with = "human", default)]
    #[schemars(schema_with = "duration_schema")]
    pub clock_skew: Duration,
}

impl PitrOp {
    /// The command's form without the skew (how it is exec'd).
    pub fn as_command(&self) -> CommandOp {
        CommandOp { command: self.command.clone(), selector: self.selector.clone(), container: self.container.clone() }
    }
}

/// A field of an object and the value that matches. `field` is a dotted path; a segment
/// `name[T]` picks the element of the list `name` whose `type` is `T` (`status.conditions[Ready].status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldMatch {
    /// The path of the field (`status.phase`, `status.conditions[Ready].status`).
    pub field: String,
    /// The value it must have (strings, numbers and booleans compare as written).
    pub equals: String,
}

impl FieldMatch {
    /// The field's value in `obj`, as text (`None`: not there).
    pub fn value(&self, obj: &serde_json::Value) -> Option<String> {
        let mut at = obj;
        for seg in self.field.split('.') {
            at = match seg.split_once('[') {
                Some((name, rest)) => {
                    let t = rest.strip_suffix(']')?;
                    at.get(name)?.as_array()?.iter().find(|e| e.get("type").and_then(|v| v.as_str()) == Some(t))?
                }
                None => at.get(seg)?,
            };
        }
        match at {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Null => None,
            v => Some(v.to_string()),
        }
    }

    pub fn matches(&self, obj: &serde_json::Value) -> bool {
        self.value(obj).as_deref() == Some(self.equals.as_str())
    }
}

/// An object from a profile's template: its `{placeholders}` filled from `vars`, named `name`
/// (any namespace of the template dropped: the app's), `labels` added.
pub fn instantiate(
    template: &serde_json::Value,
    name: &str,
    labels: &BTreeMap<String, String>,
    vars: &BTreeMap<&str, String>,
) -> serde_json::Value {
    fn fill_all(v: &mut serde_json::Value, vars: &BTreeMap<&str, String>) {
        match v {
            serde_json::Value::String(s) => *s = vars.iter().fold(s.clone(), |s, (k, x)| s.replace(&format!("{{{k}}}"), x)),
            serde_json::Value::Array(a) => a.iter_mut().for_each(|v| fill_all(v, vars)),
            serde_json::Value::Object(o) => o.values_mut().for_each(|v| fill_all(v, vars)),
            _ => {}
        }
    }
    let mut obj = template.clone();
    fill_all(&mut obj, vars);
    let meta = obj.as_object_mut().map(|o| o.entry("metadata").or_insert_with(|| serde_json::json!({})));
    if let Some(serde_json::Value::Object(meta)) = meta {
        meta.insert("name".into(), name.into());
        meta.remove("namespace");
        let l = meta.entry("labels").or_insert_with(|| serde_json::json!({}));
        if let serde_json::Value::Object(l) = l {
            for (k, v) in labels {
                l.insert(k.clone(), v.clone().into());
            }
        }
    }
    obj
}

impl ResourceOp {
    /// The object to create: the template with its placeholders filled, named `name`, labelled.
    pub fn object(&self, name: &str, labels: &BTreeMap<String, String>, vars: &BTreeMap<&str, String>) -> serde_json::Value {
        instantiate(&self.template, name, labels, vars)
    }

    /// `apiVersion` and `kind` of the template, or what is wrong with it.
    pub fn kind(&self, section: &str) -> Result<(String, String), AppProfileError> {
        let get = |f: &str| {
            self.template
                .get(f)
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .ok_or_else(|| invalid(format!("[{section}.template] needs {f} (a string)")))
        };
        let (api_version, kind) = (get("apiVersion")?, get("kind")?);
        if api_version.split('/').count() != 2 {
            return Err(invalid(format!("[{section}.template] apiVersion = {api_version:?}: a custom resource's is group/version")));
        }
        Ok((api_version, kind))
    }
}

/// Pods picked by label selector: `count` of them, or `percent` rounded up (at least one);
/// neither: one. Which ones is the plan's (`pod-kill-selected(pick N)`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PodSelection {
    /// The label selector (`app=etcd`, `app=etcd,role!=leader`), in the app's namespace.
    pub selector: String,
    /// How many of the matching pods.
    #[serde(default)]
    pub count: Option<u32>,
    /// Which share of the matching pods, 1–100, rounded up.
    #[serde(default)]
    pub percent: Option<u32>,
}

impl PodSelection {
    /// How many of `matching` pods to take.
    pub fn how_many(&self, matching: usize) -> usize {
        let n = match (self.count, self.percent) {
            (Some(c), _) => c as usize,
            (None, Some(p)) => (matching * p as usize).div_ceil(100),
            (None, None) => 1,
        };
        n.max(1).min(matching)
    }

    /// The `how_many` of `names` (sorted) that `pick` selects: a run of consecutive names
    /// starting at `pick` modulo their number, wrapping around.
    pub fn choose(&self, names: &[String], pick: u32) -> Vec<String> {
        if names.is_empty() {
            return vec![];
        }
        let start = pick as usize % names.len();
        (0..self.how_many(names.len())).map(|i| names[(start + i) % names.len()].clone()).collect()
    }
}

/// `pod-failure`: every container of the replica's pod runs `image` for `duration`, then its
/// own image again. The image must be one the nodes have and that does not run the application
/// — the cluster's pause image (`registry.k8s.io/pause:3.9` on most clusters,
/// `shakedown.local/pause:3.4` on `shakedown node up`'s) is the usual choice, as Chaos Mesh's
/// `pod-failure` uses: with the pod's own `command`, its containers cannot even start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PodFailure {
    /// The image the containers run while failed.
    pub image: String,
    /// How long the replica stays failed once it is seen not Ready.
    #[serde(with = "human", default = "default_failure_duration")]
    #[schemars(schema_with = "duration_schema")]
    pub duration: Duration,
}

/// A `NoExecute` taint on a replica's node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaintSpec {
    /// How long the taint stays once the pods that do not tolerate it are gone (then it is
    /// removed, and the pods the controllers recreate can come back).
    #[serde(with = "human", default = "default_failure_duration")]
    #[schemars(schema_with = "duration_schema")]
    pub duration: Duration,
}

impl AppProfile {
    /// How long `taint` holds its taint.
    pub fn taint_duration(&self) -> Duration {
        self.taint.as_ref().map_or_else(default_failure_duration, |t| t.duration)
    }
}

fn default_failure_duration() -> Duration {
    Duration::from_secs(10)
}

fn default_op_timeout() -> Duration {
    Duration::from_secs(120)
}

/// Write and read commands, exec'd in a Ready pod of `selector`. `{key}` and `{value}` in the
/// write command, `{prefix}` in the read command are replaced (keys are `<prefix><n>`, unique).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DataCommands {
    /// The label selector of the pods the commands run in (`app=etcd`).
    pub selector: String,
    /// The container (default: the pod's first).
    #[serde(default)]
    pub container: Option<String>,
    /// Writes `{key}` = `{value}`; exit 0 acknowledges the write. The first fault waits for
    /// one acknowledged write (up to `op_timeout`, at most 60 s; none: exit 4 with what the
    /// last attempt answered). Not needed with `[data.session]`.
    #[serde(default)]
    pub write: Vec<String>,
    /// Writes through a long-running client instead of one exec per write (`[data.session]`):
    /// each writer keeps one session command running in a pod and sends it its writes.
    #[serde(default)]
    pub session: Option<Session>,
    /// Prints every key with prefix `{prefix}` and its value, `key value` one per line; exit 0.
    pub read: Vec<String>,
    /// The pause between two writes (of each writer).
    #[serde(with = "human", default = "default_interval")]
    #[schemars(schema_with = "duration_schema")]
    pub interval: Duration,
    /// How many writers write at once, each with its own exec per write (its own connection to
    /// the application, as several clients of it would have) and its own client in the
    /// history. One write per exec takes a fraction of a second; more writers put more
    /// acknowledged writes near each fault.
    #[serde(default = "one")]
    pub writers: u32,
}

/// A long-running client of the application, exec'd once per writer in a Ready pod of
/// `selector` and fed one line `KEY VALUE` per write on its stdin; it answers each on its
/// stdout, in order: `ok KEY` once the write is acknowledged, `fail KEY <why>` when it is not
/// (its outcome then unknown). Other lines are ignored. As an application's client would, it
/// keeps its connection, and reconnects after a failover on its own. A session that ends,
/// breaks or leaves a write unanswered for 15 s is replaced by a new one (in another Ready pod
/// when that one is gone); the write's outcome is unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Session {
    /// The command (the reference app's: `["python3", "/etc/patroni/writer.py"]`).
    pub command: Vec<String>,
    /// The label selector of the pods it runs in (absent: `[data] selector`).
    #[serde(default)]
    pub selector: Option<String>,
}

fn one() -> u32 {
    1
}

/// The most writers `[data]` takes: each holds an exec stream into a pod at a time.
const MAX_WRITERS: u32 = 32;

fn default_interval() -> Duration {
    Duration::from_millis(200)
}

/// A check `app-ready` makes once a step converged, one of four kinds: `command` exec'd in a
/// Ready pod of `selector` (exit 0 passes), `http` (a GET through the apiserver's service proxy),
/// `object` (a field of an object of the namespace: the operator's custom resource's
/// condition, say) or `job` (a checker Job: complete passes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    /// The probe's name in `app-ready`'s messages.
    pub name: String,
    /// With `command`: the label selector of the pods it runs in (the first Ready one by name).
    #[serde(default)]
    pub selector: Option<String>,
    /// With `command`: the container (default: the pod's first).
    #[serde(default)]
    pub container: Option<String>,
    /// The command and its arguments (no shell unless you run one: `["sh", "-c", "…"]`).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// A GET through the apiserver's service proxy (no port-forward, nothing on the nodes).
    #[serde(default)]
    pub http: Option<HttpProbe>,
    /// A field of an object in the namespace.
    #[serde(default)]
    pub object: Option<ObjectProbe>,
    /// A checker Job's `spec` (a table, `[probes.job]`, with `{namespace}` and `{statefulset}` filled in;
    /// `backoffLimit` 0 unless given): shakedown creates it (named `shakedown-<run>-check-N`,
    /// labelled with the run), waits up to 60 s for it to complete (failed: its pod's last log
    /// lines), and deletes it.
    #[serde(default)]
    pub job: Option<serde_json::Value>,
}

/// `GET /api/v1/namespaces/<namespace>/services/<service>:<port>/proxy<path>`: a 2xx answer
/// (containing `contains`, when given) passes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpProbe {
    /// The Service's name.
    pub service: String,
    /// The Service's port, by number or name.
    pub port: String,
    /// The path, from `/`.
    #[serde(default = "default_path")]
    pub path: String,
    /// Text the answer's body must contain.
    #[serde(default)]
    pub contains: Option<String>,
}

fn default_path() -> String {
    "/".into()
}

/// An object of the namespace whose `field` must equal `equals` (`field` as in `[backup]`'s
/// `done`: a dotted path; a segment `conditions[Ready]` picks a condition by type).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectProbe {
    /// `group/version` (`v1` for the core group).
    pub api_version: String,
    /// Its kind (`DbCluster`).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// The dotted path of the field (`status.conditions[Ready].status`).
    pub field: String,
    /// The value it must have (a number or boolean as written: `"3"`, `"true"`).
    pub equals: String,
}

/// What a probe does (the profile's validation made exactly one of them present).
pub enum ProbeCheck<'a> {
    Exec { selector: &'a str, container: Option<&'a str>, command: &'a [String] },
    Http(&'a HttpProbe),
    Object(&'a ObjectProbe),
    Job(&'a serde_json::Value),
}

impl Probe {
    pub fn check(&self) -> Result<ProbeCheck<'_>, AppProfileError> {
        let kinds = [self.command.is_some(), self.http.is_some(), self.object.is_some(), self.job.is_some()].iter().filter(|k| **k).count();
        if kinds > 1 {
            return Err(invalid(format!("probe {:?}: one of command (with selector), http, object or job, not several", self.name)));
        }
        if let Some(job) = &self.job {
            return match (job.is_object(), &self.selector) {
                (true, None) => Ok(ProbeCheck::Job(job)),
                (false, _) => Err(invalid(format!("probe {:?}: job is a Job's spec (a table: [probes.job])", self.name))),
                (true, Some(_)) => Err(invalid(format!("probe {:?}: a selector belongs to a command, not a job", self.name))),
            };
        }
        match (&self.command, &self.http, &self.object) {
            (Some(command), None, None) => match &self.selector {
                Some(selector) if !command.is_empty() => Ok(ProbeCheck::Exec { selector, container: self.container.as_deref(), command }),
                Some(_) => Err(invalid(format!("probe {:?}: command is empty", self.name))),
                None => Err(invalid(format!("probe {:?}: a command needs the selector of the pods to run it in", self.name))),
            },
            (None, Some(h), None) if self.selector.is_none() => Ok(ProbeCheck::Http(h)),
            (None, None, Some(o)) if self.selector.is_none() => Ok(ProbeCheck::Object(o)),
            (None, None, None) => Err(invalid(format!("probe {:?} needs command (with selector), http, object or job", self.name))),
            _ => Err(invalid(format!("probe {:?}: a selector belongs to a command", self.name))),
        }
    }
}

/// How `partition` checks that traffic is cut: `command` is exec'd in another replica with
/// `{ip}` replaced by the partitioned pod's IP; exit 0 means it connected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PartitionProbe {
    /// Connects to `{ip}` (the partitioned pod's IP); exit 0 means it connected.
    pub command: Vec<String>,
    /// The container (default: the pod's first).
    #[serde(default)]
    pub container: Option<String>,
    /// The cuts `partition-groups` makes (`[[partition.groups]]`): two label groups each, cut
    /// apart while other traffic flows on. Absent, `partition-groups` is skipped with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupCut>,
}

/// One cut of `partition-groups`: the pods of `a` and those of `b` (namespace's pods, equality
/// label selectors such as `app=kv,role=primary`) no longer reach each other; each side still
/// reaches, and is reached by, every other pod. The `[partition]` probe is exec'd in pods of
/// both groups, so their containers must have its command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupCut {
    /// One side: `key=value` terms, comma-separated (all must hold).
    pub a: String,
    /// The other side, the same way.
    pub b: String,
}

impl GroupCut {
    /// A side's selector as labels (`key=value` terms only: the other side's policy admits
    /// every pod that lacks one of them, which a NetworkPolicy can say only of equality terms).
    pub fn labels(selector: &str) -> Result<BTreeMap<String, String>, AppProfileError> {
        let mut labels = BTreeMap::new();
        for term in selector.split(',').map(str::trim) {
            let (k, v) = term.split_once("==").or_else(|| term.split_once('=')).filter(|(k, _)| !k.is_empty() && !k.ends_with('!')).ok_or_else(|| {
                invalid(format!("[[partition.groups]] selector {selector:?}: {term:?} is not a key=value term (a group is a set of key=value labels, all of which must hold)"))
            })?;
            labels.insert(k.trim().to_string(), v.trim().to_string());
        }
        Ok(labels)
    }
}

/// What makes `name` no RFC 1123 label (the names of namespaces, and of StatefulSets whose pods
/// carry their name in a label): `None` when it is one.
fn dns_label_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.len() > 63 {
        return Some("more than 63 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Some("only lowercase letters, digits and '-' are allowed");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Some("it must start and end with a letter or digit");
    }
    None
}

/// Why an app profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum AppProfileError {
    #[error("cannot read app profile {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or not the profile's fields.
    #[error("app profile: {0}")]
    Parse(#[source] toml::de::Error),
    /// It parses but breaks a rule (`detail` says which).
    #[error("app profile: {detail}")]
    Invalid { detail: String },
}

fn invalid(detail: String) -> AppProfileError {
    AppProfileError::Invalid { detail }
}

impl AppProfile {
    pub fn from_toml(text: &str) -> Result<AppProfile, AppProfileError> {
        let p: AppProfile = toml::from_str(text).map_err(AppProfileError::Parse)?;
        p.validate()?;
        Ok(p)
    }

    /// The rules an app profile must keep beyond its shape, checked offline: what `from_toml` and a
    /// seed record's embedded copy are both held to.
    pub fn validate(&self) -> Result<(), AppProfileError> {
        // Names the apiserver would refuse (or, empty, a request for every object of a kind)
        // are refused here, before anything connects.
        for (field, name) in [
            ("namespace", Some(&self.namespace)),
            ("statefulset", Some(&self.statefulset)),
            ("claim", self.claim.as_ref()),
            ("operator", self.operator.as_ref()),
        ] {
            if let Some(name) = name {
                if let Some(problem) = dns_label_problem(name) {
                    return Err(invalid(format!("{field} = {name:?} is not a Kubernetes name: {problem}")));
                }
            }
        }
        if self.data.as_ref().is_some_and(|d| (d.write.is_empty() && d.session.is_none()) || d.read.is_empty()) {
            return Err(invalid("[data] needs a write command (or a [data.session]) and a read command".into()));
        }
        if self.data.as_ref().and_then(|d| d.session.as_ref()).is_some_and(|s| s.command.is_empty()) {
            return Err(invalid("[data.session] needs a command".into()));
        }
        if self.data.as_ref().is_some_and(|d| !(1..=MAX_WRITERS).contains(&d.writers)) {
            return Err(invalid(format!("[data] writers must be 1 to {MAX_WRITERS} (each is an exec into a pod per write)")));
        }
        for probe in &self.probes {
            probe.check()?;
        }
        if let Some(k) = &self.pod_kill_selected {
            if k.count.is_some() && k.percent.is_some() {
                return Err(invalid("[pod_kill_selected] takes count or percent, not both".into()));
            }
            if k.count == Some(0) || k.percent.is_some_and(|p| p == 0 || p > 100) {
                return Err(invalid("[pod_kill_selected] count must be at least 1, percent 1–100".into()));
            }
            if k.selector.trim().is_empty() {
                return Err(invalid("[pod_kill_selected] needs a label selector".into()));
            }
        }
        if self.switchover.as_ref().is_some_and(|s| s.command.is_empty()) {
            return Err(invalid("[switchover] needs a command".into()));
        }
        if self.leader.as_ref().is_some_and(|l| l.selector.trim().is_empty()) {
            return Err(invalid("[leader] needs a label selector (the leader's pod, as role=master)".into()));
        }
        for cut in self.partition.iter().flat_map(|p| &p.groups) {
            let (a, b) = (GroupCut::labels(&cut.a)?, GroupCut::labels(&cut.b)?);
            if a == b {
                return Err(invalid(format!("[[partition.groups]] a and b are the same group ({:?}): nothing to cut apart", cut.a)));
            }
        }
        if self.restore_pitr.as_ref().is_some_and(|r| r.command.is_empty()) {
            return Err(invalid("[restore_pitr] needs a command".into()));
        }
        for (section, r) in [("backup", &self.backup), ("restore", &self.restore)] {
            if let Some(OperatorOp::Command(c)) = r {
                if c.command.is_empty() {
                    return Err(invalid(format!("[{section}] command is empty")));
                }
            }
            if let Some(OperatorOp::Resource(r)) = r {
                if !r.template.is_object() {
                    return Err(invalid(format!("[{section}] template must be a table (apiVersion, kind, spec, …)")));
                }
                r.kind(section)?;
                if r.done.field.trim().is_empty() {
                    return Err(invalid(format!("[{section}] done needs a field")));
                }
            }
        }
        Ok(())
    }

    pub fn load(path: &Path) -> Result<AppProfile, AppProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| AppProfileError::Read { path: path.to_path_buf(), source })?;
        AppProfile::from_toml(&text)
    }
}

impl AppProfile {
    /// `Err(why)` when this app profile does not describe what op kind `kind` needs here (the
    /// target skips the op and says why), or `kind` is not an application op.
    #[deny(clippy::wildcard_enum_match_arm)]
    pub fn supports(&self, kind: OpKind) -> Result<(), String> {
        let p = self;
        match kind {
            OpKind::PodKill => Ok(()),
            OpKind::PodKillSelected if p.pod_kill_selected.is_some() => Ok(()),
            OpKind::PodKillSelected => Err("the app profile has no [pod_kill_selected] (a label selector and a count or percent)".into()),
            OpKind::OperatorRestart if p.operator.is_some() => Ok(()),
            OpKind::OperatorRestart => Err("the app profile names no operator Deployment".into()),
            OpKind::PvcLoss if p.claim.is_some() => Ok(()),
            OpKind::PvcLoss => Err("the app profile names no claim (volumeClaimTemplate)".into()),
            OpKind::Partition | OpKind::PartitionHeal if p.partition.is_some() => Ok(()),
            OpKind::Partition | OpKind::PartitionHeal => Err("the app profile has no [partition] probe".into()),
            OpKind::PartitionGroups | OpKind::PartitionGroupsHeal if p.partition.as_ref().is_some_and(|p| !p.groups.is_empty()) => Ok(()),
            OpKind::PartitionGroups | OpKind::PartitionGroupsHeal => Err("the app profile has no [[partition.groups]] (two label groups to cut apart, and the [partition] probe)".into()),
            OpKind::NodeDrain | OpKind::Taint => Ok(()),
            OpKind::PodFailure if p.pod_failure.is_some() => Ok(()),
            OpKind::PodFailure => Err("the app profile has no [pod_failure] image (one the nodes have that does not run the application: the cluster's pause image, say)".into()),
            OpKind::Backup if p.backup.is_some() => Ok(()),
            OpKind::Backup => Err("the app profile has no [backup] (the operator's backup custom resource, or a command)".into()),
            OpKind::Restore if p.restore.is_some() => Ok(()),
            OpKind::Restore => Err("the app profile has no [restore] (the operator's restore custom resource, or a command)".into()),
            OpKind::RestorePitr if p.restore_pitr.is_some() && p.backup.is_some() => Ok(()),
            OpKind::RestorePitr if p.restore_pitr.is_some() => Err("[restore_pitr] needs [backup] (a backup to restore from)".into()),
            OpKind::RestorePitr => Err("the app profile has no [restore_pitr] command (a point-in-time restore)".into()),
            OpKind::Switchover if p.switchover.is_some() && p.leader.is_some() => Ok(()),
            OpKind::Switchover if p.switchover.is_some() => Err("[switchover] needs [leader] (how to tell the leader's pod)".into()),
            OpKind::Switchover => Err("the app profile has no [switchover] command (the operator's planned failover)".into()),
            k @ (OpKind::Crash
            | OpKind::Restart
            | OpKind::Pause
            | OpKind::Resume
            | OpKind::RollingUpgrade
            | OpKind::RollingReplace
            | OpKind::SiteOutage
            | OpKind::SiteRecover
            | OpKind::DiskDetach
            | OpKind::DiskReattach
            | OpKind::DiskReplace
            | OpKind::Defrag
            | OpKind::PartitionUntilSnapshot
            | OpKind::Failpoint) => Err(format!("{k} is not an application op")),
        }
    }
}

impl AppSpec {
    /// A new run's spec from the flags, or the recorded one with what the flags override.
    pub fn from_options(opts: &AppOptions, context: Option<&str>, recorded: Option<&AppSpec>) -> Result<AppSpec, Fatal> {
        let app_profile =
            match (&opts.app_profile, recorded) {
                (Some(p), _) => AppProfile::load(p).map_err(|e| Fatal::usage(e.to_string()))?,
                (None, Some(r)) => r.app_profile.clone(),
                (None, None) => return Err(Fatal::usage(
                    "--target app needs --app-profile FILE (the application under test: namespace, StatefulSet, operator, data commands)",
                )),
            };
        Ok(AppSpec { context: context.map(str::to_string).or_else(|| recorded.and_then(|r| r.context.clone())), app_profile })
    }

    pub fn describe(&self) -> String {
        format!("app {}/{}", self.app_profile.namespace, self.app_profile.statefulset)
    }
}

/// Replaces `{name}` placeholders in each argument.
pub fn fill(command: &[String], vars: &BTreeMap<&str, String>) -> Vec<String> {
    command.iter().map(|a| vars.iter().fold(a.clone(), |s, (k, v)| s.replace(&format!("{{{k}}}"), v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selection(count: Option<u32>, percent: Option<u32>) -> PodSelection {
        PodSelection { selector: "app=etcd".into(), count, percent }
    }

    #[test]
    fn partition_groups_are_pairs_of_key_value_selectors() {
        let base = "namespace = \"web\"\nstatefulset = \"web\"\n[partition]\ncommand = [\"true\"]\n";
        let p =
            AppProfile::from_toml(&format!("{base}[[partition.groups]]\na = \"app=web,role=primary\"\nb = \"app=web, role==standby\"\n"))
                .unwrap();
        let cut = &p.partition.unwrap().groups[0];
        assert_eq!(
            GroupCut::labels(&cut.b).unwrap(),
            BTreeMap::from([("app".to_string(), "web".to_string()), ("role".to_string(), "standby".to_string())])
        );
        for bad in ["app!=web", "app in (web)", "", "app"] {
            let err = AppProfile::from_toml(&format!("{base}[[partition.groups]]\na = {bad:?}\nb = \"x=y\"\n")).unwrap_err().to_string();
            assert!(err.contains("is not a key=value term"), "{bad}: {err}");
        }
        let err = AppProfile::from_toml(&format!("{base}[[partition.groups]]\na = \"x=y\"\nb = \"x==y\"\n")).unwrap_err().to_string();
        assert!(err.contains("the same group"), "{err}");
    }

    #[test]
    fn names_the_apiserver_would_refuse_are_refused_offline() {
        for (toml, want) in [
            ("namespace = \"\"\nstatefulset = \"web\"\n", "namespace = \"\" is not a Kubernetes name: it is empty"),
            ("namespace = \"web\"\nstatefulset = \"\"\n", "statefulset = \"\" is not a Kubernetes name: it is empty"),
            ("namespace = \"Web\"\nstatefulset = \"web\"\n", "only lowercase letters"),
            ("namespace = \"web\"\nstatefulset = \"web-\"\n", "start and end with a letter or digit"),
            ("namespace = \"web\"\nstatefulset = \"web\"\noperator = \"\"\n", "operator = \"\""),
        ] {
            let err = AppProfile::from_toml(toml).unwrap_err().to_string();
            assert!(err.contains(want), "{toml}: {err}");
        }
        assert!(AppProfile::from_toml(&format!("namespace = \"{}\"\nstatefulset = \"a\"\n", "n".repeat(64)))
            .unwrap_err()
            .to_string()
            .contains("63"));
        assert!(AppProfile::from_toml("namespace = \"team-a1\"\nstatefulset = \"etcd\"\noperator = \"etcd-operator\"\n").is_ok());
    }

    #[test]
    fn a_selection_takes_its_count_or_its_share_rounded_up_at_least_one() {
        assert_eq!(selection(None, None).how_many(3), 1);
        assert_eq!(selection(Some(2), None).how_many(3), 2);
        assert_eq!(selection(Some(5), None).how_many(3), 3, "no more than match");
        assert_eq!(selection(None, Some(50)).how_many(3), 2, "1.5 rounds up");
        assert_eq!(selection(None, Some(10)).how_many(3), 1, "at least one");
        assert_eq!(selection(None, Some(100)).how_many(4), 4);
        assert_eq!(selection(Some(1), None).how_many(0), 0, "nothing matches, nothing taken");
    }

    #[test]
    fn the_plans_pick_chooses_a_run_of_sorted_names_wrapping_around() {
        let names: Vec<String> = ["etcd-0", "etcd-1", "etcd-2"].map(String::from).to_vec();
        let two = selection(Some(2), None);
        assert_eq!(two.choose(&names, 0), ["etcd-0", "etcd-1"]);
        assert_eq!(two.choose(&names, 2), ["etcd-2", "etcd-0"]);
        assert_eq!(two.choose(&names, 5), ["etcd-2", "etcd-0"], "pick modulo the number of pods");
        assert!(two.choose(&[], 1).is_empty());
    }

    #[test]
    fn the_data_workload_writes_by_command_or_through_a_session() {
        let base = "namespace = \"pg\"\nstatefulset = \"pg\"\n[data]\nselector = \"role=master\"\nread = [\"r\"]\n";
        let p = AppProfile::from_toml(&format!("{base}[data.session]\ncommand = [\"python3\", \"writer.py\"]\n")).unwrap();
        let s = p.data.unwrap().session.unwrap();
        assert_eq!((s.command.len(), s.selector), (2, None));
        let e = AppProfile::from_toml(base).unwrap_err().to_string();
        assert!(e.contains("needs a write command (or a [data.session])"), "{e}");
        let e = AppProfile::from_toml(&format!("{base}[data.session]\ncommand = []\n")).unwrap_err().to_string();
        assert!(e.contains("[data.session] needs a command"), "{e}");
    }

    #[test]
    fn backups_and_restores_are_commands_or_custom_resources_and_an_error_names_the_form_meant() {
        let base = "namespace = \"pg\"\nstatefulset = \"pg\"\n";
        let p = AppProfile::from_toml(&format!(
            "{base}[backup]\ncommand = [\"backup.sh\", \"{{backup}}\"]\nselector = \"role=master\"\n[restore_pitr]\ncommand = [\"restore.sh\", \"{{backup}}\", \"{{time}}\"]\nclock_skew = \"250ms\"\n"
        ))
        .unwrap();
        assert!(
            matches!(&p.backup, Some(OperatorOp::Command(c)) if c.selector.as_deref() == Some("role=master") && c.command[1] == "{backup}")
        );
        assert_eq!(p.restore_pitr.as_ref().unwrap().clock_skew, Duration::from_millis(250));
        assert_eq!(p.supports(OpKind::RestorePitr), Ok(()));
        assert!(p.supports(OpKind::Restore).unwrap_err().contains("no [restore]"));
        // A point-in-time restore needs a backup to restore from.
        let e = AppProfile::from_toml(&format!("{base}[restore_pitr]\ncommand = [\"r\"]\n"))
            .unwrap()
            .supports(OpKind::RestorePitr)
            .unwrap_err();
        assert!(e.contains("needs [backup]"), "{e}");
        // A typo in the command form is named as one, not as a custom resource's missing fields.
        let e = AppProfile::from_toml(&format!("{base}[backup]\ncommand = [\"b\"]\nselectr = \"x\"\n")).unwrap_err().to_string();
        assert!(e.contains("unknown field `selectr`") && e.contains("command"), "{e}");
        let e = AppProfile::from_toml(&format!("{base}[backup]\ncommand = [\"b\"]\ndone = {{ field = \"f\", equals = \"x\" }}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not both"), "{e}");
        let e = AppProfile::from_toml(&format!("{base}[restore]\ncommand = []\n")).unwrap_err().to_string();
        assert!(e.contains("[restore] command is empty"), "{e}");
        // Recorded and read back the same (a seed record embeds the app profile).
        let again: AppProfile = serde_json::from_value(serde_json::to_value(&p).unwrap()).unwrap();
        assert_eq!(again, p);
    }

    #[test]
    fn a_resource_op_fills_its_template_and_reads_its_fields() {
        let p = AppProfile::from_toml(
            "namespace = \"app\"\nstatefulset = \"etcd\"\n[restore]\ndone = { field = \"status.conditions[Ready].status\", equals = \"True\" }\nfailed = { field = \"status.phase\", equals = \"Failed\" }\n[restore.template]\napiVersion = \"test.shakedown.dev/v1\"\nkind = \"EtcdRestore\"\nmetadata = { name = \"ignored\", namespace = \"elsewhere\" }\nspec = { backup = \"{backup}\", cluster = \"{statefulset}\", keep = [\"{backup}\", 3] }\n",
        )
        .unwrap();
        let Some(OperatorOp::Resource(r)) = p.restore else { panic!("a custom resource: {:?}", p.restore) };
        assert_eq!(r.kind("restore").unwrap(), ("test.shakedown.dev/v1".to_string(), "EtcdRestore".to_string()));
        let labels = BTreeMap::from([("shakedown.dev/run".to_string(), "sd-1".to_string())]);
        let obj = r.object(
            "shakedown-sd-1-restore-1",
            &labels,
            &BTreeMap::from([("backup", "shakedown-sd-1-b0".to_string()), ("statefulset", "etcd".to_string())]),
        );
        assert_eq!(obj["metadata"]["name"], "shakedown-sd-1-restore-1");
        assert!(obj["metadata"].get("namespace").is_none(), "the app's namespace, not the template's");
        assert_eq!(obj["metadata"]["labels"]["shakedown.dev/run"], "sd-1");
        assert_eq!(obj["spec"], serde_json::json!({"backup": "shakedown-sd-1-b0", "cluster": "etcd", "keep": ["shakedown-sd-1-b0", 3]}));
        let status = |s: serde_json::Value| serde_json::json!({"status": s});
        assert!(r.done.matches(&status(
            serde_json::json!({"conditions": [{"type": "Other", "status": "True"}, {"type": "Ready", "status": "True"}]})
        )));
        assert!(!r.done.matches(&status(serde_json::json!({"conditions": [{"type": "Ready", "status": "False"}]}))));
        assert!(!r.done.matches(&serde_json::json!({})), "no status yet");
        assert!(r.failed.unwrap().matches(&status(serde_json::json!({"phase": "Failed"}))));
        let n = FieldMatch { field: "status.attempts".into(), equals: "3".into() };
        assert!(n.matches(&status(serde_json::json!({"attempts": 3}))), "a number compares as written");
    }

    #[test]
    fn the_documented_app_profiles_parse() {
        // The README's quick start: a heredoc in a shell block.
        let readme = include_str!("../../../README.md");
        let short =
            readme.split("cat > app.toml <<'TOML'\n").nth(1).and_then(|b| b.split("\nTOML\n").next()).expect("the README's app.toml");
        let p = AppProfile::from_toml(short).unwrap_or_else(|e| panic!("{e}\n{short}"));
        assert!(p.data.is_some() && p.operator.is_some(), "{p:?}");
        // The application target's page: the whole profile.
        let readme = include_str!("../../../docs/app-target.md");
        let from = readme.find("2. Describe the application in an app profile").expect("the app target page's app profile step");
        let block = readme[from..].split("```toml").nth(1).and_then(|b| b.split("```").next()).expect("its toml block");
        let text: String = block.lines().map(|l| l.strip_prefix("   ").unwrap_or(l)).collect::<Vec<_>>().join("\n");
        let p = AppProfile::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(p.probes.len() >= 4 && p.probes.iter().all(|p| p.check().is_ok()), "{:?}", p.probes);
        assert!(p.backup.is_some() && p.restore.is_some() && p.data.is_some());
    }

    #[test]
    fn a_probe_is_one_of_exec_http_or_object() {
        let base = "namespace = \"app\"\nstatefulset = \"etcd\"\n[[probes]]\nname = \"p\"\n";
        let p = AppProfile::from_toml(&format!("{base}selector = \"app=etcd\"\ncommand = [\"true\"]\n[[probes]]\nname = \"h\"\nhttp = {{ service = \"etcd\", port = \"client\" }}\n[[probes]]\nname = \"o\"\nobject = {{ api_version = \"apps/v1\", kind = \"Deployment\", name = \"op\", field = \"status.conditions[Available].status\", equals = \"True\" }}\n")).unwrap();
        assert!(matches!(p.probes[0].check(), Ok(ProbeCheck::Exec { selector: "app=etcd", .. })));
        assert!(matches!(p.probes[1].check(), Ok(ProbeCheck::Http(h)) if h.path == "/" && h.port == "client"));
        assert!(matches!(p.probes[2].check(), Ok(ProbeCheck::Object(o)) if o.kind == "Deployment"));
        let e = AppProfile::from_toml(&format!("{base}command = [\"true\"]\n")).unwrap_err().to_string();
        assert!(e.contains("needs the selector"), "{e}");
        let e = AppProfile::from_toml(base).unwrap_err().to_string();
        assert!(e.contains("needs command (with selector), http, object or job"), "{e}");
        let e = AppProfile::from_toml(&format!(
            "{base}selector = \"a=b\"\ncommand = [\"true\"]\nhttp = {{ service = \"s\", port = \"80\" }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("not several"), "{e}");
        let e = AppProfile::from_toml(&format!("{base}selector = \"a=b\"\nhttp = {{ service = \"s\", port = \"80\" }}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("a selector belongs to a command"), "{e}");
        let p = AppProfile::from_toml(&format!(
            "{base}[probes.job]\nbackoffLimit = 1\n[probes.job.template.spec]\nrestartPolicy = \"Never\"\n"
        ))
        .unwrap();
        assert!(matches!(p.probes[0].check(), Ok(ProbeCheck::Job(j)) if j["backoffLimit"] == 1));
        let e = AppProfile::from_toml(&format!("{base}job = \"x\"\n")).unwrap_err().to_string();
        assert!(e.contains("a Job's spec"), "{e}");
    }

    #[test]
    fn a_resource_op_without_a_custom_resource_template_is_refused() {
        let base = "namespace = \"app\"\nstatefulset = \"etcd\"\n[backup]\ndone = { field = \"status.phase\", equals = \"Completed\" }\n";
        let e = AppProfile::from_toml(&format!("{base}[backup.template]\nkind = \"EtcdBackup\"\n")).unwrap_err().to_string();
        assert!(e.contains("[backup.template] needs apiVersion"), "{e}");
        let e = AppProfile::from_toml(&format!("{base}[backup.template]\napiVersion = \"v1\"\nkind = \"ConfigMap\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("group/version"), "{e}");
        let e = AppProfile::from_toml(&format!("{base}template = \"x\"\n")).unwrap_err().to_string();
        assert!(e.contains("must be a table"), "{e}");
    }

    #[test]
    fn a_selection_with_count_and_percent_or_out_of_range_is_refused() {
        let base = "namespace = \"app\"\nstatefulset = \"etcd\"\n[pod_kill_selected]\nselector = \"app=etcd\"\n";
        assert!(AppProfile::from_toml(&format!("{base}count = 2\n")).is_ok());
        for bad in ["count = 2\npercent = 50\n", "count = 0\n", "percent = 0\n", "percent = 101\n"] {
            let e = AppProfile::from_toml(&format!("{base}{bad}")).unwrap_err().to_string();
            assert!(e.contains("[pod_kill_selected]"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_data_workload_takes_one_to_thirty_two_writers() {
        let base = "namespace = \"app\"\nstatefulset = \"etcd\"\n[data]\nselector = \"app=etcd\"\nwrite = [\"w\"]\nread = [\"r\"]\n";
        assert_eq!(AppProfile::from_toml(base).unwrap().data.unwrap().writers, 1, "one by default");
        assert_eq!(AppProfile::from_toml(&format!("{base}writers = 4\n")).unwrap().data.unwrap().writers, 4);
        for bad in ["writers = 0\n", "writers = 33\n"] {
            let e = AppProfile::from_toml(&format!("{base}{bad}")).unwrap_err().to_string();
            assert!(e.contains("[data] writers must be 1 to 32"), "{bad}: {e}");
        }
    }
}
