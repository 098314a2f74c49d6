//! The local target's spec (what a seed record says: the planted bug) and its options (what
//! this machine says: etcd and HAProxy binaries, disk mode).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use shakedown_faults::{Profile, Stack, Version};

use super::bugs::PlantedBug;
use super::disk::DiskMode;
use crate::binaries::{self, Binaries, BinaryOverrides};
use crate::exit::Fatal;

/// The local stack of a record: the planted bug it ran with, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalSpec {
    /// A planted bug switched on in the local target's own operations (`--testbed-bug`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testbed_bug: Option<PlantedBug>,
}

/// What this machine offers the local target: the binaries found and the disk mode.
pub type Environment = (Binaries, DiskMode);

/// Member disks: loop-mounted ext4 images (root) or plain directories; `auto` picks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DiskArg {
    #[default]
    Auto,
    Loop,
    Plain,
}

/// The local target's command-line options.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LocalOptions {
    /// local target: switch on a planted bug: upgrade-no-wait, replace-keeps-old-member,
    /// endpoint-no-health-check, ack-before-write, recover-leaves-rule,
    /// reattach-on-shutdown-disk, restore-partial, txn-ignores-conflict, serializable-reads,
    /// watch-resume-from-now, lease-keys-unattached, restore-mixed-backups, restore-keeps-watches, api-lb-no-health-check,
    /// restore-keeps-apiservers (see docs/local-target.md).
    #[arg(long, value_parser = parse_bug)]
    pub testbed_bug: Option<PlantedBug>,
    /// local target: an etcd binary for a version, e.g. --etcd 3.5=/opt/etcd-3.5/etcd (repeatable).
    #[arg(long = "etcd", value_name = "VERSION=PATH", value_parser = parse_etcd)]
    pub etcd: Vec<(Version, PathBuf)>,
    /// local target: the haproxy binary.
    #[arg(long, env = "SHAKEDOWN_HAPROXY")]
    pub haproxy: Option<PathBuf>,
    /// local target, stack = "control-plane": the kube-apiserver binary (default: the cache of
    /// scripts/build-kube-apiserver.sh, then the PATH).
    #[arg(long, env = "SHAKEDOWN_KUBE_APISERVER")]
    pub kube_apiserver: Option<PathBuf>,
    /// local target: member disks: loop-mounted ext4 images (root) or plain directories; auto picks.
    #[arg(long, value_enum, default_value_t = DiskArg::Auto)]
    pub disks: DiskArg,
}

fn parse_bug(s: &str) -> Result<PlantedBug, shakedown_faults::UnknownName> {
    s.parse()
}

fn parse_etcd(s: &str) -> Result<(Version, PathBuf), String> {
    let (v, p) = s.split_once('=').ok_or("expected VERSION=PATH, e.g. 3.5=/usr/local/bin/etcd")?;
    Ok((v.parse()?, PathBuf::from(p)))
}

impl LocalOptions {
    /// Local options given to another target are an error, not silently ignored.
    pub fn refuse_for(&self, target: &str) -> Result<(), Fatal> {
        let given: Vec<&str> =
            [(self.testbed_bug.is_some(), "--testbed-bug"), (!self.etcd.is_empty(), "--etcd"), (self.disks != DiskArg::Auto, "--disks")]
                .into_iter()
                .filter_map(|(g, n)| g.then_some(n))
                .collect();
        crate::targets::refuse_options(&given, "local", target)
    }

    /// The binaries and the disk mode, checked before anything is created.
    pub fn environment(&self, profile: &Profile) -> Result<Environment, Fatal> {
        self.check_etcd_overrides(profile)?;
        let overrides = BinaryOverrides {
            etcd: self.etcd.iter().cloned().collect::<BTreeMap<_, _>>(),
            haproxy: self.haproxy.clone(),
            kube_apiserver: self.kube_apiserver.clone(),
            failpoints: profile.etcd.failpoints,
        };
        crate::targets::stack_fits(crate::targets::TargetKind::Local, profile)?;
        let mut binaries = binaries::discover(&profile.versions, &overrides)?;
        if profile.stack == Stack::ControlPlane {
            binaries.kube_apiserver = Some(binaries::discover_apiserver(overrides.kube_apiserver.as_deref())?);
        }
        let (detected, why) = DiskMode::detect();
        let disks = match self.disks {
            DiskArg::Auto => {
                if let Some(why) = why {
                    tracing::warn!("{why}");
                }
                detected
            }
            DiskArg::Loop if detected != DiskMode::Loop => {
                return Err(Fatal::environment(format!("--disks loop is not possible here: {}", why.unwrap_or_default())))
            }
            DiskArg::Loop => DiskMode::Loop,
            DiskArg::Plain => DiskMode::Plain,
        };
        Ok((binaries, disks))
    }
}

impl LocalOptions {
    /// An `--etcd` for a version the profile does not run would be ignored, and two for one
    /// version would leave one unused: both are refused.
    fn check_etcd_overrides(&self, profile: &Profile) -> Result<(), Fatal> {
        let mut seen = std::collections::BTreeSet::new();
        for (v, _) in &self.etcd {
            if !seen.insert(*v) {
                return Err(Fatal::usage(format!("--etcd {v}= is given twice: pass one binary per version")));
            }
            if !profile.versions.contains(v) {
                let runs: Vec<String> = profile.versions.iter().map(|v| v.to_string()).collect();
                return Err(Fatal::usage(format!(
                    "--etcd {v}=: profile {} does not run etcd {v} (its versions: {}); the binary would be ignored",
                    profile.name,
                    runs.join(", ")
                )));
            }
        }
        Ok(())
    }
}

impl LocalSpec {
    /// A new run's spec from the options, or the recorded one with `--testbed-bug` overriding.
    pub fn from_options(options: &LocalOptions, recorded: Option<&LocalSpec>) -> LocalSpec {
        LocalSpec { testbed_bug: options.testbed_bug.or(recorded.and_then(|r| r.testbed_bug)) }
    }

    pub fn describe(&self) -> String {
        match self.testbed_bug {
            Some(b) => format!("local · planted bug {b}"),
            None => "local".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--testbed-bug`'s help names every planted bug (it named 12 of 14).
    #[test]
    fn the_testbed_bug_help_names_every_planted_bug() {
        let cmd = <LocalOptions as clap::Args>::augment_args(clap::Command::new("run"));
        let arg = cmd.get_arguments().find(|a| a.get_id() == "testbed_bug").expect("--testbed-bug");
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        for bug in PlantedBug::ALL {
            assert!(help.contains(bug.name()), "--testbed-bug's help lacks {bug}: {help}");
        }
    }
}
