//! A run's Kubernetes PKI, made under `<dir>/api/`: a CA, a serving certificate per apiserver
//! (its address and the load balancer's or the host's forward), a service-account signing key,
//! and a token file with one admin token (group `system:masters`) and a token per component.
//! ECDSA P-256 keys, made with rcgen: no OpenSSL, milliseconds per certificate. Used by the local
//! target's control-plane stack and by the local node; every file is its owner's alone.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};

/// The machine could not make or write a part of the PKI (randomness, a key, a file).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct PkiError(pub String);

/// The port every apiserver (and the control-plane stack's API load balancer) listens on.
pub const API_PORT: u16 = 6443;
/// The etcd prefix of the apiservers' objects (kube-apiserver's default).
pub const ETCD_PREFIX: &str = "/registry";

/// The Services' addresses (ClusterIPs) of every apiserver shakedown runs.
pub const SERVICE_RANGE: &str = "10.96.0.0/24";
/// The `kubernetes` Service's ClusterIP: the first address of [`SERVICE_RANGE`].
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// What every apiserver of a run shares: the per-run CA, the service-account key, the tokens.
pub struct ApiPki {
    pub dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    /// The admin's bearer token.
    pub token: String,
}

impl ApiPki {
    /// Makes the run's CA, service-account key pair and token file under `run_dir/api`.
    pub fn create(run_dir: &Path, run_id: &str) -> Result<ApiPki, PkiError> {
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
    pub fn add_token(&self, user: &str, group: &str) -> Result<String, PkiError> {
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
    pub fn serving_cert(&self, name: &str, ip: Ipv4Addr, lb: Ipv4Addr) -> Result<(PathBuf, PathBuf), PkiError> {
        let dir = self.dir.join(name);
        let (c, k) = (dir.join("serving.crt"), dir.join("serving.key"));
        if c.is_file() && k.is_file() {
            return Ok((c, k));
        }
        let key = KeyPair::generate().map_err(|e| env(format!("cannot make {name}'s serving key: {e}")))?;
        let names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"];
        let mut params = CertificateParams::new(names.map(str::to_string).to_vec()).map_err(|e| env(e.to_string()))?;
        params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        // The `kubernetes` Service's address too: what a pod's in-cluster configuration dials.
        for a in [ip, lb, KUBERNETES_SERVICE_IP] {
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
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            // The machine's name, for `reap` and `leaks` to recognise the process.
            format!("--cert-dir={}", self.dir.join(name).display()),
        ]
    }
}

/// Every file of the PKI is its owner's alone (keys, the token file; the certificates too,
/// which costs nothing).
fn write(path: &Path, text: &str) -> Result<(), PkiError> {
    crate::private::write(path, text).map_err(|e| env(format!("cannot write {}: {e}", path.display())))
}

fn env(s: String) -> PkiError {
    PkiError(s)
}

fn random_hex(n: usize) -> Result<String, PkiError> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| env(format!("cannot read /dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
