//! Peer to peer: serving requests to clients that connect directly, without a broker hop.
//!
//! A [`PeerServer`] listens on a TCP address and speaks the native protocol's server side to
//! ordinary [`Client`](crate::Client)s: `Client::connect(peer_addr)` works as it does with a
//! broker (HELLO/WELCOME, subscriptions, PING, CLOSE). A message published on a key that the
//! server serves (one of its key expressions) goes to the handler; the message the handler
//! returns — the reply to the request's `reply_to` — goes back on the same connection, to each
//! of that connection's subscriptions that matches its key (a client's reply inbox does).
//! Publications on other keys, and replies nobody on the connection subscribed to, are
//! dropped, as a broker with no other subscriber would drop them.
//!
//! Why: brokered request/reply crosses four sockets per call (caller → broker → server →
//! broker → caller); a direct call crosses two. On one host, or when the server's address
//! is known, a direct connection halves the hops. The price: no queue group spreads the
//! load (a caller talks to the one server it connected to), and nothing is buffered while the
//! server is away. [`crate::rpc::serve_peer`] and [`crate::rpc::ServeOptions::direct`] put
//! the RPC layer on top.
//!
//! Requests on one connection are handled concurrently (their handler futures are polled by
//! the connection's task, without a task per request), at most
//! [`PeerOptions::max_in_flight`] at a time (a pipelining caller beyond that waits, its
//! requests unread); replies go out as they complete, all those ready in one write. A caller
//! that does not read its replies is held the same way once 4 MiB of them are unwritten.
//! Malformed input gets an ERR frame and the connection is closed; the listener and the
//! other connections carry on. Connections run on hayate-io's connection driver, as the
//! broker's front-ends do (`hayate_io::conn`).
//!
//! # Layout
//! - this module: [`PeerServer`] (the listener and its accept loop) and [`PeerOptions`];
//! - `conn`: one connection, as the driver's handler: the handshake, the frames a client
//!   sends, the requests in hand and the replies routed to the connection's subscriptions;
//! - `listen`: what such a connection shares with a node's listener's (`node::server`):
//!   opening and closing it, the handshake, reading, ERR and the frames both treat alike.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hayate_core::{KeyExpr, Message};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{Error, Result};

mod conn;
mod listen;
pub mod node;

pub use node::{Node, NodeOptions, NodeStats, ScoutOptions, ShmMode, ShmOptions};

use conn::{LINGER, serve_conn};

/// What a handler returns: the reply to send, if any.
pub type Reply = Pin<Box<dyn Future<Output = Option<Message>> + Send>>;

type Handler = Arc<dyn Fn(Message) -> Reply + Send + Sync>;

/// Settings of a [`PeerServer`].
#[derive(Debug, Clone)]
pub struct PeerOptions {
    /// The server name sent in WELCOME.
    pub name: String,
    /// The largest payload accepted (and announced in WELCOME).
    pub max_payload: u64,
    /// How long a new connection may take to send HELLO.
    pub handshake_timeout: Duration,
    /// Requests of one connection being handled at once; past it the connection's further
    /// requests wait, unread, until one is answered (back-pressure on a pipelining caller).
    pub max_in_flight: usize,
    /// How long a closing connection (the server closing, or the caller sending CLOSE or
    /// going away) may take to answer the requests in hand and write the replies.
    pub drain_timeout: Duration,
}

impl Default for PeerOptions {
    fn default() -> Self {
        PeerOptions {
            name: "hayate-peer".into(),
            max_payload: 64 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            max_in_flight: 4096,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

struct Shared {
    exprs: Vec<KeyExpr>,
    handler: Handler,
    options: PeerOptions,
    next_id: AtomicU64,
}

/// A listener serving requests directly (see the [module](self) documentation). Dropping it
/// stops accepting and ends its connections; [`close`](PeerServer::close) also waits until
/// the requests in hand are answered.
#[derive(Debug)]
pub struct PeerServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl PeerServer {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks a free one) and serves the keys matching
    /// any of `exprs` with `handler`, with default [`PeerOptions`].
    pub async fn bind<F, Fut>(addr: &str, exprs: &[&str], handler: F) -> Result<PeerServer>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<Message>> + Send + 'static,
    {
        PeerServer::bind_with(addr, exprs, PeerOptions::default(), handler).await
    }

    /// [`bind`](PeerServer::bind) with explicit options.
    pub async fn bind_with<F, Fut>(
        addr: &str,
        exprs: &[&str],
        options: PeerOptions,
        handler: F,
    ) -> Result<PeerServer>
    where
        F: Fn(Message) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Option<Message>> + Send + 'static,
    {
        let exprs = exprs
            .iter()
            .map(|e| KeyExpr::new(e))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        if options.max_payload == 0 || options.max_payload > u64::from(u32::MAX) {
            return Err(Error::Protocol(
                "max_payload must be between 1 and 4 GiB".into(),
            ));
        }
        if options.max_in_flight == 0 {
            return Err(Error::Protocol("max_in_flight must be at least 1".into()));
        }
        let listener = TcpListener::bind(addr.strip_prefix("hayate://").unwrap_or(addr)).await?;
        let local = listener.local_addr()?;
        let shared = Arc::new(Shared {
            exprs,
            handler: Arc::new(move |m| Box::pin(handler(m)) as Reply),
            options,
            next_id: AtomicU64::new(1),
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, shared, stop_rx));
        Ok(PeerServer {
            addr: local,
            stop,
            task: Some(task),
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, stops reading requests, answers those in hand and closes every
    /// connection.
    pub async fn close(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: watch::Receiver<bool>) {
    // Each connection gives itself drain_timeout (+ LINGER) to finish; this is a backstop.
    let bound = shared.options.drain_timeout + LINGER + Duration::from_secs(1);
    let serve = |s, _, stop| {
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        serve_conn(s, id, shared.clone(), stop)
    };
    listen::accept_loop(listener, stop, usize::MAX, bound, "peer listener", serve).await;
}
