//! A member's "disk": a sparse image file on a loop device with an ext4 filesystem mounted for
//! the member (as root), or a plain directory (without root).

use std::path::{Path, PathBuf};

use super::LocalError;
use crate::command::{self, run_bounded, COMMAND_BOUND, VERSION_BOUND};

/// Size of each sparse disk image. etcd preallocates 64 MiB WAL segments (two at a time).
pub const IMAGE_BYTES: u64 = 512 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskMode {
    /// Loop-mounted ext4 images (needs root).
    Loop,
    /// Plain directories (no root needed; disk faults unavailable).
    Plain,
}

impl DiskMode {
    /// Loop when running as root and `losetup` exists, plain otherwise (with the reason).
    pub fn detect() -> (DiskMode, Option<String>) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return (
                DiskMode::Plain,
                Some("not running as root: member data lives on plain directories and disk faults are unavailable".into()),
            );
        }
        if run_bounded("losetup", &["--version"], VERSION_BOUND).is_err() {
            return (DiskMode::Plain, Some("losetup not found (apt-get install mount): member data lives on plain directories".into()));
        }
        (DiskMode::Loop, None)
    }
}

#[derive(Debug, Clone)]
pub enum Disk {
    Loop { image: PathBuf, device: String, mount: PathBuf },
    Plain { dir: PathBuf },
}

/// Runs a command (async, bounded by [`COMMAND_BOUND`], killed if the caller gives up),
/// returning its stdout or an environment error with its stderr.
pub async fn run_cmd(program: &str, args: &[&str]) -> Result<String, LocalError> {
    stdout_of(program, args, command::run(program, args, COMMAND_BOUND).await)
}

/// [`run_cmd`] for code that cannot await (teardown from `Drop`, `reap`).
pub fn run_cmd_sync(program: &str, args: &[&str]) -> Result<String, LocalError> {
    stdout_of(program, args, run_bounded(program, args, COMMAND_BOUND))
}

