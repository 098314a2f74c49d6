//! Running a command in a pod's container through the Kubernetes API (`pods/exec` over a
//! WebSocket): what an application's probes and data-integrity commands use, and how the node's
//! tests look inside their pods. Bounded: a command that has not finished within its bound is
//! abandoned (its stream dropped) and reported.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, AttachParams};
use kube::Client;
use tokio::io::AsyncReadExt;

/// What a command in a pod ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exit code (0 when the API reported success). A stream that closed without any status,
    /// or a failure the API reported without an exit code, is an error, not an exit code: the
    /// command did not run to its end, and an empty answer read as its own would be a false
    /// finding.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Why a command in a pod gave no end: `what` names the exec (`exec in ns/pod: command`).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The API refused or failed to start the exec.
    #[error("{what}: {source}")]
    Start {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The exec came without one of its output streams.
    #[error("{what}: no {stream} stream")]
    NoStream { what: String, stream: &'static str },
    /// Its output could not be read.
    #[error("{what}: reading its output: {source}")]
    Read {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// It did not end within its bound (abandoned).
    #[error("{what}: no end within {}s", bound.as_secs())]
    Timeout { what: String, bound: Duration },
    /// The stream closed without an exit status: the container went away, or the connection was
    /// cut. The command's outcome is unknown (its output may be cut short).
    #[error(
        "{what}: the stream closed without an exit status (the container went away, or the connection was cut): its outcome is unknown"
    )]
    NoStatus { what: String },
    /// The API reported a failure without an exit code: the command did not run to an end (no
    /// such container, the container going away).
    #[error("{what}: the API reported a failure without an exit code ({message}): the command's outcome is unknown")]
    Failed { what: String, message: String },
}

/// Runs `command` in `pod` (its first container, or `container`) in `namespace`, within `bound`.
/// `Err` when the exec could not start or did not finish in time.
pub async fn exec(
    client: &Client,
    namespace: &str,
    pod: &str,
    container: Option<&str>,
    command: &[&str],
    bound: Duration,
) -> Result<ExecOutput, ExecError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut params = AttachParams::default().stdin(false).stdout(true).stderr(true);
    if let Some(c) = container {
        params = params.container(c);
    }
    let what = format!("exec in {namespace}/{pod}: {}", command.join(" "));
    let run = async {
        let mut attached = pods
            .exec(pod, command.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &params)
            .await
            .map_err(|source| ExecError::Start { what: what.clone(), source })?;
        let (mut out, mut err) = (String::new(), String::new());
        let mut so = attached.stdout().ok_or_else(|| ExecError::NoStream { what: what.clone(), stream: "stdout" })?;
        let mut se = attached.stderr().ok_or_else(|| ExecError::NoStream { what: what.clone(), stream: "stderr" })?;
        let status = attached.take_status();
        let (r1, r2) = tokio::join!(so.read_to_string(&mut out), se.read_to_string(&mut err));
        r1.and(r2).map_err(|source| ExecError::Read { what: what.clone(), source })?;
        let status = match status {
            Some(s) => s.await,
            None => None,
        };
        let _ = attached.join().await;
        let Some(status) = status else {
            return Err(ExecError::NoStatus { what: what.clone() });
        };
        if status.status.as_deref() == Some("Success") {
            return Ok(ExecOutput { code: 0, stdout: out, stderr: err });
        }
        let exit_code = status
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .and_then(|c| c.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
            .and_then(|c| c.message.as_ref())
            .and_then(|m| m.parse().ok());
        // A failure without an exit code: the command did not run to an end (no such container,
        // the container going away) — not the command's answer.
        let Some(code) = exit_code else {
            let message = status.message.as_deref().or(status.reason.as_deref()).unwrap_or("no message").to_string();
            return Err(ExecError::Failed { what: what.clone(), message });
        };
        Ok(ExecOutput { code, stdout: out, stderr: err })
    };
    tokio::time::timeout(bound, run).await.map_err(|_| ExecError::Timeout { what: what.clone(), bound })?
}
