//! Profiles: named tiers (plan length, op weights, members, bounds), written in TOML.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::{Model, Version};
use crate::op::OpKind;

/// The longest plan a profile may ask for: generation and the model are linear in it, and a
/// plan this long already runs for days.
pub const MAX_STEPS: usize = 100_000;

/// A named tier: which ops with which weights, how long plans are, the bounds of every wait,
/// and which invariants are checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Plan length (ops).
    pub steps: usize,
    #[serde(default = "default_three")]
    pub sites: u8,
    #[serde(default = "default_three_u32")]
    pub members: u32,
    /// Versions the stack can run, oldest first; the stack starts on the first.
    pub versions: Vec<Version>,
    /// The most members down at once. Default: as many as keeps quorum.
    #[serde(default)]
    pub max_down: Option<usize>,
    /// The op kinds this tier may use; kinds not listed get weight 0 (default: every kind). A
    /// tier that lists its ops never picks up a new op kind by accident.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<Vec<OpKind>>,
    /// Pinned op weights. Kinds left out are drawn from the seed (swarm testing);
    /// a weight of 0 disables a kind.
    #[serde(default)]
    pub weights: BTreeMap<OpKind, u32>,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub workload: Workload,
    /// Invariant names checked after every step. Default: all of them.
    #[serde(default)]
    pub invariants: Option<Vec<String>>,
}

/// Every wait is bounded; these are the bounds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeouts {
    /// How long the stack may take to satisfy every invariant after a step.
    #[serde(with = "human")]
    pub converge: Duration,
    /// Deadline of one linearizable read through the endpoint.
    #[serde(with = "human")]
    pub probe: Duration,
    /// How long the healed stack may take to converge after the last op.
    #[serde(with = "human")]
    pub liveness: Duration,
    /// How long one op may take to execute.
    #[serde(with = "human")]
    pub op: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            converge: Duration::from_secs(10),
            probe: Duration::from_secs(2),
            liveness: Duration::from_secs(30),
            op: Duration::from_secs(60),
        }
    }
}

/// The clients that load the stack through the endpoint during the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Workload {
    /// Which workload: `kube` (the shape of kube-apiserver's storage traffic, the default) or
    /// `puts` (one client writing unique keys with plain puts).
    pub kind: WorkloadKind,
    /// Pause between two requests of one client (`puts`: between two writes).
    #[serde(with = "human")]
    pub interval: Duration,
    /// Deadline of one request.
    #[serde(with = "human")]
    pub timeout: Duration,
    /// `kube`: concurrent clients writing objects (transactions guarded by a revision compare,
    /// conflict retries).
    pub clients: u32,
    /// `kube`: how many object keys the clients share (fewer keys, more conflicts).
    pub keyspace: u32,
    /// `kube`: long-lived watches of the object keys, resumed from their last revision + 1.
    /// Watch `i` goes to member `i` first (as a stacked kube-apiserver watches its local
    /// member), through the endpoint when that member does not answer.
    pub watches: u32,
    /// `kube`: what each client does, by weight.
    pub mix: Mix,
    /// `kube`: the TTL of the leases the lease client grants (etcd raises anything below its
    /// minimum, about 1.5 s with default timings).
    #[serde(with = "human")]
    pub lease_ttl: Duration,
}

/// Which workload loads the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    #[default]
    Kube,
    Puts,
}

/// What a `kube` workload client does, by weight (0 switches a kind of request off).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mix {
    /// Create a key believed absent (`If(ModRevision == 0) Then(Put) Else(Get)`).
    pub create: u32,
    /// Update a key believed present (`If(ModRevision == rev) Then(Put) Else(Get)`, retried on
    /// conflict with the revision the `Else` returned).
    pub update: u32,
    /// Delete a key believed present (same guard, `Delete`).
    pub delete: u32,
    /// Put a key attached to the client's lease (a lease is reused for a few keys, then revoked
    /// or left to expire, the way kube-apiserver attaches Events to shared leases).
    pub lease: u32,
    /// A paginated read of the object keys at a pinned revision (LIST with `limit` and
    /// continue).
    pub list: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix { create: 20, update: 60, delete: 10, lease: 8, list: 2 }
    }
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            kind: WorkloadKind::Kube,
            interval: Duration::from_millis(5),
            timeout: Duration::from_secs(1),
            clients: 4,
            keyspace: 500,
            watches: 3,
            mix: Mix::default(),
            lease_ttl: Duration::from_secs(3),
        }
    }
}

