//! Volumes a pod of any user can write. The node's dynamic volumes come from
//! kube-controller-manager's hostPath provisioner, which makes each one a directory of mode 0750
//! owned by root: a pod running as another user (most databases' images do) cannot write its own
//! volume, and hostPath volumes take no `fsGroup`. The node's helper process on the host (the
//! one that serves `shakedown node forward`) opens each new volume directory to every user (0777)
//! as soon as it appears, as local-path provisioners do. It looks every [`POLL`]: a volume is made
//! long before a pod that mounts it runs (the claim is bound, the pod scheduled, its sandbox and
//! containers created first).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use super::layout::Layout;

/// Where the provisioner makes its volumes, inside the node's mount namespace.
pub const PROVISIONER_DIR: &str = "/tmp/hostpath_pv";
/// How often the directory is looked at.
const POLL: Duration = Duration::from_millis(100);
/// The mode the provisioner gives a new volume (`os.MkdirAll(path, 0750)`).
const PROVISIONED: u32 = 0o750;

/// Opens every volume directory in `dir` still at the provisioner's mode to every user; a
/// directory whose mode someone changed is left as it is. The directories opened.
pub fn open_new(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut opened = vec![];
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() && meta.permissions().mode() & 0o7777 == PROVISIONED {
            match std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o777)) {
                Ok(()) => opened.push(e.file_name().to_string_lossy().into_owned()),
                Err(err) => tracing::warn!("cannot open volume {} to every user: {err}", e.path().display()),
            }
        }
    }
    opened
}

/// Keeps opening the node's new volumes until the process ends (the node's teardown ends it).
pub async fn keep_open(l: &Layout) {
    let dir = l.host_path_dir(PROVISIONER_DIR);
    loop {
        for v in open_new(&dir) {
            tracing::info!("volume {v} opened to every user (0777)");
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_at_the_provisioners_mode_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |name: &str, mode: u32| {
            let p = dir.path().join(name);
            std::fs::create_dir(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let fresh = mk("pv-1", 0o750);
        let changed = mk("pv-2", 0o700);
        std::fs::write(dir.path().join("file"), "").unwrap();
        std::fs::set_permissions(dir.path().join("file"), std::fs::Permissions::from_mode(0o750)).unwrap();
        assert_eq!(open_new(dir.path()), ["pv-1"]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&fresh), 0o777);
        assert_eq!(mode(&changed), 0o700, "a mode someone chose is kept");
        assert_eq!(mode(&dir.path().join("file")), 0o750, "files are no volumes");
        assert!(open_new(dir.path()).is_empty(), "opened once");
        assert!(open_new(&dir.path().join("missing")).is_empty());
    }
}
