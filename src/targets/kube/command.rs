//! Hooks' and probes' plumbing: a command with a timeout, an HTTP GET.

use std::time::Duration;

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
        Err(_) => CommandResult { exit: None, ms: t0.elapsed().as_millis() as u64, stdout: String::new(), stderr: String::new(), error: Some(format!("no exit within {}s (killed)", timeout.as_secs())) },
        Ok(Err(e)) => CommandResult { exit: None, ms: t0.elapsed().as_millis() as u64, stdout: String::new(), stderr: String::new(), error: Some(format!("cannot run {prog}: {e}")) },
        Ok(Ok(out)) => {
            let code = out.status.code();
            let (stdout, stderr) = (tail(&out.stdout), tail(&out.stderr));
            let error = (!out.status.success()).then(|| format!("exit {} ({})", code.map_or("by signal".into(), |c| c.to_string()), if stderr.is_empty() { &stdout } else { &stderr }));
            CommandResult { exit: code, ms: t0.elapsed().as_millis() as u64, stdout, stderr, error }
        }
    }
}

/// GET `url`; `Ok` on a 2xx answer within `timeout`.
pub async fn http_get(url: &str, insecure: bool, timeout: Duration) -> Result<(), String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    let mut http = hyper::client::HttpConnector::new();
    http.enforce_http(false);
    let mut ssl = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls()).map_err(|e| e.to_string())?;
    if insecure {
        ssl.set_verify(openssl::ssl::SslVerifyMode::NONE);
    }
    let https = hyper_openssl::HttpsConnector::with_connector(http, ssl).map_err(|e| e.to_string())?;
    let client: hyper::Client<_, hyper::Body> = hyper::Client::builder().build(https);
    match tokio::time::timeout(timeout, client.get(uri)).await {
        Err(_) => Err(format!("no answer within {}ms", timeout.as_millis())),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(r)) if r.status().is_success() => Ok(()),
        Ok(Ok(r)) => Err(format!("status {}", r.status())),
    }
}
