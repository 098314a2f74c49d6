//! etcd of a workload cluster read the way Cluster API reads it (`[etcd]` in the kube profile):
//! the etcd CA in the Cluster's `<cluster>-etcd` Secret signs a client certificate of the run,
//! and each control-plane member is reached through the workload cluster's apiserver, by a
//! port-forward to its etcd pod (`etcd-<node name>` in `kube-system`, kubeadm's static pod),
//! then TLS to the member as `localhost` (in kubeadm's etcd serving certificate).
//!
//! **Read-only by construction.** The client below is not etcd's client library: its messages
//! are written out here, and the only requests it can send are `Maintenance/Status`,
//! `Cluster/MemberList` and `Maintenance/HashKV`. No KV write, lease, compaction, defragment,
//! alarm or membership change is compiled in (`only_reads_are_compiled_in` checks this file).
//! etcd itself would let any certificate of its CA do anything (kubeadm enables no etcd auth):
//! read-only is this client's property, not etcd's.

use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tonic::transport::{Channel, Endpoint};

use super::command::error_chain;

/// The messages of the three requests, as etcd's `rpc.proto` numbers their fields (etcd 3.4 and
/// 3.5; fields this client does not read are left out: protobuf skips them).
mod pb {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(uint64, tag = "1")]
        pub cluster_id: u64,
        #[prost(uint64, tag = "2")]
        pub member_id: u64,
        #[prost(int64, tag = "3")]
        pub revision: i64,
        #[prost(uint64, tag = "4")]
        pub raft_term: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(string, tag = "2")]
        pub version: String,
        #[prost(int64, tag = "3")]
        pub db_size: i64,
        #[prost(uint64, tag = "4")]
        pub leader: u64,
        #[prost(uint64, tag = "5")]
        pub raft_index: u64,
        #[prost(uint64, tag = "6")]
        pub raft_term: u64,
        #[prost(uint64, tag = "7")]
        pub raft_applied_index: u64,
        #[prost(string, repeated, tag = "8")]
        pub errors: Vec<String>,
        #[prost(bool, tag = "10")]
        pub is_learner: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MemberListRequest {
        #[prost(bool, tag = "1")]
        pub linearizable: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Member {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(string, repeated, tag = "3")]
        pub peer_urls: Vec<String>,
        #[prost(string, repeated, tag = "4")]
        pub client_urls: Vec<String>,
        #[prost(bool, tag = "5")]
        pub is_learner: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct MemberListResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")]
        pub members: Vec<Member>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HashKvRequest {
        #[prost(int64, tag = "1")]
        pub revision: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct HashKvResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(uint32, tag = "2")]
        pub hash: u32,
        #[prost(int64, tag = "3")]
        pub compact_revision: i64,
    }
}

/// The three requests, by their gRPC paths: everything this client can ask.
const STATUS: &str = "/etcdserverpb.Maintenance/Status";
const MEMBER_LIST: &str = "/etcdserverpb.Cluster/MemberList";
const HASH_KV: &str = "/etcdserverpb.Maintenance/HashKV";

/// The name the member's serving certificate is checked against: kubeadm puts `localhost` in
/// every etcd serving certificate, and a port-forward reaches the member on the pod's loopback.
const SERVER_NAME: &str = "localhost";

/// A member's status answer (what `members`, `quorum` and `consistency` read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub member_id: u64,
    pub revision: i64,
    pub version: String,
    pub leader: u64,
    pub raft_index: u64,
    pub raft_term: u64,
    pub applied_index: u64,
    pub errors: Vec<String>,
}

/// One member of etcd's member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub peer_urls: Vec<String>,
}

/// A HashKV answer: the hash of the history up to `revision`, from `compact_revision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashKv {
    pub hash: u32,
    pub compact_revision: i64,
}