fn stdout_of(program: &str, args: &[&str], out: Result<std::process::Output, command::CommandError>) -> Result<String, LocalError> {
    let out = out?;
    if !out.status.success() {
        return Err(LocalError::Environment(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Disk {
    /// Creates the disk `name` under `run_dir`: `disks/<name>.img` mounted on `members/<name>`.
    pub async fn create(run_dir: &Path, name: &str, mode: DiskMode) -> Result<Disk, LocalError> {
        let mount = run_dir.join("members").join(name);
        std::fs::create_dir_all(&mount).map_err(|e| LocalError::Environment(format!("cannot create {}: {e}", mount.display())))?;
        let disk = match mode {
            DiskMode::Plain => Disk::Plain { dir: mount },
            DiskMode::Loop => {
                let image = run_dir.join("disks").join(format!("{name}.img"));
                std::fs::create_dir_all(image.parent().expect("has a parent"))
                    .and_then(|_| std::fs::File::create(&image))
                    .and_then(|f| f.set_len(IMAGE_BYTES))
                    .map_err(|e| LocalError::Environment(format!("cannot create disk image {}: {e}", image.display())))?;
                let img = image.to_string_lossy().to_string();
                let device = run_cmd("losetup", &["--find", "--show", &img]).await?;
                let disk = Disk::Loop { image, device: device.clone(), mount: mount.clone() };
                let mut made =
                    run_cmd("mkfs.ext4", &["-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", &device]).await;
                if made.is_ok() {
                    made = run_cmd("mount", &["-o", "noatime,noinit_itable", &device, &mount.to_string_lossy()]).await;
                }
                if let Err(e) = made {
                    disk.release();
                    return Err(e);
                }
                disk
            }
        };
        let data = disk.data_dir();
        let made = std::fs::create_dir_all(&data)
            .and_then(|_| std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o700)));
        if let Err(e) = made {
            disk.release();
            return Err(LocalError::Environment(format!("cannot create {}: {e}", data.display())));
        }
        Ok(disk)
    }

    /// Unmounts (lazily if it must), checks (e2fsck -p: fixes what is safe) and mounts again.
    pub async fn remount(&self) -> Result<(), LocalError> {
        let Disk::Loop { device, mount, .. } = self else { return Ok(()) };
        let m = mount.to_string_lossy().to_string();
        if is_mounted(mount) && run_cmd("umount", &[&m]).await.is_err() {
            run_cmd("umount", &["-l", &m]).await?;
        }
        // e2fsck exits 1 when it fixed something; 4 and up mean it could not.
        let out = command::run("e2fsck", &["-p", device], COMMAND_BOUND).await?;
        if out.status.code().is_none_or(|c| c >= 4) {
            return Err(LocalError::Stack(format!(
                "e2fsck {device} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim()
            )));
        }
        run_cmd("mount", &["-o", "noatime,noinit_itable", device, &m]).await?;
        Ok(())
    }

    /// The member's etcd data directory.
    pub fn data_dir(&self) -> PathBuf {
        match self {
            Disk::Loop { mount, .. } => mount.join("data"),
            Disk::Plain { dir } => dir.join("data"),
        }
    }

    /// Unmounts, detaches and deletes. Best effort and idempotent: every failure is logged and
    /// the rest still runs (`reap` sweeps whatever remains).
    pub fn release(&self) {
        match self {
            Disk::Loop { image, device, mount } => {
                if is_mounted(mount) {
                    if let Err(e) = run_cmd_sync("umount", &[&mount.to_string_lossy()]) {
                        tracing::warn!("{e}; unmounting lazily");
                        let _ = run_cmd_sync("umount", &["-l", &mount.to_string_lossy()]);
                    }
                }
                if loop_backing(device).is_some_and(|b| b == *image) {
                    if let Err(e) = run_cmd_sync("losetup", &["-d", device]) {
                        tracing::warn!("{e}");
                    }
                }
                let _ = std::fs::remove_file(image);
                let _ = std::fs::remove_dir_all(mount);
            }
            Disk::Plain { dir } => {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// Whether `path` is a mount point now (from /proc/mounts).
pub fn is_mounted(path: &Path) -> bool {
    mounts_under(path).iter().any(|m| m == path)
}

/// Mount points at or under `root`, deepest first.
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(root))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// The backing file of a loop device, from sysfs.
pub fn loop_backing(device: &str) -> Option<PathBuf> {
    let name = device.rsplit('/').next()?;
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim().trim_end_matches(" (deleted)")))
}

/// Loop devices whose backing file lies under `root`.
pub fn loops_under(root: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return vec![] };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("loop"))
        .map(|n| format!("/dev/{n}"))
        .filter(|d| loop_backing(d).is_some_and(|b| b.starts_with(root)))
        .collect()
}

/// `FS_IOC_SHUTDOWN` = `_IOR('X', 125, __u32)`.
const FS_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587D;
/// Freeze the filesystem (every dirty page and the journal written), then shut it down.
///
/// Not `FS_GOING_FLAGS_NOLOGFLUSH` (2) or `LOGFLUSH` (1): with those, ext4 can drop the
/// unwritten→written conversion of a preallocated WAL block whose `fdatasync` had already
/// returned, so the member restarts on its own data without entries it acknowledged (about 2–4 %
/// of detaches on etcd 3.4.23, 3.5.1 and 3.5.16). That breaks the fsync contract, which no real
/// disk loss or power cut can do: an artifact of the fault, not etcd's defect. DEFAULT lost none
/// in 655 detaches (docs/findings.md, finding 2, experiments C and D).
const FS_GOING_FLAGS_DEFAULT: u32 = 0;

/// Shuts down the filesystem mounted at `mount`: from now on every read and write fails with EIO.
/// What `fsync`/`fdatasync` acknowledged before the call stays on the device (see
/// [`FS_GOING_FLAGS_DEFAULT`]); what was not synced may or may not be there, as after a real
/// detach.
pub fn shutdown(mount: &Path) -> Result<(), LocalError> {
    use std::os::unix::io::AsRawFd;
    let dir = std::fs::File::open(mount).map_err(|e| LocalError::Environment(format!("cannot open {}: {e}", mount.display())))?;
    let flags: u32 = FS_GOING_FLAGS_DEFAULT;
    // SAFETY: FS_IOC_SHUTDOWN reads one u32 from the pointer; `flags` lives across the call.
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), FS_IOC_SHUTDOWN as _, &flags as *const u32) };
    if rc != 0 {
        return Err(LocalError::Environment(format!("FS_IOC_SHUTDOWN on {} failed: {}", mount.display(), std::io::Error::last_os_error())));
    }
    Ok(())
}
