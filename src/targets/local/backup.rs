//! Backups: a snapshot through etcd's maintenance API, verified (etcd appends the SHA-256 of the
//! database to the stream), and restore into fresh data directories with the version's own tool.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::LocalError;
use crate::command::{self, COMMAND_BOUND};

/// Checks a snapshot file: the last 32 bytes are the SHA-256 of everything before them.
pub fn verify(path: &Path) -> Result<u64, String> {
    let data = std::fs::read(path).map_err(|e| format!("cannot read backup {}: {e}", path.display()))?;
    if data.len() < 32 + 4096 {
        return Err(format!("backup {} is truncated ({} bytes)", path.display(), data.len()));
    }
    let (db, sum) = data.split_at(data.len() - 32);
    if Sha256::digest(db).as_slice() != sum {
        return Err(format!("backup {} is corrupt: its SHA-256 does not match its content", path.display()));
    }
    Ok(data.len() as u64)
}

/// Streams a snapshot from `client` into `path` (via a `.part` file), verified, within `limit`.
pub async fn take(client: &mut etcd_client::Client, path: &Path, limit: Duration) -> Result<u64, String> {
    let part = path.with_extension("db.part");
    let work = async {
        let mut stream = client.snapshot().await.map_err(|e| format!("snapshot: {e}"))?;
        let mut file = std::fs::File::create(&part).map_err(|e| format!("cannot create {}: {e}", part.display()))?;
        while let Some(msg) = stream.message().await.map_err(|e| format!("snapshot stream: {e}"))? {
            file.write_all(msg.blob()).map_err(|e| format!("cannot write {}: {e}", part.display()))?;
        }
        file.sync_all().map_err(|e| format!("cannot sync {}: {e}", part.display()))?;
        Ok::<(), String>(())
    };
    let res = match tokio::time::timeout(limit, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("snapshot did not finish within {}s", limit.as_secs())),
    };
    if let Err(e) = res {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    let size = verify(&part).inspect_err(|_| {
        let _ = std::fs::remove_file(&part);
    })?;
    std::fs::rename(&part, path).map_err(|e| format!("cannot rename {}: {e}", part.display()))?;
    Ok(size)
}

/// Restores `backup` into `data_dir` (which must not exist) as member `name` of a new cluster.
pub async fn restore_into(
    tool: &Path,
    backup: &Path,
    name: &str,
    cluster: &str,
    token: &str,
    peer_url: &str,
    data_dir: &Path,
) -> Result<(), LocalError> {
    let mut cmd = tokio::process::Command::new(tool);
    cmd.env("ETCDCTL_API", "3")
        .args(["snapshot", "restore"])
        .arg(backup)
        .args(["--name", name, "--initial-cluster", cluster, "--initial-cluster-token", token, "--initial-advertise-peer-urls", peer_url])
        .arg("--data-dir")
        .arg(data_dir);
    let out =
        command::run_cmd(cmd, &format!("{} snapshot restore", tool.display()), COMMAND_BOUND).await.map_err(LocalError::Environment)?;
    if !out.status.success() {
        return Err(LocalError::Stack(format!(
            "{} snapshot restore for {name} failed: {}",
            tool.display(),
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default()
        )));
    }
    Ok(())
}
