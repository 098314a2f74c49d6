//! The `control-plane` stack's apiservers: per machine, a kube-apiserver that talks to the etcd
//! member on its machine only (kubeadm's stacked topology: `--etcd-servers` is the local
//! member), behind HAProxy as the API load balancer (health check `GET /readyz`).
//!
//! Everything an apiserver needs is made per run under `<run dir>/api/` by [`ApiPki`] (shared
//! with the local node's apiserver).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;

pub use crate::pki::ApiPki;

pub use crate::pki::{API_PORT, ETCD_PREFIX};
/// The namespace the API workload writes in (created at bring-up).
pub const WORKLOAD_NAMESPACE: &str = "shakedown";

/// The machine an apiserver process belongs to, from its command line (`--cert-dir=<run>/api/<m>`).
pub fn machine_of(cmdline: &str) -> Option<String> {
    let dir = cmdline.split("--cert-dir=").nth(1)?.split_whitespace().next()?;
    Path::new(dir).file_name().map(|n| n.to_string_lossy().to_string())
}

/// The load balancer's address for run slot `slot`.
pub fn lb_addr(slot: u8) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(127, slot, 0, 1), API_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        crate::private::mode(p).unwrap()
    }

    /// A run's PKI — the CA, the service-account signing key, the token file with the admin's
    /// token, each serving key, the kubeconfig — is readable by its owner alone, in a run
    /// directory only its owner may enter.
    #[test]
    fn the_run_pki_is_readable_by_its_owner_alone() {
        let runs = tempfile::tempdir().unwrap();
        let run_dir = crate::cli::session::create_run_dir(runs.path(), "sd-modes").unwrap();
        assert_eq!(mode(&run_dir), 0o700, "the run directory");
        let pki = ApiPki::create(&run_dir, "sd-modes").unwrap();
        pki.add_token("someone", "").unwrap();
        let (cert, key) = pki.serving_cert("m0", Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2)).unwrap();
        assert_eq!(mode(&pki.dir), 0o700, "{}", pki.dir.display());
        assert_eq!(mode(key.parent().unwrap()), 0o700);
        for f in [pki.dir.join("sa.key"), pki.dir.join("tokens.csv"), pki.dir.join("ca.crt"), key, cert] {
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
    }
}