fn default_three() -> u8 {
    3
}
fn default_three_u32() -> u32 {
    3
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("not a valid profile: {0}")]
    Parse(String),
    #[error("profile {name:?}: {problem}")]
    Invalid { name: String, problem: String },
}

impl Profile {
    pub fn from_toml(text: &str) -> Result<Profile, ProfileError> {
        let p: Profile = toml::from_str(text).map_err(|e| ProfileError::Parse(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a profile always serializes")
    }

    pub fn validate(&self) -> Result<(), ProfileError> {
        let bad = |problem: String| Err(ProfileError::Invalid { name: self.name.clone(), problem });
        if self.steps == 0 {
            return bad("steps must be at least 1".into());
        }
        if self.steps > MAX_STEPS {
            return bad(format!("steps = {} is more than the {MAX_STEPS} a plan may have", self.steps));
        }
        if let Some(ops) = &self.ops {
            if let Some((k, _)) = self.weights.iter().find(|(k, w)| **w > 0 && !ops.contains(k)) {
                return bad(format!("weights.{k} is set but {k} is not in ops"));
            }
        }
        if self.sites == 0 || self.members == 0 {
            return bad("sites and members must be at least 1".into());
        }
        if self.members > 9 {
            return bad(format!("members = {} is more than the 9 a testbed supports", self.members));
        }
        if self.versions.is_empty() {
            return bad("versions must name at least one version, e.g. versions = [\"3.4\", \"3.5\"]".into());
        }
        if self.versions.windows(2).any(|w| w[0] >= w[1]) {
            return bad("versions must be listed oldest first, without repeats".into());
        }
        if let Some(d) = self.max_down {
            if d > self.members as usize {
                return bad(format!("max_down = {d} is more than the {} members", self.members));
            }
        }
        if self.max_down() == 0 {
            return bad(format!(
                "max_down is 0 for {} members: no fault could run; set max_down = 1 or more (more than {} loses quorum: destructive plans)",
                self.members,
                self.members - (self.members / 2 + 1)
            ));
        }
        for (name, d) in [("converge", self.timeouts.converge), ("probe", self.timeouts.probe), ("liveness", self.timeouts.liveness), ("op", self.timeouts.op)] {
            if d.is_zero() {
                return bad(format!("timeouts.{name} must be more than zero"));
            }
        }
        if self.workload.timeout.is_zero() {
            return bad("workload.timeout must be more than zero".into());
        }
        let w = &self.workload;
        if w.kind == WorkloadKind::Kube {
            if w.clients == 0 || w.clients > 256 {
                return bad(format!("workload.clients = {} must be between 1 and 256", w.clients));
            }
            if w.keyspace == 0 {
                return bad("workload.keyspace must be at least 1".into());
            }
            if w.watches > 16 {
                return bad(format!("workload.watches = {} is more than 16", w.watches));
            }
            let m = &w.mix;
            if m.create + m.update + m.delete + m.lease + m.list == 0 {
                return bad("workload.mix gives every request weight 0: nothing would run".into());
            }
            if m.lease > 0 && w.lease_ttl < Duration::from_secs(2) {
                return bad(format!("workload.lease_ttl = {} is below 2s: etcd raises short TTLs, and the lease check needs the TTL it asked for", humantime::format_duration(w.lease_ttl)));
            }
        }
        Ok(())
    }

    /// Whether the tier may use op kind `k` at all (its `ops` list, when it has one).
    pub fn allows(&self, k: OpKind) -> bool {
        self.ops.as_ref().is_none_or(|ops| ops.contains(&k))
    }

    /// max_down as configured, or the most that keeps quorum.
    pub fn max_down(&self) -> usize {
        self.max_down.unwrap_or(self.members as usize - (self.members as usize / 2 + 1))
    }

    /// The model of a freshly started stack for this profile.
    pub fn initial_model(&self) -> Model {
        Model::new(self.sites, self.members, self.versions.clone(), self.max_down())
    }
}

/// serde for durations written the human way: "500ms", "10s", "2m".
mod human {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("invalid duration {s:?}: {e}")))
    }
}
