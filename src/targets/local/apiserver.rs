//! The `control-plane` stack's apiservers: per machine, a kube-apiserver that talks to the etcd
//! member on its machine only (kubeadm's stacked topology: `--etcd-servers` is the local
//! member), behind HAProxy as the API load balancer (health check `GET /readyz`).
//!
//! Everything an apiserver needs is made per run under `<run dir>/api/`: a CA, a serving
//! certificate per apiserver (its address and the load balancer's), a service-account signing
//! key, and a token file with one admin token (group `system:masters`). ECDSA P-256 keys, made
//! with rcgen: no OpenSSL, milliseconds per certificate.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};

use super::LocalError;

/// The port every apiserver and the API load balancer listen on.
pub const API_PORT: u16 = 6443;
/// The etcd prefix of the apiservers' objects (kube-apiserver's default).
pub const ETCD_PREFIX: &str = "/registry";
/// The namespace the API workload writes in (created at bring-up).
pub const WORKLOAD_NAMESPACE: &str = "shakedown";

/// What every apiserver of a run shares: the per-run CA, the service-account key, the tokens.
pub struct ApiPki {
    pub dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    /// The admin's bearer token.
    pub token: String,
}

impl ApiPki {
    /// Makes the run's CA, service-account key pair and token file under `run_dir/api`.
    pub fn create(run_dir: &Path, run_id: &str) -> Result<ApiPki, LocalError> {
        let dir = run_dir.join("api");
        crate::private::dir(&dir).map_err(|e| env(format!("cannot create {}: {e}", dir.display())))?;
        let ca_key = KeyPair::generate().map_err(|e| env(format!("cannot make the run's CA key: {e}")))?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| env(e.to_string()))?;
        params.distinguished_name.push(DnType::CommonName, format!("shakedown {run_id} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = params.self_signed(&ca_key).map_err(|e| env(format!("cannot sign the run's CA: {e}")))?;
        write(&dir.join("ca.crt"), &ca_cert.pem())?;
        let sa = KeyPair::generate().map_err(|e| env(format!("cannot make the service-account key: {e}")))?;
        write(&dir.join("sa.key"), &sa.serialize_pem())?;
        write(&dir.join("sa.pub"), &sa.public_key_pem())?;
        let token = random_hex(16)?;
        write(&dir.join("tokens.csv"), &format!("{token},shakedown-admin,shakedown-admin,\"system:masters\"\n"))?;
        let ca = Issuer::new(params, ca_key);
        Ok(ApiPki { dir, ca, token })
    }

    /// Adds a user with a bearer token of its own (`group`: empty for none) to the token file
    /// (read by an apiserver at its start): the token.
    pub fn add_token(&self, user: &str, group: &str) -> Result<String, LocalError> {
        use std::io::Write;
        let token = random_hex(16)?;
        let path = self.dir.join("tokens.csv");
        let mut f =
            std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| env(format!("cannot open {}: {e}", path.display())))?;
        let groups = if group.is_empty() { String::new() } else { format!(",\"{group}\"") };
        writeln!(f, "{token},{user},{user}{groups}").map_err(|e| env(format!("cannot write {}: {e}", path.display())))?;
        Ok(token)
    }

    /// The CA certificate clients verify the apiservers with.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The serving certificate of the apiserver of machine `name` at `ip`, also valid for the
    /// load balancer's address — made the first time, kept for its restarts: `(cert, key)` paths.
    pub fn serving_cert(&self, name: &str, ip: Ipv4Addr, lb: Ipv4Addr) -> Result<(PathBuf, PathBuf), LocalError> {
        let dir = self.dir.join(name);
        let (c, k) = (dir.join("serving.crt"), dir.join("serving.key"));
        if c.is_file() && k.is_file() {
            return Ok((c, k));
        }
        let key = KeyPair::generate().map_err(|e| env(format!("cannot make {name}'s serving key: {e}")))?;
        let mut params = CertificateParams::new(vec!["kubernetes".to_string(), "kubernetes.default".to_string(), "localhost".to_string()])
            .map_err(|e| env(e.to_string()))?;
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        for a in [ip, lb] {
            params.subject_alt_names.push(SanType::IpAddress(a.into()));
        }
        let cert = params.signed_by(&key, &self.ca).map_err(|e| env(format!("cannot sign {name}'s serving certificate: {e}")))?;
        crate::private::dir(&dir).map_err(|e| env(format!("cannot create {}: {e}", dir.display())))?;
        write(&c, &cert.pem())?;
        write(&k, &key.serialize_pem())?;
        Ok((c, k))
    }

    /// kube-apiserver's flags for machine `name` at `ip` with its local member at `etcd`.
    pub fn flags(&self, name: &str, ip: Ipv4Addr, etcd: &str, cert: &Path, key: &Path) -> Vec<String> {
        let p = |f: &str| self.dir.join(f).display().to_string();
        vec![
            format!("--etcd-servers={etcd}"),
            format!("--etcd-prefix={ETCD_PREFIX}"),
            format!("--bind-address={ip}"),
            format!("--advertise-address={ip}"),
            format!("--secure-port={API_PORT}"),
            "--insecure-port=0".into(),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-private-key-file={}", key.display()),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            // The machine's name, for `reap` and `leaks` to recognise the process.
            format!("--cert-dir={}", self.dir.join(name).display()),
        ]
    }
}

/// The machine an apiserver process belongs to, from its command line (`--cert-dir=<run>/api/<m>`).
pub fn machine_of(cmdline: &str) -> Option<String> {
    let dir = cmdline.split("--cert-dir=").nth(1)?.split_whitespace().next()?;
    Path::new(dir).file_name().map(|n| n.to_string_lossy().to_string())
}

/// The load balancer's address for run slot `slot`.
pub fn lb_addr(slot: u8) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::new(127, slot, 0, 1), API_PORT)
}

/// Every file of the PKI is its owner's alone (keys, the token file; the certificates too,
/// which costs nothing).
fn write(path: &Path, text: &str) -> Result<(), LocalError> {
    crate::private::write(path, text).map_err(|e| env(format!("cannot write {}: {e}", path.display())))
}

fn env(s: String) -> LocalError {
    LocalError::Environment(s)
}

fn random_hex(n: usize) -> Result<String, LocalError> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| env(format!("cannot read /dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
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