/// Why the etcd CA could not be used or a member could not be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdReadError {
    /// The Secret's CA certificate or key is unusable (`what` says which and why).
    #[error("{0}")]
    Ca(String),
    /// The request got no answer within its bound.
    #[error("{what} of {pod}: no answer within {}ms", bound.as_millis())]
    Timeout { what: &'static str, pod: String, bound: Duration },
    /// The port-forward, the TLS handshake or etcd refused (`detail`: each cause's words).
    #[error("{what} of {pod}: {detail}")]
    Failed { what: &'static str, pod: String, detail: String },
}

/// The run's client identity towards etcd: a certificate signed by the etcd CA of the Secret,
/// made in memory when the run starts (never written anywhere), and the TLS configuration that trusts
/// only that CA.
pub struct EtcdTls {
    config: Arc<rustls::ClientConfig>,
}

impl EtcdTls {
    /// From the Secret's `tls.crt` and `tls.key` (PEM; an RSA key as Cluster API writes it —
    /// `RSA PRIVATE KEY` —, an EC key or a PKCS #8 key).
    pub fn from_ca(ca_pem: &[u8], key_pem: &[u8], run_id: &str) -> Result<EtcdTls, EtcdReadError> {
        let bad = |what: &str, e: String| EtcdReadError::Ca(format!("{what}: {e}"));
        let ca_text = std::str::from_utf8(ca_pem).map_err(|_| bad("tls.crt", "not UTF-8 PEM".into()))?;
        let ca_der = CertificateDer::from_pem_slice(ca_pem).map_err(|e| bad("tls.crt", e.to_string()))?;
        let key = pkcs8_of(key_pem).map_err(|e| bad("tls.key", e))?;
        let ca_key = KeyPair::try_from(&PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key)))
            .map_err(|e| bad("tls.key", format!("not a key rcgen can sign with: {e}")))?;
        let issuer = Issuer::from_ca_cert_pem(ca_text, ca_key).map_err(|e| bad("tls.crt", format!("not a CA certificate: {e}")))?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, format!("shakedown-etcd-reader-{run_id}"));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate().map_err(|e| EtcdReadError::Ca(format!("cannot make the run's etcd client key: {e}")))?;
        let cert = params
            .signed_by(&client_key, &issuer)
            .map_err(|e| EtcdReadError::Ca(format!("cannot sign the run's etcd client certificate: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_der).map_err(|e| bad("tls.crt", e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| EtcdReadError::Ca(e.to_string()))?
            .with_root_certificates(roots)
            .with_client_auth_cert(vec![cert.der().clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client_key.serialize_der())))
            .map_err(|e| EtcdReadError::Ca(format!("the run's etcd client certificate: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(EtcdTls { config: Arc::new(config) })
    }
}

/// A PEM private key as PKCS #8 DER: PKCS #8 as is, PKCS #1 (`RSA PRIVATE KEY`) and SEC 1
/// (`EC PRIVATE KEY`, P-256 or P-384) wrapped in a PrivateKeyInfo (RFC 5208).
fn pkcs8_of(pem: &[u8]) -> Result<Vec<u8>, String> {
    match PrivateKeyDer::from_pem_slice(pem).map_err(|e| format!("no private key in it ({e})"))? {
        PrivateKeyDer::Pkcs8(k) => Ok(k.secret_pkcs8_der().to_vec()),
        PrivateKeyDer::Pkcs1(k) => {
            // AlgorithmIdentifier { rsaEncryption, NULL }
            let alg = der(0x30, &[der(0x06, &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01]), vec![0x05, 0x00]].concat());
            Ok(private_key_info(&alg, k.secret_pkcs1_der()))
        }
        PrivateKeyDer::Sec1(k) => {
            let sec1 = k.secret_sec1_der();
            const P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
            const P384: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x22];
            let curve = [P256, P384]
                .into_iter()
                .find(|oid| sec1.windows(oid.len() + 2).any(|w| w[0] == 0x06 && w[1] as usize == oid.len() && &w[2..] == *oid))
                .ok_or("an EC key on a curve other than P-256 or P-384")?;
            // AlgorithmIdentifier { id-ecPublicKey, namedCurve }
            let alg = der(0x30, &[der(0x06, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]), der(0x06, curve)].concat());
            Ok(private_key_info(&alg, sec1))
        }
        _ => Err("an unknown kind of private key".into()),
    }
}

/// PrivateKeyInfo ::= SEQUENCE { version 0, algorithm, privateKey OCTET STRING }
fn private_key_info(alg: &[u8], key: &[u8]) -> Vec<u8> {
    der(0x30, &[vec![0x02, 0x01, 0x00], alg.to_vec(), der(0x04, key)].concat())
}

/// One DER element: tag, definite length, contents.
fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
    let n = contents.len();
    let mut out = vec![tag];
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes: Vec<u8> = n.to_be_bytes().into_iter().skip_while(|b| *b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(contents);
    out
}

/// One member, read through a port-forward to its etcd pod. The gRPC channel connects lazily
/// and again after a failure: each connection is a new port-forward (a restarted pod is
/// reached on the next request).
#[derive(Clone)]
pub struct MemberReader {
    pub pod: String,
    channel: Channel,
    bound: Duration,
}

impl MemberReader {
    /// A reader of pod `namespace/pod`'s etcd on `port`, each request bounded by `bound`.
    pub fn new(workload: kube::Client, namespace: &str, pod: &str, port: u16, tls: &EtcdTls, bound: Duration) -> MemberReader {
        let pods: Api<Pod> = Api::namespaced(workload, namespace);
        let (name, config) = (pod.to_string(), tls.config.clone());
        let connector = tower::service_fn(move |_: http::Uri| {
            let (pods, name, config) = (pods.clone(), name.clone(), config.clone());
            async move {
                let mut forward = pods.portforward(&name, &[port]).await?;
                let stream = forward.take_stream(port).ok_or("the port-forward has no stream for the port")?;
                let server = ServerName::try_from(SERVER_NAME).map_err(|e| e.to_string())?;
                let tls = tokio_rustls::TlsConnector::from(config).connect(server, stream).await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(TokioIo::new(tls))
            }
        });
        // The URI only names the connection: the connector above reaches the pod.
        let channel =
            Endpoint::from_static("http://etcd.port-forward").connect_timeout(bound).timeout(bound).connect_with_connector_lazy(connector);
        MemberReader { pod: pod.to_string(), channel, bound }
    }

