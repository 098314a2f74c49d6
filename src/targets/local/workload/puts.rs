//! The `puts` workload: one client writing unique keys `<prefix><seq>` with plain puts, one at a
//! time, `interval` apart.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use shakedown_history::format::{Request, WriteAnswer};
use shakedown_invariants::{Ack, Unknown};
use tokio::sync::watch;

use super::{member_hex, pause, unix_ms, Recorder, RECONNECT_PAUSE, WRITE_BEHIND_DELAY};
use crate::targets::local::etcd::{bounded, connect};

/// With `ack_before_write` (a planted bug) a write counts as acknowledged when it is queued,
/// 100 ms before it is sent to etcd.
pub(super) async fn run(
    endpoint: String,
    prefix: String,
    interval: Duration,
    timeout: Duration,
    ack_before_write: bool,
    rec: Arc<Recorder>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut client: Option<Client> = None;
    for seq in 0u64.. {
        if *stopped.borrow() {
            break;
        }
        if seq % 200 == 0 {
            rec.flush();
        }
        let key = format!("{prefix}{seq:010}");
        let value = format!("v{seq}");
        rec.stats.attempted.fetch_add(1, Ordering::Relaxed);
        if client.is_none() {
            client = connect(&endpoint, timeout).await.ok();
        }
        let Some(c) = client.as_mut() else {
            rec.stats.failed.fetch_add(1, Ordering::Relaxed);
            pause(RECONNECT_PAUSE, &mut stopped).await;
            continue;
        };
        let start = rec.position();
        if ack_before_write {
            // Planted bug: write-behind. The write is acknowledged when queued and only reaches
            // etcd 100 ms later, whatever happens in between. Its revision is not known.
            rec.ack_unsent(Ack::put(key.clone(), value.clone(), 0, start));
            let mut c = c.clone();
            tokio::spawn(async move {
                tokio::time::sleep(WRITE_BEHIND_DELAY).await;
                let _ = bounded("put", timeout, c.put(key.as_str(), value.as_str(), None)).await;
            });
            pause(interval, &mut stopped).await;
            continue;
        }
        let (at, t) = (unix_ms(), std::time::Instant::now());
        let ticket = rec.send(Unknown { key: key.clone(), value: Some(value.clone()), start, any_time: true });
        let put = |answer| Request::Put { key: key.clone(), value: value.clone(), answer };
        let sent = rec.requests.send(0, put(None));
        let res = bounded("put", timeout, c.put(key.as_str(), value.as_str(), None)).await;
        rec.sample(at, t.elapsed(), res.is_ok());
        let answer = res.as_ref().ok().and_then(|r| r.header()).map(|h| WriteAnswer { revision: h.revision() });
        rec.requests.end(sent, put(answer), res.as_ref().ok().and_then(|r| r.header()).map(|h| member_hex(h.member_id())));
        match res {
            Ok(r) => rec.answered(ticket, Some(Ack::put(key, value, r.header().map_or(0, |h| h.revision()), start))),
            Err(e) => {
                tracing::trace!("workload write {seq} failed: {e}");
                rec.failed(ticket);
                // A fresh connection lets the endpoint route around a dead member.
                client = None;
            }
        }
        pause(interval, &mut stopped).await;
    }
    rec.flush();
}
