//! Commands: plan, run, replay, shrink, soak, testbed, reap, profiles, validate.

#[cfg(test)]
mod k8s_manifests;
pub mod merge;
mod node;
pub mod partition;
pub mod replay;
pub mod session;
pub mod shrink;
pub mod soak;
mod testbed;
pub mod validate;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::exit::{Exit, Fatal};
use crate::faults::{generate, Profile};
use crate::profiles;
use crate::record::Match;
use crate::targets::{TargetKind, TargetOptions, TargetSpec};
use clap::{Args, Parser, Subcommand, ValueEnum};

use partition::{parse_partition, Partition};
use session::{etcd_text, weights_text, Exec, Interrupt};

#[derive(Parser, Debug)]
#[command(name = "shakedown", version, about = "Seeded fault plans against real stacks (a local etcd testbed; a Cluster API cluster with --target kube; an application's StatefulSet and operator on a Kubernetes cluster with --target app): invariants after every step, failing seeds recorded, shrunk and replayable.", after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format on stderr (level from RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
}

const EXIT_CODES: &str = "Exit codes:\n  0    every invariant held\n  1    an invariant was violated (a seed record was written)\n  2    usage error or bad input (unknown profile, malformed seed record; kube: bad kubeconfig, unknown context, no such Cluster)\n  3    liveness failure: the stack did not converge within a bound\n  4    environment or set-up failure (binary missing, no loop device, port taken; kube: Cluster not opted in, apiserver unreachable, RBAC denied)\n  5    internal error (a bug in shakedown)\n  6    check-history: undecided within the search bound (never a pass)\n  130  interrupted (Ctrl-C / SIGTERM); the stack was torn down";

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print the plan for a seed without running it.
    Plan {
        #[arg(long)]
        seed: u64,
        /// A shipped profile name or a profile .toml file.
        #[arg(long, default_value = "default")]
        profile: String,
        /// Override the profile's plan length.
        #[arg(long)]
        steps: Option<usize>,
        /// For an application tier: the plan `run --target app --app-profile FILE` would run,
        /// drawing only the op kinds this app profile can run.
        #[arg(long, value_name = "FILE")]
        app_profile: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = PlanFormat::Text)]
        format: PlanFormat,
    },
    /// Generate a plan from a seed and run it against a target.
    Run {
        /// The stack under test: `local` is the built-in real testbed on this machine; `kube` a
        /// Cluster API Cluster (--cluster NAMESPACE/NAME).
        #[arg(long = "target", env = "SHAKEDOWN_TARGET", value_enum, default_value_t = TargetKind::Local)]
        kind: TargetKind,
        /// The seed (drawn and printed when omitted); with --count or --partition the base seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Run N seeds one after the other: S, S+1, … (with --partition i/n: S+i, S+i+n, …).
        /// Exit code: 130 if interrupted, else 1 if any seed violated an invariant, else the
        /// worst of the others.
        #[arg(long, env = "SHAKEDOWN_COUNT", value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
        /// This pod's share of the seeds when n pods run one seed space (an Indexed Job): seeds
        /// S+i, S+i+n, S+i+2n, … of --seed S (needed: every pod must start from the same seed).
        /// In an Indexed Job: SHAKEDOWN_PARTITION="$(JOB_COMPLETION_INDEX)/N", N = completions.
        #[arg(long, env = "SHAKEDOWN_PARTITION", value_name = "i/n", value_parser = parse_partition)]
        partition: Option<Partition>,
        /// Also write the JUnit XML of the run (one case per seed) to PATH (each run directory
        /// has its own junit.xml too).
        #[arg(long, env = "SHAKEDOWN_JUNIT", value_name = "PATH")]
        junit: Option<PathBuf>,
        /// Override the profile's plan length.
        #[arg(long)]
        steps: Option<usize>,
        /// A shipped profile name (see `shakedown profiles`) or a profile .toml file.
        #[arg(long, env = "SHAKEDOWN_PROFILE", default_value = "default")]
        profile: String,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Re-execute the op list of a seed record exactly, and report whether it fails the same way
    /// (with --times N: the reproduction rate and its 95% interval). Given a directory, replay
    /// every record in it against its `expect` ("fail": the failure still reproduces; "pass":
    /// the plan passes) and exit 1 on any mismatch; a record expected to fail whose recorded
    /// rate (`[[reproduction]]`) is below 1 gets enough replays to make a miss unlikely (at most
    /// 20, never fewer than --times) and counts at the first that reproduces.
    Replay {
        /// A seed record, or a directory of them (a regression corpus).
        file: PathBuf,
        /// Replay N times and report the reproduction rate.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
        times: u32,
        /// Replay the original plan even when the record holds a shrunk one.
        #[arg(long)]
        original: bool,
        /// When a replay counts as reproducing: `step` = the same failure kind and invariant at
        /// the same step; `invariant` = the same kind and invariant at any step (timing-bound
        /// defects whose step moves); `defect` = any failure naming the recorded known defect.
        /// Default: the record's `match`, else `step`.
        #[arg(long = "match", value_enum, value_name = "step|invariant|defect")]
        matching: Option<Match>,
        /// Append the measured rate (runs, reproduced, match, the versions the replays ran with)
        /// to the record as a `[[reproduction]]` table, atomically; older measurements stay.
        /// One record only, not a directory.
        #[arg(long)]
        write_rate: bool,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Minimise the plan of a failing seed record against the real stack (delta debugging,
    /// valid plans only); the shrunk plan is written into the record beside the original.
    Shrink {
        /// The seed record to shrink (rewritten in place, atomically, when done).
        file: PathBuf,
        /// Stop after this much time (e.g. 20m, 1h30m); the best plan so far is kept.
        #[arg(long, default_value = "20m", value_parser = parse_duration)]
        budget: Duration,
        /// Stop after this many candidate executions.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
        max_runs: u32,
        /// Run a candidate up to K times before deciding it does not fail (for failures that
        /// do not reproduce every time).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
        confirm: u32,
        /// A candidate counts as failing when it fails the same way in J of its up to K
        /// (--confirm) runs; it stops early once J is reached or can no longer be. J > K is a
        /// usage error.
        #[arg(long, default_value_t = 1, value_name = "J", value_parser = clap::value_parser!(u32).range(1..=20))]
        needs: u32,
        /// When a candidate fails "the same way": `invariant` (default) = the same failure kind
        /// and invariant at any step; `step` = also at the step the recorded failure maps to
        /// (the candidate's last op, or bring-up, or healing); `defect` = any failure naming the
        /// recorded known defect.
        #[arg(long = "match", value_enum, value_name = "step|invariant|defect", default_value_t = Match::Invariant)]
        matching: Match,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Run seed after seed until the time is up (or --max-failures), recording every failure;
    /// a summary table, JUnit XML and an HTML report at the end.
    Soak {
        /// The stack under test (see `run --help`).
        #[arg(long = "target", env = "SHAKEDOWN_TARGET", value_enum, default_value_t = TargetKind::Local)]
        kind: TargetKind,
        /// How long to keep starting seeds (e.g. 2m, 8h).
        #[arg(long = "for", env = "SHAKEDOWN_SOAK_FOR", value_parser = parse_duration)]
        duration: Duration,
        /// The first seed (drawn and printed when omitted); the next ones follow it.
        #[arg(long)]
        seed: Option<u64>,
        /// Stop after this many failing seeds.
        #[arg(long, env = "SHAKEDOWN_MAX_FAILURES", value_parser = clap::value_parser!(u32).range(1..))]
        max_failures: Option<u32>,
        /// This pod's share of the seeds when n pods soak one seed space: seeds S+i, S+i+n, … of
        /// --seed S (needed). See `run --help`.
        #[arg(long, env = "SHAKEDOWN_PARTITION", value_name = "i/n", value_parser = parse_partition)]
        partition: Option<Partition>,
        /// Also write the soak's JUnit XML (one case per seed) to PATH, besides the soak directory.
        #[arg(long, env = "SHAKEDOWN_JUNIT", value_name = "PATH")]
        junit: Option<PathBuf>,
        /// A shipped profile name (see `shakedown profiles`) or a profile .toml file.
        #[arg(long, env = "SHAKEDOWN_PROFILE", default_value = "nightly")]
        profile: String,
        /// Override the profile's plan length.
        #[arg(long)]
        steps: Option<usize>,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Merge the results of many soaks (a soak farm's pods, several nights) into one summary, one
    /// JUnit file (a case per seed) and one HTML index linking every seed's report; read from the
    /// soak directories, nothing run again. Exit code: what the seeds came to, as for `soak`.
    Merge {
        /// Soak directories (`shakedown-runs/soak-*`), each with its `soak.jsonl`, or directories
        /// holding them (a soak farm's claim: every soak up to 3 levels below is merged).
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Where the merged report.html and junit.xml go (created if missing).
        #[arg(long, default_value = "shakedown-merged")]
        out: PathBuf,
        /// Also write the merged JUnit XML to PATH.
        #[arg(long, value_name = "PATH")]
        junit: Option<PathBuf>,
    },
    /// Run the local stack by hand.
    Testbed {
        #[command(subcommand)]
        action: TestbedAction,
    },
    /// A real single-node Kubernetes 1.20 cluster on this machine (etcd, kube-apiserver,
    /// controller-manager, scheduler, containerd, kubelet), for the application target.
    Node {
        #[command(subcommand)]
        action: NodeAction,
    },
    /// Remove what killed runs left behind (processes, mounts, loop devices, nftables tables) under the runs directory.
    /// With --kube: the objects of killed kube runs (their ConfigMaps; KubeadmControlPlanes they paused; their Velero objects; their API workload's namespace in the workload cluster).
    Reap {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
        /// Reap on the management cluster of the kubeconfig instead of this machine.
        #[arg(long)]
        kube: bool,
        /// With --kube: the kubeconfig (default: $KUBECONFIG, then ~/.kube/config).
        #[arg(long, requires = "kube")]
        kubeconfig: Option<PathBuf>,
        /// With --kube: the kubeconfig's context (default: its current one).
        #[arg(long, requires = "kube")]
        context: Option<String>,
        /// With --kube: only this namespace (default: all namespaces).
        #[arg(long, requires = "kube")]
        namespace: Option<String>,
        /// Also runs that look alive or ran on another host.
        #[arg(long)]
        all: bool,
    },
    /// Check a history file (every request of a run's clients with its answer; the format is in
    /// the README): is there one order of the requests, consistent with real time, in which every
    /// answer is what a correct store gives? Exit 0: yes; 1: no (the verdict names the requests
    /// that cannot be ordered); 6: undecided within the bound; 2: the file is not a history.
    CheckHistory {
        /// The history (JSON Lines: a header line, then one request per line).
        file: PathBuf,
        /// Search steps allowed per key (and epoch) before it is reported undecided.
        #[arg(long, default_value_t = shakedown_history::DEFAULT_BOUND)]
        bound: u64,
    },
    /// Check profiles, kube profiles, app profiles and seed records offline (no cluster, no
    /// stack, no network, nothing created) with the checks a run, replay or shrink applies before
    /// it starts: one line per input (`ok: PATH: KIND NAME · …`, or the error with its line and
    /// column), exit 0 when every input is valid, 2 when any is not.
    Validate {
        /// Files (or directories: their *.toml files; or shipped profile names), each recognised
        /// by its keys: a seed record by `format`, `plan` or `failure`, else the kind of profile
        /// that knows most of its keys. When two kinds fit equally, it says so: name the file
        /// with the flag of its kind instead.
        #[arg(value_name = "FILE")]
        files: Vec<PathBuf>,
        /// A profile (a shipped name or a .toml file), whatever its keys.
        #[arg(long = "profile", value_name = "NAME|FILE")]
        profiles: Vec<String>,
        /// A kube profile (`run --target kube --kube-profile`).
        #[arg(long = "kube-profile", value_name = "FILE")]
        kube_profiles: Vec<PathBuf>,
        /// An app profile (`run --target app --app-profile`).
        #[arg(long = "app-profile", value_name = "FILE")]
        app_profiles: Vec<PathBuf>,
        /// A seed record (`replay FILE`): its profile, its plans against the profile's model, its
        /// failure's step and its target.
        #[arg(long = "record", value_name = "FILE")]
        records: Vec<PathBuf>,
    },
    /// List the shipped profiles.
    Profiles {
        /// Print the reference of every profile and kube profile field instead (markdown,
        /// generated from the types; committed as docs/reference.md).
        #[arg(long)]
        reference: bool,
    },
}

#[allow(clippy::large_enum_variant, reason = "one value per run or per line of the event log: boxing saves nothing that matters")]
#[derive(Subcommand, Debug)]
pub enum TestbedAction {
    /// Start the stack and leave it running; prints the endpoint.
    Up {
        #[command(flatten)]
        opts: RunOpts,
        /// The profile whose members, sites and versions the stack has.
        #[arg(long, default_value = "default")]
        profile: String,
    },
    /// Tear down the testbed started by `testbed up`.
    Down {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
    },
    /// Show the members and the endpoint of the running testbed.
    Status {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum NodeAction {
    /// Bring a node up and leave it running; prints its kubeconfig, Ready time and memory.
    Up {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
        /// Set the process-wide sysctls kubelet needs (vm.overcommit_memory=1,
        /// vm.panic_on_oom=0, kernel.panic=10, kernel.panic_on_oops=1,
        /// kernel.keys.root_maxkeys=1000000, kernel.keys.root_maxbytes=25000000) for the node's
        /// life, restored by `node down` or `reap`. Without it, a machine whose values differ is
        /// refused (exit 4) with the command that sets them.
        #[arg(long)]
        set_kernel_tunables: bool,
        /// Worker nodes beside the control-plane node, each a kubelet and a containerd of its
        /// own (its Node named `<node>-wN`), so that a drained or tainted node's pods are
        /// rescheduled elsewhere. They share the node's network namespace and pod network; a
        /// claim's volume is reachable from every node. 0 to 8.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=8))]
        workers: u8,
    },
    /// Show the running node: Ready, pods, memory.
    Status {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
    },
    /// Load image archives (`docker save`, `podman save`, `buildah push … docker-archive:` or
    /// OCI archives) into the node's containerd, tags kept, for pods with `imagePullPolicy:
    /// Never` or `IfNotPresent` (the node pulls from no registry). An archive containerd cannot
    /// import is refused (exit 2) naming it; the archives before it stay loaded.
    Load {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
        /// The name an OCI archive's images get when the archive names only a tag (`1.0`
        /// becomes `NAME:1.0`); without it containerd makes one up (`import-DATE:1.0`).
        #[arg(long, value_name = "NAME")]
        base_name: Option<String>,
        /// The archives, one or more.
        #[arg(required = true, value_name = "ARCHIVE")]
        archives: Vec<PathBuf>,
    },
    /// Tear down the node started by `node up` and list anything left behind (exit 4 if any).
    Down {
        #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
        runs_dir: PathBuf,
    },
    /// The node's NetworkPolicy engine (bring-up starts it; not for use by hand).
    #[command(hide = true)]
    PolicyAgent {
        /// The node's directory (`<run dir>/node`).
        #[arg(long)]
        node_dir: PathBuf,
    },
    /// The host's forward to the node's apiserver (bring-up starts it; not for use by hand).
    #[command(hide = true)]
    Forward {
        /// The node's directory (`<run dir>/node`).
        #[arg(long)]
        node_dir: PathBuf,
        /// The node's network namespace (`/proc/<pid>/ns/net` of its holder process).
        #[arg(long)]
        netns: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PlanFormat {
    Text,
    Toml,
}

#[derive(Args, Debug, Clone)]
pub struct RunOpts {
    /// Where seed records of failing runs are written.
    #[arg(long, env = "SHAKEDOWN_SEEDS_DIR", default_value = "seeds")]
    pub seeds_dir: PathBuf,
    /// Where run directories (plan, event log, member logs) are created.
    #[arg(long, env = "SHAKEDOWN_RUNS_DIR", default_value = "shakedown-runs")]
    pub runs_dir: PathBuf,
    #[command(flatten)]
    pub target: TargetOptions,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (write durations like 90s, 20m, 1h30m)"))?;
    if d.is_zero() {
        return Err("must be more than zero".into());
    }
    Ok(d)
}

pub fn init_logging(format: LogFormat) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colour only for a person at a terminal, and never under NO_COLOR (https://no-color.org):
    // CI logs and files get plain text.
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let b = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    match format {
        LogFormat::Text => b.with_target(false).init(),
        LogFormat::Json => b.json().init(),
    }
}

pub async fn dispatch(cli: Cli) -> Result<Exit, Fatal> {
    let json_logs = matches!(cli.log_format, LogFormat::Json);
    match cli.command {
        Command::CheckHistory { file, bound } => check_history(&file, bound),
        Command::Merge { dirs, out, junit } => merge::merge(&dirs, &out, junit.as_deref()),
        Command::Validate { files, profiles, kube_profiles, app_profiles, records } => {
            validate::validate(&validate::Inputs { files, profiles, kube_profiles, app_profiles, records })
        }
        Command::Plan { seed, profile, steps, app_profile, format } => {
            let mut profile = with_steps(profiles::load(&profile)?, steps)?;
            if let Some(file) = app_profile {
                let app = crate::targets::app::spec::AppProfile::load(&file).map_err(|e| Fatal::usage(e.to_string()))?;
                let spec = TargetSpec::App(crate::targets::app::spec::AppSpec { context: None, app_profile: app });
                crate::targets::stack_fits(TargetKind::App, &profile)?;
                profile = spec.fit(profile)?;
            }
            let plan = planned(seed, &profile);
            match format {
                PlanFormat::Toml => print!("{}", toml::to_string(&plan).expect("plans serialize")),
                PlanFormat::Text => {
                    let etcd = etcd_text(&plan, &profile);
                    println!(
                        "seed {} · profile {} · {} · weights {}{}",
                        plan.seed,
                        plan.profile,
                        shakedown_faults::counted(plan.ops.len() as u64, "op"),
                        weights_text(&plan),
                        if etcd.is_empty() { String::new() } else { format!(" · etcd {etcd}") }
                    );
                    for (i, op) in plan.ops.iter().enumerate() {
                        println!("{:>4}  {op}", i + 1);
                    }
                }
            }
            Ok(Exit::Pass)
        }
        Command::Run { kind, seed, count, partition, junit, steps, profile, opts } => {
            let profile = with_steps(profiles::load(&profile)?, steps)?;
            let spec = TargetSpec::from_options(kind, &opts.target, None)?;
            let profile = spec.fit(profile)?;
            writable_outputs(junit.as_deref(), &opts)?;
            let part = partitioned(partition, seed)?;
            let base = seed.unwrap_or_else(draw_seed);
            let interrupt = Interrupt::install(json_logs);
            let x = exec(&opts, json_logs, &interrupt);
            let mut cases = Vec::new();
            let mut exit = Exit::Pass;
            for j in 0..u64::from(count) {
                if j > 0 && interrupt.requested() {
                    exit = Exit::Interrupted;
                    break;
                }
                let plan = planned(part.seed(base, j), &profile);
                let r = match session::execute(&x, &spec, &profile, &plan).await {
                    Ok(r) => r,
                    Err(e) => {
                        write_junit(junit.as_deref(), &profile, &cases)?;
                        return Err(e);
                    }
                };
                cases.push(session::case_of(&r));
                exit = worse(exit, session::report_run(&r, &opts));
                if exit == Exit::Interrupted {
                    break;
                }
            }
            write_junit(junit.as_deref(), &profile, &cases)?;
            Ok(exit)
        }
        Command::Replay { file, times, original, matching, write_rate, opts } => {
            if opts.target.kube.dry_run {
                // A dry run checks nothing, so it could only ever say "did not reproduce".
                return Err(Fatal::usage(
                    "--dry-run is for `run --target kube` and `run --target app`; a replay must send its writes to reproduce anything",
                ));
            }
            if write_rate && file.is_dir() {
                return Err(Fatal::usage(format!(
                    "--write-rate writes into one record; {} is a directory (replay each record with --times N --write-rate)",
                    file.display()
                )));
            }
            let interrupt = Interrupt::install(json_logs);
            // A replay reports against the record it replays; it writes no new one.
            let x = Exec { record: false, ..exec(&opts, json_logs, &interrupt) };
            let args = replay::ReplayArgs { times, original, matching, write_rate };
            if file.is_dir() {
                replay::replay_corpus(&file, &args, &x).await
            } else {
                replay::replay(&file, &args, &x).await
            }
        }
        Command::Shrink { file, budget, max_runs, confirm, needs, matching, opts } => {
            if opts.target.kube.dry_run {
                return Err(Fatal::usage(
                    "--dry-run is for `run --target kube` and `run --target app`; a shrink must send its writes to see a candidate fail",
                ));
            }
            if needs > confirm {
                return Err(Fatal::usage(format!("--needs {needs} is more than --confirm {confirm}: a candidate runs at most --confirm times (give --confirm {needs} or more)")));
            }
            let interrupt = Interrupt::install(json_logs);
            let limits = shrink::Limits { budget, max_runs, confirm, needs, matching };
            shrink::shrink(&file, limits, &opts, json_logs, &interrupt).await
        }
        Command::Soak { kind, duration, seed, max_failures, partition, junit, profile, steps, opts } => {
            let profile = with_steps(profiles::load(&profile)?, steps)?;
            let spec = TargetSpec::from_options(kind, &opts.target, None)?;
            let profile = spec.fit(profile)?;
            writable_outputs(junit.as_deref(), &opts)?;
            if opts.target.kube.dry_run {
                return Err(Fatal::usage("--dry-run is for `run --target kube` and `run --target app`; a soak sends its writes"));
            }
            let partition = partitioned(partition, seed)?;
            let interrupt = Interrupt::install(json_logs);
            let seed = seed.unwrap_or_else(draw_seed);
            soak::soak(
                soak::SoakArgs { duration, first_seed: seed, max_failures, partition, junit, profile, spec },
                &opts,
                json_logs,
                &interrupt,
            )
            .await
        }
        Command::Testbed { action } => testbed::testbed(action).await,
        Command::Node { action } => node::node(action).await,
        Command::Reap { kube: true, kubeconfig, context, namespace, all, .. } => {
            let r = crate::targets::reap::reap_kube(kubeconfig.as_deref(), context.as_deref(), namespace.as_deref(), all)
                .await
                .map_err(crate::targets::kube::spec::fatal)?;
            for c in &r.configmaps {
                println!("deleted run ConfigMap {c}");
            }
            for k in &r.resumed {
                println!("resumed KubeadmControlPlane {k}");
            }
            for v in &r.velero {
                println!("deleted Velero {v}");
            }
            for a in &r.api {
                println!("deleted API workload {a}");
            }
            for a in &r.app {
                println!("{a}");
            }
            println!("reaped {} kube run(s)", r.configmaps.len());
            Ok(Exit::Pass)
        }
        Command::Reap { runs_dir, .. } => {
            let (n, strays) = testbed::reap_runs(&runs_dir)?;
            println!("reaped {n} run director{}", if n == 1 { "y" } else { "ies" });
            if strays > 0 {
                println!("reaped {strays} stray node{} of killed runs", if strays == 1 { "" } else { "s" });
            }
            Ok(Exit::Pass)
        }
        Command::Profiles { reference: true } => {
            print!("{}", crate::reference::render());
            Ok(Exit::Pass)
        }
        Command::Profiles { reference: false } => {
            let width = profiles::BUILTIN.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
            for (name, text) in profiles::BUILTIN {
                let p = profiles::parse(text)?;
                println!("{name:<width$} {}", p.description);
            }
            Ok(Exit::Pass)
        }
    }
}

/// The partition to run (the whole seed space without `--partition`), refusing one without a
/// base seed: pods that each drew their own would not share a seed space.
fn partitioned(partition: Option<Partition>, seed: Option<u64>) -> Result<Partition, Fatal> {
    match (partition, seed) {
        (Some(p), None) => Err(Fatal::usage(format!(
            "--partition {p} needs --seed S: every pod of the Indexed Job must start from the same base seed (partition {p} runs S+{}, S+{}, …)",
            p.index,
            p.index + p.of
        ))),
        (p, _) => Ok(p.unwrap_or(Partition::WHOLE)),
    }
}

/// `check-history FILE`: prints the verdict; the exit code says it.
fn check_history(file: &std::path::Path, bound: u64) -> Result<Exit, Fatal> {
    let text = std::fs::read_to_string(file).map_err(|e| Fatal::usage(format!("cannot read history {}: {e}", file.display())))?;
    let history = shakedown_history::History::parse(&text).map_err(|e| Fatal::usage(format!("{}: {e}", file.display())))?;
    let report = shakedown_history::check(&history, bound);
    println!("{}", report.summary());
    Ok(match report.verdict {
        shakedown_history::Verdict::Linearizable => Exit::Pass,
        shakedown_history::Verdict::Violation { .. } => Exit::Violation,
        shakedown_history::Verdict::Undecided { .. } => Exit::Undecided,
    })
}

/// The exit code of several runs: interrupted wins, then a violation, then the worst other.
fn worse(a: Exit, b: Exit) -> Exit {
    let rank = |e: Exit| match e {
        Exit::Pass => 0,
        Exit::Liveness | Exit::Undecided => 1,
        Exit::Usage => 2,
        Exit::Environment => 3,
        Exit::Internal => 4,
        Exit::Violation => 5,
        Exit::Interrupted | Exit::BrokenPipe => 6,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// `--junit`, `--seeds-dir` and `--runs-dir` checked before anything runs, creating nothing: a
/// path that cannot be written is found at the start, not after an 8-hour soak (exit 2).
fn writable_outputs(junit: Option<&std::path::Path>, opts: &RunOpts) -> Result<(), Fatal> {
    if let Some(j) = junit {
        writable("--junit", j, false)?;
    }
    writable("--seeds-dir", &opts.seeds_dir, true)?;
    writable("--runs-dir", &opts.runs_dir, true)
}

/// Whether `path` (a directory when `dir`, else a file) could be written: it is of the right
/// kind if it exists, and it — or the nearest ancestor that exists, in which it would be
/// created — is writable (`access(2)`: a read-only filesystem refuses root too).
fn writable(flag: &str, path: &std::path::Path, dir: bool) -> Result<(), Fatal> {
    let shown = path.display();
    if path.is_dir() != dir && path.exists() {
        let is = if dir { "a file, not a directory" } else { "a directory; give the file to write" };
        return Err(Fatal::usage(format!("{flag} {shown}: it is {is}")));
    }
    let mut at = if path.exists() { path.to_path_buf() } else { path.parent().map(std::path::Path::to_path_buf).unwrap_or_default() };
    while !at.as_os_str().is_empty() && !at.exists() {
        at = at.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    }
    if at.as_os_str().is_empty() {
        at = std::path::PathBuf::from(".");
    }
    if at != path && !at.is_dir() {
        return Err(Fatal::usage(format!("{flag} {shown}: {} is not a directory", at.display())));
    }
    let c =
        std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).map_err(|_| Fatal::usage(format!("{flag}: a path with a NUL byte")))?;
    // SAFETY: access(2) reads a NUL-terminated path we own.
    if unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(Fatal::usage(format!("{flag} {shown}: cannot write to {}: {e}", at.display())));
    }
    Ok(())
}

/// `--junit PATH`: the JUnit XML of the seeds run so far (parent directories created).
fn write_junit(path: Option<&std::path::Path>, profile: &Profile, cases: &[crate::report::Case]) -> Result<(), Fatal> {
    match path {
        Some(path) => write_junit_to(path, &crate::report::junit(&format!("shakedown {}", profile.name), cases)),
        None => Ok(()),
    }
}

/// Writes JUnit XML to `--junit PATH`, creating its directory.
fn write_junit_to(path: &std::path::Path, xml: &str) -> Result<(), Fatal> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Fatal::environment(format!("--junit {}: cannot create {}: {e}", path.display(), dir.display())))?;
    }
    std::fs::write(path, xml).map_err(|e| Fatal::environment(format!("--junit {}: cannot write it: {e}", path.display())))
}

/// The plan of `seed`, said out loud when it is shorter than the profile's steps: the ops the
/// profile allows ran out (`ops = ["crash"]` stops once `max_down` members are down). Said once
/// per process (a soak draws many seeds of one profile).
pub fn planned(seed: u64, profile: &Profile) -> shakedown_faults::Plan {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let plan = generate(seed, profile);
    if plan.ops.len() < profile.steps && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let allowed: Vec<String> =
            shakedown_faults::OpKind::ALL.into_iter().filter(|k| profile.allows(*k)).map(|k| k.to_string()).collect();
        tracing::warn!(
            "seed {seed}: the plan has {} of the {} steps asked for: after its last op none of the op kinds profile {} allows ({}) can run; allow the kinds that undo them (restart after crash, resume after pause, recover after isolate, …)",
            plan.ops.len(),
            profile.steps,
            profile.name,
            allowed.join(", ")
        );
    }
    plan
}

fn with_steps(mut p: Profile, steps: Option<usize>) -> Result<Profile, Fatal> {
    if let Some(s) = steps {
        if s == 0 {
            return Err(Fatal::usage("--steps must be at least 1"));
        }
        p.steps = s;
        p.validate().map_err(|e| Fatal::usage(format!("--steps {s}: {e}")))?;
    }
    Ok(p)
}

/// A seed for runs that were not given one. It is printed before anything runs.
pub fn draw_seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0) as u64;
    let mut x = nanos ^ ((std::process::id() as u64) << 32);
    // splitmix64 finaliser
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

/// Without RUST_LOG: shakedown's own progress, everyone's warnings, and not kube-client's
/// request trace layer, which logs every failed request at ERROR level ("failed with error
/// client error (Connect)") — shakedown reports those failures itself, with what it was doing —
/// nor kube-client's warnings that a watch stream ended ("eof in poll": an apiserver killed or
/// cut off under a watch, which the API workload's watchers resume and count), nor its
/// "Server cert bypassed" at every TLS handshake of a kubeconfig with `insecure-skip-tls-verify`
/// (shakedown says that once, when it connects).
const DEFAULT_LOG_FILTER: &str = "warn,shakedown=info,kube_client::client=error,kube_client::client::builder=off";

/// The usual way to execute: runs under `--runs-dir`, seed records written, progress shown.
fn exec<'a>(opts: &'a RunOpts, json_logs: bool, interrupt: &'a Interrupt) -> Exec<'a> {
    Exec {
        opts,
        json_logs,
        interrupt,
        runs_dir: &opts.runs_dir,
        record: true,
        verbose: true,
        bar: None,
        skip_liveness: false,
        replaying: None,
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    /// The CI templates (the GitHub reusable workflow and the GitLab component) are valid YAML with
    /// the three jobs for each target, publish JUnit, reports and seed records, pass inputs to
    /// scripts only through variables, and every shakedown command in them is a valid command line
    /// of this shakedown once the inputs' defaults are substituted.
    #[test]
    fn ci_templates_have_the_three_jobs_and_valid_shakedown_commands() {
        let script = r#"
import json, re, shlex, sys, yaml
class Loader(yaml.SafeLoader): pass
Loader.add_constructor('!reference', lambda l, n: l.construct_sequence(n))
text = open(sys.argv[1]).read()
inputs, problems = {}, []
if re.search(r'^spec:', text, re.M):
    # A GitLab component: the spec header, `---`, then the jobs with $[[ inputs.x ]].
    header, text = re.split(r'^---\s*$', text, maxsplit=1, flags=re.M)
    for k, v in yaml.load(header, Loader)['spec']['inputs'].items():
        inputs[k] = (v or {}).get('default', 'x')
    def interpolate(m):
        if m.group(1) not in inputs: problems.append('unknown input ' + m.group(1))
        v = inputs.get(m.group(1), 'x')
        return v if isinstance(v, str) else json.dumps(v)
    text = re.sub(r'\$\[\[\s*inputs\.([\w-]+)\s*\]\]', interpolate, text)
doc = yaml.load(text, Loader)
wf = (doc.get('on') or doc.get(True) or {}).get('workflow_call', {}) if 'jobs' in doc else {}
for k, v in (wf.get('inputs') or {}).items():
    inputs[k] = v.get('default', 'x')
jobs = doc.get('jobs') or {k: v for k, v in doc.items() if isinstance(v, dict) and ('script' in v or 'extends' in v)}
def expand(value):
    # What a variable holds: an input's default for ${{ inputs.x }}, a stand-in for anything else.
    m = re.fullmatch(r'\$\{\{\s*inputs\.([\w-]+)\s*\}\}', str(value))
    if m: return str(inputs.get(m.group(1), 'x'))
    return 'x' if value is None or '${{' in str(value) else str(value)
def resolve(job):
    # GitLab: extends merges the hidden jobs' variables, the job's own win.
    out = {}
    for parent in ([job.get('extends')] if isinstance(job.get('extends'), str) else job.get('extends') or []):
        out.update(resolve(doc.get(parent) or {}))
    out.update(job.get('variables') or {})
    return out
lines = []
for name, job in jobs.items():
    env = {k: expand(v) for k, v in {**(doc.get('env') or {}), **(doc.get('variables') or {}), **(job.get('env') or {}), **resolve(job)}.items()}
    blocks = []
    for s in job.get('steps', []):
        if '${{' in s.get('run', ''):
            problems.append(f'{name}: step {s.get("name")!r} has ${{{{ }}}} in run: (pass it through env:)')
        blocks.append((s.get('run', ''), {**env, **{k: expand(v) for k, v in (s.get('env') or {}).items()}}))
    for key in ('before_script', 'script', 'after_script'):
        for block in job.get(key) or []:
            if isinstance(block, str): blocks.append((block, env))
    for block, benv in blocks:
        for line in str(block).splitlines():
            m = re.search(r'(?:^|[\s"/])shakedown"? (.*?)(?:\|\||\| tee|;|$)', line)
            if m:
                cmd = re.sub(r'\$\{(\w+):\+([^}]*)\}', r'\2', m.group(1))
                cmd = re.sub(r'\$\{?(\w+)\}?', lambda g: benv.get(g.group(1)) or 'x', cmd)
                lines.append(shlex.split(cmd))
dump = yaml.safe_dump(doc)
print(json.dumps({"jobs": sorted(jobs), "commands": lines, "problems": problems, "junit": 'junit.xml' in dump, "seeds": 'shakedown-new-seeds' in dump, "runs": 'shakedown-runs' in dump}))
"#;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for (file, jobs, want) in [
            (
                "templates/shakedown.yml",
                vec![
                    ".shakedown-app",
                    ".shakedown-kube",
                    ".shakedown-local",
                    "shakedown:app:release-gate",
                    "shakedown:kube:nightly-soak",
                    "shakedown:kube:release-gate",
                    "shakedown:kube:replay-corpus",
                    "shakedown:local:nightly-soak",
                    "shakedown:local:release-gate",
                    "shakedown:local:replay-corpus",
                ],
                [
                    "soak --for",
                    "replay",
                    "soak --for",
                    "soak --target kube",
                    "replay",
                    "soak --target kube",
                    "reap",
                    "reap --kube",
                    "soak --target app",
                ],
            ),
            (
                ".github/workflows/shakedown.yml",
                vec![
                    "app-release-gate",
                    "check-inputs",
                    "kube-nightly-soak",
                    "kube-release-gate",
                    "kube-replay-corpus",
                    "local-nightly-soak",
                    "local-release-gate",
                    "local-replay-corpus",
                ],
                [
                    "soak --for",
                    "replay",
                    "soak --for",
                    "soak --target kube",
                    "replay",
                    "soak --target kube",
                    "reap",
                    "reap --kube",
                    "soak --target app",
                ],
            ),
        ] {
            let out = std::process::Command::new(crate::binaries::python())
                .arg("-c")
                .arg(script)
                .arg(root.join(file))
                .output()
                .expect("python3 with PyYAML");
            assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let found: Vec<&str> = v["jobs"].as_array().unwrap().iter().filter_map(|j| j.as_str()).collect();
            assert_eq!(found, jobs, "{file}");
            assert_eq!(v["problems"].as_array().unwrap().len(), 0, "{file}: {}", v["problems"]);
            assert!(
                v["junit"] == true && v["seeds"] == true && v["runs"] == true,
                "{file} publishes JUnit, run directories and seed records: {v}"
            );
            let commands: Vec<Vec<&str>> = v["commands"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect())
                .collect();
            let joined: Vec<String> = commands.iter().map(|c| c.join(" ")).collect();
            for w in want {
                assert!(joined.iter().any(|c| c.starts_with(w)), "{file}: no `shakedown {w} …` in {joined:#?}");
            }
            for args in &commands {
                if let Err(e) = Cli::try_parse_from(std::iter::once("shakedown").chain(args.iter().copied())) {
                    panic!("{file}: `shakedown {}` is not a valid command: {e}", args.join(" "));
                }
            }
        }
    }
}
