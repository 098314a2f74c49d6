//! Backups: a snapshot through etcd's maintenance API, verified (etcd appends the SHA-256 of the
//! database to the stream), and restore into fresh data directories with the version's own tool.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::LocalError;
use crate::command::{self, COMMAND_BOUND};

/// Why a backup could not be taken, or is not one to restore.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A file of the backup could not be read, created, written, synced or renamed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("backup {} is truncated ({len} bytes)", path.display())]
    Truncated { path: PathBuf, len: usize },
    #[error("backup {} is corrupt: its SHA-256 does not match its content", path.display())]
    Corrupt { path: PathBuf },
    /// etcd refused the snapshot.
    #[error("snapshot: {0}")]
    Snapshot(#[source] etcd_client::Error),
    /// The snapshot's stream broke.
    #[error("snapshot stream: {0}")]
    Stream(#[source] etcd_client::Error),
    #[error("snapshot did not finish within {}s", bound.as_secs())]
    Timeout { bound: Duration },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BackupError {
    let path = path.to_path_buf();
    move |source| BackupError::Io { action, path, source }
}

/// Checks a snapshot file: the last 32 bytes are the SHA-256 of everything before them.
pub fn verify(path: &Path) -> Result<u64, BackupError> {
    let data = std::fs::read(path).map_err(io("read backup", path))?;
    if data.len() < 32 + 4096 {
        return Err(BackupError::Truncated { path: path.to_path_buf(), len: data.len() });
    }
    let (db, sum) = data.split_at(data.len() - 32);
    if Sha256::digest(db).as_slice() != sum {
        return Err(BackupError::Corrupt { path: path.to_path_buf() });
    }
    Ok(data.len() as u64)
}

/// Streams a snapshot from `client` into `path` (via a `.part` file), verified, within `limit`.
pub async fn take(client: &mut etcd_client::Client, path: &Path, limit: Duration) -> Result<u64, BackupError> {
    let part = path.with_extension("db.part");
    let work = async {
        let mut stream = client.snapshot().await.map_err(BackupError::Snapshot)?;
        let mut file = std::fs::File::create(&part).map_err(io("create", &part))?;
        while let Some(msg) = stream.message().await.map_err(BackupError::Stream)? {
            file.write_all(msg.blob()).map_err(io("write", &part))?;
        }
        file.sync_all().map_err(io("sync", &part))?;
        Ok::<(), BackupError>(())
    };
    let res = match tokio::time::timeout(limit, work).await {
        Ok(r) => r,
        Err(_) => Err(BackupError::Timeout { bound: limit }),
    };
    if let Err(e) = res {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    let size = verify(&part).inspect_err(|_| {
        let _ = std::fs::remove_file(&part);
    })?;
    std::fs::rename(&part, path).map_err(io("rename", &part))?;
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
    let out = command::run_cmd(cmd, &format!("{} snapshot restore", tool.display()), COMMAND_BOUND).await?;
    if !out.status.success() {
        return Err(LocalError::Stack(format!(
            "{} snapshot restore for {name} failed: {}",
            tool.display(),
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default()
        )));
    }
    Ok(())
}
