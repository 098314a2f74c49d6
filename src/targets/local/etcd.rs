//! Talking to etcd members and the endpoint with the etcd-client crate, every call bounded.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, StatusResponse};
use tokio::time::{timeout, Instant};

/// The longest a connection attempt may take (a member that is up answers in milliseconds).
pub const CONNECT_BOUND: Duration = Duration::from_millis(500);
/// How often a wait for a member polls it.
const POLL: Duration = Duration::from_millis(20);

/// An etcd request that got no answer: no connection, an error from etcd, or no answer within
/// its bound.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("cannot connect to {url}: {}", error_text(.source))]
    Connect {
        url: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("cannot connect to {url}: timed out after {}ms", bound.as_millis())]
    ConnectTimeout { url: String, bound: Duration },
    /// etcd answered `what` with an error.
    #[error("{what}: {}", error_text(.source))]
    Call {
        what: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("{what}: no answer within {}ms", bound.as_millis())]
    Timeout { what: String, bound: Duration },
    /// The member did not see a leader and catch up within the bound (`last`: what it said last).
    #[error("{url} not healthy and caught up within {}ms: {last}", bound.as_millis())]
    NotCaughtUp { url: String, bound: Duration, last: String },
}

/// An etcd client error as words. A gRPC status's own Display ends with its source's Debug text
/// (`source: tonic::transport::Error(Transport, ConnectError(…Elapsed(())))`); this gives the
/// status's message and code, then each cause's own words: `the service is currently unavailable: tcp connect error:
/// transport error: deadline has elapsed`.
pub fn error_text(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let (mut text, mut cause): (String, Option<&(dyn std::error::Error + 'static)>) = match e {
        etcd_client::Error::GRpcStatus(s) => {
            let code = s.code().description().trim_end_matches('.').to_lowercase();
            (if s.message().is_empty() { code } else { format!("{code}: {}", s.message()) }, s.source())
        }
        other => (other.to_string(), other.source()),
    };
    while let Some(c) = cause {
        let words = c.to_string();
        if !words.is_empty() && !text.contains(&words) {
            text = format!("{text}: {words}");
        }
        cause = c.source();
    }
    text
}

/// A client for one URL. The connection is made lazily by the first request.
pub async fn connect(url: &str, request_timeout: Duration) -> Result<Client, EtcdError> {
    let opts = ConnectOptions::new().with_connect_timeout(request_timeout.min(CONNECT_BOUND)).with_timeout(request_timeout);
    match timeout(request_timeout, Client::connect([url], Some(opts))).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(source)) => Err(EtcdError::Connect { url: url.to_string(), source }),
        Err(_) => Err(EtcdError::ConnectTimeout { url: url.to_string(), bound: request_timeout }),
    }
}

/// Runs `fut` with a deadline: etcd's error or the timeout, named by `what`.
pub async fn bounded<T, F>(what: &str, limit: Duration, fut: F) -> Result<T, EtcdError>
where
    F: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    match timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(EtcdError::Call { what: what.to_string(), source }),
        Err(_) => Err(EtcdError::Timeout { what: what.to_string(), bound: limit }),
    }
}

/// Status of the member at `url` on a fresh connection.
pub async fn status(url: &str, limit: Duration) -> Result<StatusResponse, EtcdError> {
    let mut c = connect(url, limit).await?;
    bounded("status", limit, c.status()).await
}

/// Waits until the member at `url` sees a leader and has committed at least what the cluster had
/// committed when the wait began (as seen from `reference_url`, e.g. the leader). Bounded by `limit`.
pub async fn wait_caught_up(url: &str, others: &[String], limit: Duration) -> Result<(), EtcdError> {
    let deadline = Instant::now() + limit;
    let step = CONNECT_BOUND;
    // The commit index the cluster had when the wait began.
    let mut target: Option<u64> = None;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        if target.is_none() {
            for o in others {
                if let Ok(s) = status(o, step).await {
                    if s.leader() != 0 {
                        target = Some(s.raft_index());
                        break;
                    }
                }
            }
        }
        match status(url, step).await {
            Ok(s) if s.leader() == 0 => last = "member answers but sees no leader".into(),
            Ok(s) => match target {
                Some(t) if s.raft_index() >= t => return Ok(()),
                Some(t) => last = format!("member at raft index {} of {t}", s.raft_index()),
                None => last = "no other member sees a leader".into(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(POLL).await;
    }
    Err(EtcdError::NotCaughtUp { url: url.to_string(), bound: limit, last })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a verdict says of an etcd that cannot be reached is words, not the Debug text of
    /// tonic's and hyper's errors. A port nothing listens on (a crashed member) and one that
    /// takes connections and never answers (a paused member) are what down members give.
    #[tokio::test]
    async fn an_unreachable_member_is_described_in_words() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent_port = silent.local_addr().unwrap().port();
        for url in [format!("http://127.0.0.1:{closed}"), format!("http://127.0.0.1:{silent_port}")] {
            let e = status(&url, Duration::from_millis(300)).await.expect_err("nothing answers there");
            let text = e.to_string();
            for debug in ["Error(", "(())", "Kind", "Some(", "{ "] {
                assert!(!text.contains(debug), "{url}: Debug text {debug:?} in {text:?}");
            }
            assert!(text.contains(&url) || text.contains("status"), "{text}");
        }
    }
}
