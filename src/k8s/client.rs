//! Connecting to a cluster, counting requests, and watch caches (kube-runtime reflectors) that
//! observation and waits read from, so waiting costs no requests.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Config as WatchConfig};
use kube::{Client, Config};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Connecting to the management cluster's apiserver.
const CONNECT_BOUND: Duration = Duration::from_secs(5);
/// Reading an answer: a watch's server-side timeout (290 s) plus a margin, so a long watch is
/// not cut by the client.
const READ_BOUND: Duration = Duration::from_secs(295);
/// Pause before a failed watch is retried.
const WATCH_RETRY: Duration = Duration::from_millis(500);

/// Requests sent, by `VERB resource` (`LIST machines`, `WATCH machines`, `PATCH kubeadmcontrolplanes`).
#[derive(Debug, Clone, Default)]
pub struct RequestCounter(Arc<Mutex<BTreeMap<String, u64>>>);

impl RequestCounter {
    fn record(&self, method: &http::Method, uri: &http::Uri) {
        let key = request_key(method, uri);
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(key).or_default() += 1;
    }
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// Requests since `before` (a snapshot), watches excluded.
    pub fn non_watch_since(&self, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        self.snapshot()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("WATCH "))
            .map(|(k, n)| {
                let d = n - before.get(&k).copied().unwrap_or(0);
                (k, d)
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// `VERB resource` for a request: GET of a collection is LIST, `watch=true` is WATCH.
pub fn request_key(method: &http::Method, uri: &http::Uri) -> String {
    let segs: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    // /api/v1/... or /apis/group/version/...
    let rest: &[&str] = match segs.first() {
        Some(&"api") if segs.len() >= 2 => &segs[2..],
        Some(&"apis") if segs.len() >= 3 => &segs[3..],
        _ => return format!("{method} {}", uri.path()),
    };
    let rest = if rest.first() == Some(&"namespaces") && rest.len() >= 3 { &rest[2..] } else { rest };
    let resource = rest.first().copied().unwrap_or("");
    let sub = rest.get(2).map(|s| format!("/{s}")).unwrap_or_default();
    let watch = uri.query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let verb = match (method.as_str(), watch, rest.len()) {
        (_, true, _) => "WATCH".to_string(),
        ("GET", _, 1) => "LIST".to_string(),
        (m, _, _) => m.to_string(),
    };
    format!("{verb} {resource}{sub}")
}

/// Why no client could be made.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    /// Bad input: a kubeconfig that does not parse or cannot be used, an unknown context.
    #[error("{0}")]
    Usage(String),
    /// The kubeconfig is fine but no client could be built on this machine (its TLS setup).
    #[error("{0}")]
    Environment(String),
}

impl From<ConnectError> for crate::exit::Fatal {
    fn from(e: ConnectError) -> crate::exit::Fatal {
        match e {
            ConnectError::Usage(m) => crate::exit::Fatal::usage(m),
            ConnectError::Environment(m) => crate::exit::Fatal::environment(m),
        }
    }
}

/// A client for the kubeconfig (`path`, else `KUBECONFIG` / `~/.kube/config`) and context.
pub async fn connect(path: Option<&Path>, context: Option<&str>) -> Result<(Client, RequestCounter, String), ConnectError> {
    let config = load_config(path, context).await?;
    let counter = RequestCounter::default();
    let (client, server) = build(config, &counter)?;
    Ok((client, counter, server))
}

/// The client configuration of one kubeconfig file, its current context: the files shakedown
/// writes itself (a node's, the control-plane stack's, a workload cluster's from its Secret).
pub async fn config_of_file(path: &Path) -> Result<Config, ConnectError> {
    let kc = Kubeconfig::read_from(path).map_err(|e| ConnectError::Usage(format!("cannot read {}: {e}", path.display())))?;
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| ConnectError::Usage(format!("cannot use the kubeconfig {}: {e}", path.display())))
}

/// The client configuration of the kubeconfig (`path`, else `KUBECONFIG` / `~/.kube/config`)
/// and context; in a pod without either, its ServiceAccount.
pub async fn load_config(path: Option<&Path>, context: Option<&str>) -> Result<Config, ConnectError> {
    let read = match path {
        Some(p) => Kubeconfig::read_from(p),
        None => Kubeconfig::read(),
    };
    Ok(match read {
        Ok(kubeconfig) => {
            if let Some(ctx) = context {
                if !kubeconfig.contexts.iter().any(|c| c.name == ctx) {
                    let known: Vec<&str> = kubeconfig.contexts.iter().map(|c| c.name.as_str()).collect();
                    return Err(ConnectError::Usage(format!("context {ctx:?} is not in the kubeconfig (contexts: {})", known.join(", "))));
                }
            }
            let opts = KubeConfigOptions { context: context.map(str::to_string), ..Default::default() };
            Config::from_custom_kubeconfig(kubeconfig, &opts)
                .await
                .map_err(|e| ConnectError::Usage(format!("cannot use the kubeconfig: {e}")))?
        }
        // No kubeconfig at all (neither given nor KUBECONFIG nor ~/.kube/config): in a pod, use
        // its ServiceAccount (ci/k8s).
        Err(e) if path.is_none() && context.is_none() && std::env::var_os("KUBECONFIG").is_none() => Config::incluster()
            .map_err(|_| ConnectError::Usage(format!("cannot load the kubeconfig: {e}; pass --kubeconfig or set KUBECONFIG")))?,
        Err(e) => {
            return Err(ConnectError::Usage(format!(
                "cannot load the kubeconfig{}: {e}",
                path.map(|p| format!(" {}", p.display())).unwrap_or_default()
            )))
        }
    })
}

/// A client for `config` whose requests `counter` counts (bounded connect and read timeouts).
pub fn build(mut config: Config, counter: &RequestCounter) -> Result<(Client, String), ConnectError> {
    config.connect_timeout = Some(CONNECT_BOUND);
    config.read_timeout = Some(READ_BOUND);
    let server = config.cluster_url.to_string();
    if config.accept_invalid_certs {
        tracing::warn!("the kubeconfig for {server} skips TLS verification (insecure-skip-tls-verify): its server is not verified");
    }
    let c2 = counter.clone();
    let layer = tower::layer::layer_fn(move |svc| {
        let c3 = c2.clone();
        tower::util::MapRequest::new(svc, move |req: http::Request<kube::client::Body>| {
            c3.record(req.method(), req.uri());
            req
        })
    });
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| ConnectError::Environment(format!("cannot build a client for {server}: {e}")))?;
    Ok((builder.with_layer(&layer).build(), server))
}

