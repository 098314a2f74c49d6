//! `shakedown node up|status|down`: a real single-node Kubernetes cluster on this machine, by hand.

use std::path::{Path, PathBuf};

use crate::exit::{Exit, Fatal};
use crate::node::{cleanup, layout::Layout, Node, NodeBinaries, NodeOptions};
use k8s_openapi::api::core::v1::{Node as KNode, Pod};
use kube::api::Api;

use super::session::{create_run_dir, new_run_id};
use super::NodeAction;

fn current_node(runs_dir: &Path) -> Result<PathBuf, Fatal> {
    let ptr = runs_dir.join("current-node");
    let dir = std::fs::read_to_string(&ptr)
        .map_err(|_| Fatal::usage(format!("no node is up (no {}): start one with `shakedown node up`", ptr.display())))?;
    Ok(PathBuf::from(dir.trim()))
}

/// The layout of the node `node up` left running in `runs_dir`.
fn current_layout(runs_dir: &Path) -> Result<Layout, Fatal> {
    let dir = current_node(runs_dir)?;
    Layout::load(&dir.join("node")).ok_or_else(|| Fatal::usage(format!("{} holds no node (no node/node.json)", dir.display())))
}

fn mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
}

pub async fn node(action: NodeAction) -> Result<Exit, Fatal> {
    match action {
        NodeAction::Up { runs_dir, set_kernel_tunables, workers } => {
            if let Ok(dir) = current_node(&runs_dir) {
                if dir.join("node/node.json").exists() {
                    return Err(Fatal::usage(format!("a node is already up in {}: `shakedown node down` first", dir.display())));
                }
            }
            let bins = NodeBinaries::find()?;
            let run_id = new_run_id();
            let run_dir = create_run_dir(&runs_dir, &run_id)?;
            let node = Node::up(&run_id, &run_dir, &bins, &NodeOptions { set_kernel_tunables, workers })
                .await
                .map_err(|e| Fatal::environment(format!("cannot bring the node up: {e}")))?;
            std::fs::write(runs_dir.join("current-node"), run_dir.to_string_lossy().as_bytes())
                .map_err(|e| Fatal::environment(e.to_string()))?;
            let mem = node.memory();
            let text = [
                format!(
                    "node {} Ready in {:.1}s (Kubernetes {}) in {}",
                    node.layout.node_name,
                    node.ready_ms as f64 / 1000.0,
                    bins.version,
                    run_dir.display()
                ),
                format!(
                    "nodes       {}",
                    node.layout
                        .members()
                        .iter()
                        .map(|m| format!("{} ({}{})", m.node_name, m.ip, if m.index == 0 { ", control plane" } else { "" }))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                format!("kubeconfig  {}", node.kubeconfig.display()),
                format!(
                    "apiserver   {} (forwarded into the node's network namespace, where it is {})",
                    node.layout.host_server(),
                    node.layout.server()
                ),
                format!(
                    "pod network {}/24 on bridge {}, inside the node's network namespace (the host's network is untouched)",
                    node.layout.net.subnet(),
                    node.layout.bridge
                ),
                format!(
                    "policies    NetworkPolicy enforced by the node's engine (shakedown node policy-agent; log {})",
                    node.layout.logs().join("policy-agent.log").display()
                ),
                format!(
                    "memory      {} ({})",
                    mib(mem.values().sum()),
                    mem.iter().map(|(k, v)| format!("{k} {}", mib(*v))).collect::<Vec<_>>().join(", ")
                ),
                format!(
                    "images      {}, {}, {} (imagePullPolicy: Never)",
                    crate::node::config::PAUSE_IMAGE,
                    crate::node::config::BUSYBOX_IMAGE,
                    crate::node::config::ETCD_IMAGE
                ),
                format!("try: kubectl --kubeconfig {} get nodes", node.kubeconfig.display()),
            ];
            // Left running before anything is printed: a closed stdout must not take it down.
            node.detach();
            for line in text {
                println!("{line}");
            }
            Ok(Exit::Pass)
        }
        NodeAction::Status { runs_dir } => {
            let layout = current_layout(&runs_dir)?;
            let client = crate::node::admin_client(&layout.admin_kubeconfig()).await.map_err(|e| Fatal::environment(e.to_string()))?;
            let nodes: Api<KNode> = Api::all(client.clone());
            let listed = match tokio::time::timeout(std::time::Duration::from_secs(10), nodes.list(&Default::default())).await {
                Ok(Ok(l)) => l.items,
                Ok(Err(e)) => return Err(Fatal::environment(format!("the node's apiserver {}: {e}", layout.host_server()))),
                Err(_) => {
                    return Err(Fatal::environment(format!("the node's apiserver {} did not answer within 10s", layout.host_server())))
                }
            };
            let ready_of = |name: &str| {
                listed
                    .iter()
                    .find(|n| n.metadata.name.as_deref() == Some(name))
                    .and_then(|n| n.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").map(|c| c.status == "True"))
                    .unwrap_or(false)
            };
            let members = layout.members();
            let ready = members.iter().all(|m| ready_of(&m.node_name));
            let pods: Api<Pod> = Api::all(client);
            let pods = pods.list(&Default::default()).await.map(|l| l.items.len()).unwrap_or(0);
            let mem = cleanup::memory(&layout);
            println!(
                "node {} {} · {pods} pods · memory {} · guard dropped {} packets",
                layout.node_name,
                if ready { "Ready" } else { "NOT Ready" },
                mib(mem.values().sum()),
                cleanup::guard_drops(&layout)
            );
            if members.len() > 1 {
                for m in &members {
                    println!("  {} {} ({})", m.node_name, if ready_of(&m.node_name) { "Ready" } else { "NOT Ready" }, m.ip);
                }
            }
            println!("{}", crate::node::netpol::describe(&layout));
            match crate::node::ctr() {
                Ok(ctr) => match crate::node::images::list(&ctr, &layout.containerd_socket()).await {
                    Ok(names) => println!("images     {} (load more with `shakedown node load ARCHIVE`)", names.join(", ")),
                    Err(e) => println!("images     unknown: {e}"),
                },
                Err(e) => println!("images     unknown: {e}"),
            }
            println!("kubeconfig {}", layout.admin_kubeconfig().display());
            Ok(if ready { Exit::Pass } else { Exit::Liveness })
        }
        NodeAction::Load { runs_dir, base_name, archives } => {
            // Every archive is checked before any is loaded: a typo does not leave half of a
            // list imported.
            for a in &archives {
                match std::fs::metadata(a) {
                    Ok(m) if m.is_file() => {}
                    Ok(_) => {
                        return Err(Fatal::usage(format!(
                            "{} is not a file: give an image archive (`docker save -o FILE IMAGE`)",
                            a.display()
                        )))
                    }
                    Err(e) => return Err(Fatal::usage(format!("cannot read {}: {e}", a.display()))),
                }
            }
            let layout = current_layout(&runs_dir)?;
            let ctr = crate::node::ctr()?;
            for a in &archives {
                let t0 = std::time::Instant::now();
                // Into every member's containerd: a pod may land on any node.
                let mut names = vec![];
                for m in layout.members() {
                    names =
                        crate::node::images::import(&ctr, &m.containerd_socket(), a, base_name.as_deref()).await.map_err(|e| match e {
                            crate::node::images::LoadError::NotAnImage { .. } => Fatal::usage(e.to_string()),
                            crate::node::images::LoadError::Node(e) => {
                                Fatal::environment(format!("cannot load {} into {}: {e}", a.display(), m.node_name))
                            }
                        })?;
                }
                if names.is_empty() {
                    println!(
                        "{}: loaded in {:.1}s, no tagged image in it (pods can name it only by digest)",
                        a.display(),
                        t0.elapsed().as_secs_f64()
                    );
                } else {
                    println!("{}: loaded {} in {:.1}s", a.display(), names.join(", "), t0.elapsed().as_secs_f64());
                }
                if base_name.is_none() && names.iter().any(|n| n.starts_with("import-")) {
                    println!("  (the archive named only a tag: give its images a name with --base-name NAME)");
                }
            }
            Ok(Exit::Pass)
        }
        NodeAction::PolicyAgent { node_dir } => {
            crate::node::netpol::agent(&node_dir).await.map_err(|e| Fatal::environment(e.to_string()))?;
            Ok(Exit::Pass)
        }
        NodeAction::Forward { node_dir, netns } => {
            crate::node::forward::run(&node_dir, &netns).await.map_err(|e| Fatal::environment(e.to_string()))?;
            Ok(Exit::Pass)
        }
        NodeAction::Down { runs_dir } => {
            let layout = current_layout(&runs_dir)?;
            let t0 = std::time::Instant::now();
            let left = cleanup::sweep(&layout);
            let _ = std::fs::remove_file(runs_dir.join("current-node"));
            if left.is_empty() {
                println!("node {} down in {:.1}s: nothing left behind", layout.node_name, t0.elapsed().as_secs_f64());
                Ok(Exit::Pass)
            } else {
                Err(Fatal::environment(format!("node {} down, but left behind: {left}", layout.node_name)))
            }
        }
    }
}
