//! The host's way to the node's apiserver: `shakedown node forward` (bring-up starts it; its
//! command line names the node directory, so `sweep` ends it). It listens on the node's loopback
//! address in the host's network namespace (`127.213.<slot>.1:6443`, added nowhere: all of 127/8
//! is the loopback's) and joins each connection to the apiserver inside the node's network
//! namespace, byte for byte (TLS passes through; the serving certificate names the loopback
//! address too).
//!
//! A socket belongs to the network namespace its creating thread was in, and keeps it: the
//! listener is made first, in the host's; one thread of the process then enters the node's
//! namespace (`setns(2)`) and makes every outgoing connection there; the bytes are copied on the
//! async runtime, whose threads stay in the host's.
//!
//! The same process opens the node's new volumes to every user ([`super::volumes`]).

use std::fs::File;
use std::net::{SocketAddr, SocketAddrV4, TcpStream as StdStream};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::layout::{Layout, API_PORT};
use super::NodeError;

/// How long a connection into the namespace may take to open.
const CONNECT_BOUND: Duration = Duration::from_secs(5);

type Dial = (SocketAddr, oneshot::Sender<std::io::Result<StdStream>>);

/// The thread that makes connections inside the network namespace at `netns` (a
/// `/proc/<pid>/ns/net` file): entered before it answers its first request.
fn dialer(netns: &Path) -> Result<mpsc::Sender<Dial>, NodeError> {
    let ns = File::open(netns).map_err(|source| NodeError::Netns { action: "open", netns: netns.to_path_buf(), source })?;
    let (tx, rx) = mpsc::channel::<Dial>();
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("netns-dialer".into())
        .spawn(move || {
            // SAFETY: setns(2) on a namespace file we hold open; it changes this thread only.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            let entered = if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) };
            let ok = entered.is_ok();
            let _ = ready_tx.send(entered);
            if !ok {
                return;
            }
            drop(ns);
            for (addr, reply) in rx {
                let _ = reply.send(StdStream::connect_timeout(&addr, CONNECT_BOUND));
            }
        })
        .map_err(NodeError::DialerStart)?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(tx),
        Ok(Err(source)) => Err(NodeError::Netns { action: "enter", netns: netns.to_path_buf(), source }),
        Err(_) => Err(NodeError::DialerEnded),
    }
}

/// Waits (bounded) until `addr` inside the network namespace at `netns` accepts a connection
/// (the control plane's ports, which the host cannot reach). The connections are made on a
/// thread of their own, which ends with the wait: no thread of the runtime's enters the namespace.
pub async fn wait_tcp_in(netns: &Path, addr: SocketAddr, bound: Duration) -> Result<(), NodeError> {
    let dial = dialer(netns)?;
    let deadline = std::time::Instant::now() + bound;
    loop {
        let (tx, rx) = oneshot::channel();
        dial.send((addr, tx)).map_err(|_| NodeError::DialerGone)?;
        match rx.await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(_)) if std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Ok(Err(e)) => {
                return Err(NodeError::Timeout {
                    what: format!("{addr} (in the node's network namespace) did not accept connections"),
                    bound,
                    last: Some(e.to_string()),
                })
            }
            Err(_) => return Err(NodeError::DialerGone),
        }
    }
}

/// Forwards the host's `listen` to `to` inside the network namespace at `netns` until killed.
pub async fn serve(listen: SocketAddrV4, netns: &Path, to: SocketAddr) -> Result<(), NodeError> {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|source| NodeError::Listen { addr: listen, source })?;
    let dial = dialer(netns)?;
    tracing::info!(%listen, %to, "forwarding");
    loop {
        let (mut inbound, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let dial = dial.clone();
        tokio::spawn(async move {
            let (tx, rx) = oneshot::channel();
            if dial.send((to, tx)).is_err() {
                return;
            }
            let outbound = match rx.await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!(%peer, "cannot reach {to} in the node's namespace: {e}");
                    return;
                }
                Err(_) => return,
            };
            let mut outbound = match outbound.set_nonblocking(true).and_then(|_| tokio::net::TcpStream::from_std(outbound)) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("{e}");
                    return;
                }
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
}

/// `shakedown node forward --node-dir D --netns /proc/<holder>/ns/net`: the node's own forward.
pub async fn run(node_dir: &Path, netns: &Path) -> Result<(), NodeError> {
    let l = Layout::load(node_dir).ok_or_else(|| NodeError::NoNode(node_dir.to_path_buf()))?;
    // The node's other helper on the host, in the same process: volumes any user can write.
    let opener = tokio::spawn({
        let l = l.clone();
        async move { super::volumes::keep_open(&l).await }
    });
    let served = serve(l.net.forward(), netns, SocketAddr::from((l.net.node_ip(), API_PORT))).await;
    opener.abort();
    served
}
