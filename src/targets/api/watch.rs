//! Watches of the run's ConfigMaps, the way an informer watches: a LIST for the starting
//! `resourceVersion`, a WATCH from it (bookmarks asked for: kube's default), resumed after any break from the last
//! `resourceVersion` seen (event or bookmark); "410 Gone" (too old) is explicit and recovered
//! from by relisting, which starts a new session. A restore of the API's data starts a new
//! session too.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, WatchEvent as KubeEvent, WatchParams};
use shakedown_invariants::{WatchEvent, WatchSession};
use tokio::sync::watch;

use super::{describe, rv, value_of, RETRY_PAUSE};
use crate::targets::recorder::{pause, Recorder, WatchState};

/// The longest a watch stream may stay silent before it is treated as broken and resumed (a
/// paused apiserver, or one cut off, keeps the connection open and sends nothing).
const SILENCE: Duration = Duration::from_secs(5);
/// The server-side timeout asked of each WATCH (the apiserver ends the stream then; resumed).
const WATCH_SECONDS: u32 = 60;

pub(super) async fn run(
    i: u32,
    api: Api<ConfigMap>,
    selector: String,
    timeout: Duration,
    rec: Arc<Recorder>,
    mut stopped: watch::Receiver<bool>,
) {
    let slot = {
        let mut w = rec.watches.lock().expect("watches lock");
        w.push(WatchState::default());
        w.len() - 1
    };
    let name = format!("api-w{i}");
    let mut generation = rec.generation();
    // The resourceVersion to watch from; None: list first (a new session).
    let mut from: Option<i64> = None;
    while !*stopped.borrow() {
        if generation.has_changed().unwrap_or(false) {
            generation.borrow_and_update();
            from = None;
        }
        let since = match from {
            Some(v) => {
                rec.watches.lock().expect("watches lock")[slot].session.resumptions += 1;
                rec.stats.watch_resumptions.fetch_add(1, Ordering::Relaxed);
                v
            }
            None => {
                let start_ack = rec.position();
                let list = tokio::time::timeout(timeout, api.list(&ListParams::default().labels(&selector).limit(1))).await;
                let Ok(Ok(list)) = list else {
                    pause(RETRY_PAUSE, &mut stopped).await;
                    continue;
                };
                rec.stats.lists.fetch_add(1, Ordering::Relaxed);
                let v = rv(list.metadata.resource_version.as_deref());
                let session =
                    WatchSession { name: name.clone(), start_revision: v + 1, start_ack, prev_unknown: true, ..WatchSession::default() };
                rec.watches.lock().expect("watches lock")[slot] = WatchState { session, log: Default::default() };
                v
            }
        };
        from = Some(since);
        let wp = WatchParams::default().labels(&selector).timeout(WATCH_SECONDS);
        let stream = match tokio::time::timeout(timeout, api.watch(&wp, &since.to_string())).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) if matches!(&e, kube::Error::Api(s) if s.code == 410) => {
                relist(&rec, &e);
                from = None;
                continue;
            }
            _ => {
                pause(RETRY_PAUSE, &mut stopped).await;
                continue;
            }
        };
        let mut stream = stream.boxed();
        loop {
            let next = tokio::select! {
                n = tokio::time::timeout(SILENCE, stream.try_next()) => n,
                _ = stopped.changed() => return,
                _ = generation.changed() => {
                    // Restored: a new session from a fresh LIST.
                    from = None;
                    break;
                }
            };
            let event = match next {
                Ok(Ok(Some(e))) => e,
                // An error, the end of the stream (the server's timeout), or silence: resume.
                _ => break,
            };
            let (obj, deleted) = match event {
                KubeEvent::Added(o) | KubeEvent::Modified(o) => (o, false),
                KubeEvent::Deleted(o) => (o, true),
                KubeEvent::Bookmark(b) => {
                    from = Some(rv(Some(&b.metadata.resource_version)).max(from.unwrap_or(0)));
                    continue;
                }
                KubeEvent::Error(s) if s.code == 410 => {
                    relist(&rec, &kube::Error::Api(s));
                    from = None;
                    break;
                }
                KubeEvent::Error(_) => break,
            };
            let revision = rv(obj.metadata.resource_version.as_deref());
            let key = obj.metadata.name.clone().unwrap_or_default();
            let value = if deleted { None } else { Some(value_of(&obj).unwrap_or_default()) };
            let mut w = rec.watches.lock().expect("watches lock");
            // A Kubernetes watch delivers one event per message: each is its own response.
            let response = w[slot].log.len() as u64 + 1;
            w[slot].log.push(WatchEvent { revision, key, value, prev: None, response, created: None });
            drop(w);
            rec.stats.watch_events.fetch_add(1, Ordering::Relaxed);
            from = Some(revision.max(from.unwrap_or(0)));
        }
        pause(RETRY_PAUSE, &mut stopped).await;
    }
}

/// "Too old": explicit, recovered from by relisting (the session ends; the next one starts from a
/// fresh LIST).
fn relist(rec: &Recorder, e: &kube::Error) {
    tracing::debug!("api watch: {}; relisting", describe(e));
    rec.stats.relists.fetch_add(1, Ordering::Relaxed);
}
