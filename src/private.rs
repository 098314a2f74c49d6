//! Files and directories only their owner may read. A run directory is 0700, and what is secret
//! in it (the per-run PKI's keys, the token file, kubeconfigs: the admin token of a stack that
//! runs while others share the machine) is written 0600 from the start, never widened later.

use std::fs::{OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and its parents, with the default mode) and makes it 0700.
pub fn dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, Permissions::from_mode(0o700))
}

/// The permission bits of `path` (`0o600`).
pub fn mode(path: &Path) -> std::io::Result<u32> {
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
}

/// Writes `contents` to `path`, readable by its owner only (an existing file is narrowed to 0600
/// before it is truncated and written).
pub fn write(path: &Path, contents: impl AsRef<[u8]>) -> std::io::Result<()> {
    let mut f = OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(path)?;
    f.set_permissions(Permissions::from_mode(0o600))?;
    f.set_len(0)?;
    f.write_all(contents.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        super::mode(p).unwrap()
    }

    #[test]
    fn private_files_and_directories_are_their_owners_alone() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        let f = d.join("key");
        std::fs::write(&f, "old, world-readable").unwrap();
        std::fs::set_permissions(&f, Permissions::from_mode(0o644)).unwrap();
        write(&f, "secret").unwrap();
        assert_eq!((mode(&f), std::fs::read_to_string(&f).unwrap().as_str()), (0o600, "secret"));
        let g = d.join("new");
        write(&g, "x").unwrap();
        assert_eq!(mode(&g), 0o600);
    }
}