    async fn unary<Req, Resp>(&self, what: &'static str, path: &'static str, req: Req) -> Result<Resp, EtcdReadError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let failed = |detail: String| EtcdReadError::Failed { what, pod: self.pod.clone(), detail };
        let call = async {
            let mut grpc = tonic::client::Grpc::new(self.channel.clone());
            grpc.ready().await.map_err(|e| failed(error_chain(&e)))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(tonic::Request::new(req), PathAndQuery::from_static(path), codec)
                .await
                .map(tonic::Response::into_inner)
                .map_err(|s| failed(status_text(&s)))
        };
        match tokio::time::timeout(self.bound, call).await {
            Ok(r) => r,
            Err(_) => Err(EtcdReadError::Timeout { what, pod: self.pod.clone(), bound: self.bound }),
        }
    }

    /// `Maintenance/Status`.
    pub async fn status(&self) -> Result<Status, EtcdReadError> {
        let s: pb::StatusResponse = self.unary("status", STATUS, pb::StatusRequest {}).await?;
        let h = s.header.unwrap_or_default();
        Ok(Status {
            member_id: h.member_id,
            revision: h.revision,
            version: s.version,
            leader: s.leader,
            raft_index: s.raft_index,
            raft_term: s.raft_term,
            applied_index: s.raft_applied_index,
            errors: s.errors,
        })
    }

    /// `Cluster/MemberList`, linearizable (agreed by a quorum, not the member's own view).
    pub async fn member_list(&self) -> Result<Vec<Member>, EtcdReadError> {
        let l: pb::MemberListResponse = self.unary("member list", MEMBER_LIST, pb::MemberListRequest { linearizable: true }).await?;
        Ok(l.members.into_iter().map(|m| Member { id: m.id, name: m.name, peer_urls: m.peer_urls }).collect())
    }

    /// `Maintenance/HashKV` at `revision`.
    pub async fn hash_kv(&self, revision: i64) -> Result<HashKv, EtcdReadError> {
        let h: pb::HashKvResponse = self.unary("hash kv", HASH_KV, pb::HashKvRequest { revision }).await?;
        Ok(HashKv { hash: h.hash, compact_revision: h.compact_revision })
    }
}

/// A gRPC status as words: its code and message, then each cause's (a port-forward refused by
/// the apiserver, a TLS handshake that failed).
fn status_text(s: &tonic::Status) -> String {
    let code = s.code().description().trim_end_matches('.').to_lowercase();
    let head = if s.message().is_empty() { code } else { format!("{code}: {}", s.message()) };
    match std::error::Error::source(s).map(error_chain) {
        Some(chain) if !head.contains(&chain) => format!("{head}: {chain}"),
        _ => head,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The "read-only by construction" promise: this file names no gRPC method but the three
    /// reads, and uses no etcd client library that could send another.
    #[test]
    fn only_reads_are_compiled_in() {
        let src = include_str!("etcd.rs");
        let src = src.split("#[cfg(test)]").next().unwrap();
        let code: String = src.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        let methods: Vec<&str> =
            code.match_indices("\"/etcdserverpb.").map(|(i, _)| code[i + 1..].split('"').next().unwrap_or("")).collect();
        assert_eq!(methods, [STATUS, MEMBER_LIST, HASH_KV], "the only gRPC methods named");
        let client_crate = ["etcd", "_client"].concat();
        assert!(!code.contains(&client_crate), "no etcd client library in the read-only client");
    }

    #[test]
    fn a_pkcs1_rsa_key_and_a_sec1_ec_key_sign_the_runs_client_certificate() {
        // A CA as Cluster API makes it (RSA, `RSA PRIVATE KEY`) and one with an EC key.
        for (args, bits) in
            [(&["genrsa", "-traditional"][..], Some("2048")), (&["ecparam", "-name", "prime256v1", "-genkey", "-noout"][..], None)]
        {
            let dir = tempfile::tempdir().unwrap();
            let key = dir.path().join("ca.key");
            let crt = dir.path().join("ca.crt");
            let out = std::process::Command::new("openssl").args(args).arg("-out").arg(&key).args(bits).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let out = std::process::Command::new("openssl")
                .args(["req", "-x509", "-new", "-subj", "/CN=etcd-ca", "-days", "2", "-key"])
                .arg(&key)
                .arg("-out")
                .arg(&crt)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let key_pem = std::fs::read(&key).unwrap();
            assert!(String::from_utf8_lossy(&key_pem).contains(if args[0] == "genrsa" { "RSA PRIVATE KEY" } else { "EC PRIVATE KEY" }));
            EtcdTls::from_ca(&std::fs::read(&crt).unwrap(), &key_pem, "sd-test").unwrap_or_else(|e| panic!("{args:?}: {e}"));
        }
        let err = EtcdTls::from_ca(b"not pem", b"not pem", "sd-test").err().expect("refused");
        assert!(err.to_string().starts_with("tls.crt"), "{err}");
    }
}
