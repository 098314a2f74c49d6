//! The kube target's spec (what a seed record says: the Cluster, the context, the kube profile)
//! and its options (the kubeconfig, a dry run).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::profile::KubeProfile;
use super::KubeError;
use crate::exit::Fatal;

/// The Cluster of a record and how it was driven (the kubeconfig is given again on replay).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSpec {
    /// `NAMESPACE/NAME` of the Cluster API Cluster.
    pub cluster: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    pub kube_profile: KubeProfile,
}

/// The kube target's command-line options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct KubeOptions {
    /// kube target: the kubeconfig (default: KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// kube target: the kubeconfig context (default: its current context).
    #[arg(long, env = "SHAKEDOWN_CONTEXT")]
    pub context: Option<String>,
    /// kube target: the Cluster API Cluster under test, NAMESPACE/NAME. It must carry the
    /// annotation shakedown.dev/allow-chaos: "true".
    #[arg(long, env = "SHAKEDOWN_CLUSTER", value_name = "NAMESPACE/NAME")]
    pub cluster: Option<String>,
    /// kube target: versions, failure domains, hooks, probes and checks (TOML; see docs/kube-target.md).
    #[arg(long, env = "SHAKEDOWN_KUBE_PROFILE", value_name = "FILE")]
    pub kube_profile: Option<PathBuf>,
    /// kube and app targets (`run`): connect and read as a run does (the profile is checked
    /// against the cluster), then print every write request the plan would make and every wait,
    /// and make none; the run ends with the count of writes printed.
    #[arg(long)]
    pub dry_run: bool,
}

impl KubeOptions {
    /// Kube options given to another target are an error, not silently ignored.
    pub fn refuse_for(&self, target: &str) -> Result<(), Fatal> {
        let given: Vec<&str> = self.given(false).into_iter().filter(|g| *g != "--dry-run").collect();
        crate::targets::refuse_options(&given, "kube", target)?;
        if self.dry_run {
            return Err(Fatal::usage(format!("--dry-run is for the kube and app targets; --target {target} does not take it")));
        }
        Ok(())
    }

    /// The kube options given, by their flags; with `for_app`, only those the app target does
    /// not take (it takes the kubeconfig, the context and the dry run).
    fn given(&self, for_app: bool) -> Vec<&'static str> {
        [
            (self.kubeconfig.is_some() && !for_app, "--kubeconfig"),
            (self.context.is_some() && !for_app, "--context (or SHAKEDOWN_CONTEXT)"),
            (self.cluster.is_some(), "--cluster (or SHAKEDOWN_CLUSTER)"),
            (self.kube_profile.is_some(), "--kube-profile (or SHAKEDOWN_KUBE_PROFILE)"),
            (self.dry_run && !for_app, "--dry-run"),
        ]
        .into_iter()
        .filter_map(|(g, n)| g.then_some(n))
        .collect()
    }
}

impl KubeOptions {
    /// The app target takes the kubeconfig, the context and `--dry-run`; the Cluster and the
    /// kube profile are the kube target's alone.
    pub fn refuse_for_app(&self) -> Result<(), Fatal> {
        crate::targets::refuse_options(&self.given(true), "kube", "app")
    }
}

impl KubeSpec {
    /// A new run's spec from the flags, or the recorded one with what the flags override.
    pub fn from_options(opts: &KubeOptions, recorded: Option<&KubeSpec>) -> Result<KubeSpec, Fatal> {
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
            (Some(p), _) => KubeProfile::load(p).map_err(|e| Fatal::usage(e.to_string()))?,
            (None, Some(r)) => r.kube_profile.clone(),
            (None, None) => KubeProfile::default(),
        };
        let context = opts.context.clone().or_else(|| recorded.and_then(|r| r.context.clone()));
        Ok(KubeSpec { cluster, context, kube_profile })
    }

    /// (namespace, name) of the Cluster.
    pub fn namespace_name(&self) -> (&str, &str) {
        self.cluster.split_once('/').unwrap_or(("", &self.cluster))
    }

    pub fn describe(&self) -> String {
        format!("Cluster {}", self.cluster)
    }
}

/// The CLI's exit code for a failure to start.
pub fn fatal(e: KubeError) -> Fatal {
    match e {
        KubeError::Usage(m) => Fatal::usage(m),
        KubeError::Refused(m) | KubeError::Environment(m) => Fatal::environment(m),
    }
}