/// A kind that is not `Kind.group/version`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid kind {spec:?}: expected Kind.group/version, e.g. DevMachine.infrastructure.cluster.x-k8s.io/v1beta2")]
pub struct KindError {
    pub spec: String,
}

/// An `ApiResource` from `Kind.group/version` (`DevMachine.infrastructure.cluster.x-k8s.io/v1beta2`).
pub fn resource_of(spec: &str) -> Result<ApiResource, KindError> {
    let bad = || KindError { spec: spec.to_string() };
    let (kind, gv) = spec.split_once('.').ok_or_else(bad)?;
    let (group, version) = gv.rsplit_once('/').ok_or_else(bad)?;
    Ok(ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind)))
}

/// A watch cache of one kind: a reflector store kept current by a watcher task.
pub struct Watched {
    pub kind: String,
    pub store: Store<DynamicObject>,
    synced: Arc<AtomicBool>,
    /// Since when the watch has failed without a success in between (`None`: healthy).
    failing: Arc<Mutex<Option<(std::time::Instant, String)>>>,
    task: JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Called after every change of a watched kind (the store already updated).
pub type OnChange = Arc<dyn Fn(&Store<DynamicObject>) + Send + Sync>;

impl Watched {
    /// Starts watching `ar` in `ns` (selected by `lp`; relists are paginated, `WatchConfig`'s default page size). Every change bumps `changed`; watch
    /// errors are kept in `errors` (the watcher retries after 500 ms).
    pub fn start(
        client: &Client,
        ar: &ApiResource,
        ns: &str,
        lp: WatchConfig,
        changed: watch::Sender<u64>,
        errors: Arc<Mutex<Option<String>>>,
        on_change: Option<OnChange>,
    ) -> Watched {
        Watched::start_api(Api::namespaced_with(client.clone(), ns, ar), ar, lp, changed, errors, on_change)
    }

