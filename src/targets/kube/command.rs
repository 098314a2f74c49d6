//! Hooks' and probes' plumbing: a command with a timeout, an HTTP(S) GET.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Empty;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Why an HTTP(S) prober could not be made, or a GET got no (2xx) answer.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// TLS could not be set up (rustls refused the configuration).
    #[error("{0}")]
    Tls(#[source] rustls::Error),
    /// The CA file cannot be read.
    #[error("cannot read the CA file {}: {source}", path.display())]
    CaRead {
        path: std::path::PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The CA file holds something that is not a usable certificate.
    #[error("CA file {}: {detail}", path.display())]
    CaFile { path: std::path::PathBuf, detail: String },
    #[error("CA file {} holds no PEM certificate", path.display())]
    CaEmpty { path: std::path::PathBuf },
    #[error("cannot load the system's trusted roots: {0}")]
    SystemRoots(#[source] rustls::Error),
    #[error("invalid URL: {0}")]
    InvalidUrl(#[source] http::uri::InvalidUri),
    #[error(transparent)]
    Request(#[from] http::Error),
    /// The request got no answer (the error with its causes: refused, a certificate error …).
    #[error("{}", error_chain(.0))]
    Unreachable(#[source] hyper_util::client::legacy::Error),
    #[error("no answer within {}ms", bound.as_millis())]
    Timeout { bound: Duration },
    /// An answer that is not 2xx.
    #[error("status {}", http::StatusCode::from_u16(*.0).map(|s| s.to_string()).unwrap_or_else(|_| .0.to_string()))]
    Status(u16),
}

/// The result of a command with a timeout.
pub struct CommandResult {
    pub exit: Option<i32>,
    pub ms: u64,
    pub stdout: String,
    pub stderr: String,
    /// `None` when it exited 0 in time.
    pub error: Option<String>,
}

pub async fn run_command(cmd: &[String], env: &[(String, String)], timeout: Duration) -> CommandResult {
    let t0 = std::time::Instant::now();
    let Some((prog, args)) = cmd.split_first() else {
        return CommandResult { exit: None, ms: 0, stdout: String::new(), stderr: String::new(), error: Some("empty command".into()) };
    };
    let mut c = tokio::process::Command::new(prog);
    c.args(args).envs(env.iter().cloned()).stdin(std::process::Stdio::null()).kill_on_drop(true);
    let tail = |b: &[u8]| {
        let s = String::from_utf8_lossy(b);
        let s = s.trim();
        if s.len() > 4000 {
            s[s.len() - 4000..].to_string()
        } else {
            s.to_string()
        }
    };
    match tokio::time::timeout(timeout, c.output()).await {
        Err(_) => CommandResult {
            exit: None,
            ms: t0.elapsed().as_millis() as u64,
            stdout: String::new(),
            stderr: String::new(),
            error: Some(format!("no exit within {}s (killed)", timeout.as_secs())),
        },
        Ok(Err(e)) => CommandResult {
            exit: None,
            ms: t0.elapsed().as_millis() as u64,
            stdout: String::new(),
            stderr: String::new(),
            error: Some(format!("cannot run {prog}: {e}")),
        },
        Ok(Ok(out)) => {
            let code = out.status.code();
            let (stdout, stderr) = (tail(&out.stdout), tail(&out.stderr));
            let error = (!out.status.success()).then(|| {
                format!(
                    "exit {} ({})",
                    code.map_or("by signal".into(), |c| c.to_string()),
                    if stderr.is_empty() { &stdout } else { &stderr }
                )
            });
            CommandResult { exit: code, ms: t0.elapsed().as_millis() as u64, stdout, stderr, error }
        }
    }
}

/// An HTTP(S) client for one probe, built once when the target connects (rustls on ring, the TLS
/// stack kube's client uses): the system's roots by default (the platform verifier, as kube's
/// client), the CA bundle of `ca_file` instead when given, or no verification with `insecure`.
pub struct HttpProber {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

/// What a server answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// The body's first 4 KiB, lossily decoded.
    pub body: String,
}

impl HttpProber {
    pub fn new(ca_file: Option<&Path>, insecure: bool) -> Result<HttpProber, ProbeError> {
        HttpProber::build(ca_file, insecure, true)
    }

    /// A prober that opens a new connection for every request (a paused server then shows as
    /// one that does not answer, not as a pooled connection that hangs).
    pub fn fresh_connections(ca_file: Option<&Path>, insecure: bool) -> Result<HttpProber, ProbeError> {
        HttpProber::build(ca_file, insecure, false)
    }

    fn build(ca_file: Option<&Path>, insecure: bool, pool: bool) -> Result<HttpProber, ProbeError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder =
            rustls::ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().map_err(ProbeError::Tls)?;
        let config = match (ca_file, insecure) {
            (_, true) => builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))).with_no_client_auth(),
            (Some(path), false) => {
                let mut roots = rustls::RootCertStore::empty();
                let certs =
                    CertificateDer::pem_file_iter(path).map_err(|source| ProbeError::CaRead { path: path.to_path_buf(), source })?;
                let bad = |detail: String| ProbeError::CaFile { path: path.to_path_buf(), detail };
                for cert in certs {
                    let cert = cert.map_err(|e| bad(e.to_string()))?;
                    roots.add(cert).map_err(|e| bad(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(ProbeError::CaEmpty { path: path.to_path_buf() });
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
            (None, false) => {
                let verifier = rustls_platform_verifier::Verifier::new(provider).map_err(ProbeError::SystemRoots)?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth()
            }
        };
        let https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_or_http().enable_http1().build();
        let mut b = Client::builder(TokioExecutor::new());
        if !pool {
            b.pool_max_idle_per_host(0);
        }
        Ok(HttpProber { client: b.build(https) })
    }

    /// GET `url`; `Ok` on a 2xx answer within `timeout`.
    pub async fn get(&self, url: &str, timeout: Duration) -> Result<(), ProbeError> {
        match self.answer(url, timeout).await? {
            a if (200..300).contains(&a.status) => Ok(()),
            a => Err(ProbeError::Status(a.status)),
        }
    }

    /// GET `url`: what the server answered within `timeout` (status and body), or why there
    /// was no answer.
    pub async fn answer(&self, url: &str, timeout: Duration) -> Result<Answer, ProbeError> {
        let uri: http::Uri = url.parse().map_err(ProbeError::InvalidUrl)?;
        let req = http::Request::get(uri).body(Empty::new())?;
        let fetch = async {
            let r = self.client.request(req).await.map_err(ProbeError::Unreachable)?;
            let status = r.status().as_u16();
            let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(r.into_body(), 64 * 1024))
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let body = String::from_utf8_lossy(&body[..body.len().min(4096)]).to_string();
            Ok::<Answer, ProbeError>(Answer { status, body })
        };
        match tokio::time::timeout(timeout, fetch).await {
            Err(_) => Err(ProbeError::Timeout { bound: timeout }),
            Ok(r) => r,
        }
    }
}

/// An error with its causes (hyper-util's legacy client says only "client error (Connect)";
/// the cause says "Connection refused", a certificate error, a proxy's answer).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        // Wrappers often print their source already ("ServiceError: client error (Connect)").
        let t = c.to_string();
        if !s.ends_with(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// `insecure = true`: any serving certificate is accepted, but the handshake's signatures are
/// still checked (with the provider's algorithms), so the connection is TLS, unauthenticated.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_chain_names_every_cause_once() {
        let refused = E("tcp connect error", Some(Box::new(E("Connection refused (os error 111)", None))));
        let e = E("ServiceError: client error (Connect)", Some(Box::new(E("client error (Connect)", Some(Box::new(refused))))));
        assert_eq!(error_chain(&e), "ServiceError: client error (Connect): tcp connect error: Connection refused (os error 111)");
    }
}