    /// Like [`Watched::start`], for a cluster-scoped kind (Nodes, PersistentVolumes, VolumeAttachments).
    pub fn start_cluster_scoped(
        client: &Client,
        ar: &ApiResource,
        lp: WatchConfig,
        changed: watch::Sender<u64>,
        errors: Arc<Mutex<Option<String>>>,
    ) -> Watched {
        Watched::start_api(Api::all_with(client.clone(), ar), ar, lp, changed, errors, None)
    }

    fn start_api(
        api: Api<DynamicObject>,
        ar: &ApiResource,
        lp: WatchConfig,
        changed: watch::Sender<u64>,
        errors: Arc<Mutex<Option<String>>>,
        on_change: Option<OnChange>,
    ) -> Watched {
        let (store, writer) = {
            let w = reflector::store::Writer::new(ar.clone());
            (w.as_reader(), w)
        };
        let synced = Arc::new(AtomicBool::new(false));
        let s2 = synced.clone();
        let failing = Arc::new(Mutex::new(None));
        let f2 = failing.clone();
        let reader = store.clone();
        let kind = ar.kind.clone();
        let k2 = kind.clone();
        let task = tokio::spawn(async move {
            let mut stream = reflector::reflector(writer, watcher::watcher(api, lp)).boxed();
            while let Some(ev) = stream.next().await {
                match ev {
                    // A (re)list in progress: the store is swapped in whole at `InitDone`, so
                    // until then it still holds what the last complete list and watch gave.
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Ok(_) => {
                        s2.store(true, Ordering::SeqCst);
                        *f2.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        if let Some(f) = &on_change {
                            f(&reader);
                        }
                        changed.send_modify(|g| *g += 1);
                    }
                    Err(e) => {
                        let msg = format!("watching {k2}: {e}");
                        f2.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| (std::time::Instant::now(), String::new())).1 =
                            msg.clone();
                        *errors.lock().unwrap_or_else(|e| e.into_inner()) = Some(msg);
                        changed.send_modify(|g| *g += 1);
                        tokio::time::sleep(WATCH_RETRY).await;
                    }
                }
            }
        });
        Watched { kind, store, synced, failing, task }
    }

    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// How long the watch has been failing, with its last error (`None`: it is healthy).
    pub fn failing_for(&self) -> Option<(Duration, String)> {
        self.failing.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(t, e)| (t.elapsed(), e.clone()))
    }

    pub fn objects(&self) -> Vec<Arc<DynamicObject>> {
        self.store.state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_keys() {
        let k = |m: &str, u: &str| request_key(&m.parse().unwrap(), &u.parse().unwrap());
        assert_eq!(k("GET", "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines?labelSelector=a"), "LIST machines");
        assert_eq!(k("GET", "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines?watch=true&resourceVersion=1"), "WATCH machines");
        assert_eq!(k("GET", "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m1"), "GET machines");
        assert_eq!(k("PATCH", "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m1/status"), "PATCH machines/status");
        assert_eq!(k("GET", "/api/v1/nodes"), "LIST nodes");
        assert_eq!(k("GET", "/readyz"), "GET /readyz");
    }

    #[test]
    fn resource_of_parses_kind_group_version() {
        let ar = resource_of("DevMachine.infrastructure.cluster.x-k8s.io/v1beta2").unwrap();
        assert_eq!(
            (ar.group.as_str(), ar.version.as_str(), ar.plural.as_str()),
            ("infrastructure.cluster.x-k8s.io", "v1beta2", "devmachines")
        );
        assert!(resource_of("DevMachine").is_err());
    }
}
