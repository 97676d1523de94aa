//! The serving side: [`Client::serve`] and [`Client::serve_with`] through the broker,
//! [`serve_peer`] without it, and the [`RpcServer`] they return.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use hayate_core::{Key, Message};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use super::answer::answer;
use super::{RpcError, Target};
use crate::Client;
use crate::peer::{PeerOptions, PeerServer};

impl Client {
    /// Serves `spec.topic` as server `spec.server` (required), speaking `spec.version` in
    /// `spec.namespace`. Returns once the server's subscriptions are in place at the broker.
    ///
    /// `handler(method, payload)` is called for every accepted request, each in its own task
    /// (requests may be handled concurrently and complete out of order). Its `Ok` payload is
    /// the reply of a call; its `Err` is sent back as an error reply (the caller gets
    /// [`RpcError::Remote`] with the error's `Display` text). For a cast or fan-out the
    /// result is dropped (errors are logged). A panicking handler is reported to the caller
    /// as a remote error. Unknown methods are the handler's business.
    ///
    /// Serving stops when the returned [`RpcServer`] is closed or dropped.
    pub async fn serve<F, Fut, E>(&self, spec: &Target, handler: F) -> Result<RpcServer, RpcError>
    where
        F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
        E: fmt::Display + 'static,
    {
        self.serve_with(spec, ServeOptions::default(), handler)
            .await
    }

    /// [`serve`](Client::serve) with options: with [`ServeOptions::direct`], the server also
    /// accepts direct (peer-to-peer) calls on its own listener, with the same handler.
    /// Direct requests are not given a task each: their handler futures are polled by their
    /// connection's task (see [`crate::peer`]), so a handler that blocks its thread stalls
    /// that connection; spawn blocking work.
    pub async fn serve_with<F, Fut, E>(
        &self,
        spec: &Target,
        options: ServeOptions,
        handler: F,
    ) -> Result<RpcServer, RpcError>
    where
        F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
        E: fmt::Display + 'static,
    {
        let [topic_key, server_key, fanout_key] = serve_keys(spec)?;
        let handler = Arc::new(handler);
        let direct = match &options.direct {
            Some(addr) => Some(peer_listener(addr, spec, handler.clone()).await?),
            None => None,
        };
        let subs = vec![
            self.queue_subscribe(topic_key.as_str(), topic_key.as_str())
                .await?,
            self.queue_subscribe(server_key.as_str(), server_key.as_str())
                .await?,
            self.subscribe(fanout_key.as_str()).await?,
        ];
        self.flush().await?;
        let (stop_tx, stop_rx) = oneshot::channel();
        let ctx = Arc::new(ServeCtx {
            client: self.clone(),
            spec: spec.clone(),
        });
        let task = tokio::spawn(serve_loop(ctx, handler, subs, stop_rx));
        Ok(RpcServer {
            stop: Some(stop_tx),
            task: Some(task),
            direct,
        })
    }
}

/// Options of [`Client::serve_with`].
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    /// Also listen on this address (`HOST:PORT`, port 0 for a free one) for direct calls:
    /// a caller that connects a [`Client`] to [`RpcServer::direct_addr`] calls this server
    /// without the broker hop (see [`crate::peer`]).
    pub direct: Option<String>,
}

/// Serves `spec` (as [`Client::serve`] does) to callers that connect directly to `addr`
/// (`HOST:PORT`, port 0 for a free one), without a broker: peer to peer. A caller connects
/// an ordinary [`Client`] to [`PeerServer::local_addr`] and uses [`Client::call`],
/// [`Client::cast`] and [`Client::fanout`] on it as usual; version and namespace checks and
/// error replies are the same as through a broker.
pub async fn serve_peer<F, Fut, E>(
    addr: &str,
    spec: &Target,
    handler: F,
) -> Result<PeerServer, RpcError>
where
    F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: fmt::Display + 'static,
{
    serve_keys(spec)?;
    peer_listener(addr, spec, Arc::new(handler)).await
}

/// The keys a server of `spec` serves: topic, server (a server name is required), fan-out.
fn serve_keys(spec: &Target) -> Result<[Key; 3], RpcError> {
    let server_key = spec.server_key().map_err(|_| {
        RpcError::InvalidTarget(format!(
            "a server of topic {:?} needs a valid server name, got {:?}",
            spec.topic, spec.server
        ))
    })?;
    Ok([spec.topic_key()?, server_key, spec.fanout_key()?])
}

async fn peer_listener<F, Fut, E>(
    addr: &str,
    spec: &Target,
    handler: Arc<F>,
) -> Result<PeerServer, RpcError>
where
    F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: fmt::Display + 'static,
{
    let keys = serve_keys(spec)?;
    let exprs: Vec<&str> = keys.iter().map(Key::as_str).collect();
    let spec = Arc::new(spec.clone());
    let options = PeerOptions {
        name: format!("hayate-peer rpc {}", spec.topic),
        ..PeerOptions::default()
    };
    Ok(PeerServer::bind_with(addr, &exprs, options, move |m| {
        let spec = spec.clone();
        let handler = handler.clone();
        async move { answer(&spec, &*handler, m).await }
    })
    .await?)
}

/// A running RPC server. Dropping it stops serving (requests already being handled still
/// complete in the background); [`close`](RpcServer::close) also waits for them.
#[derive(Debug)]
pub struct RpcServer {
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    direct: Option<PeerServer>,
}

impl RpcServer {
    /// The address of the direct listener, when [`ServeOptions::direct`] asked for one.
    pub fn direct_addr(&self) -> Option<std::net::SocketAddr> {
        self.direct.as_ref().map(PeerServer::local_addr)
    }

    /// Stops serving: leaves the topic, server and fan-out subscriptions, closes the direct
    /// listener, then waits until the requests being handled are answered.
    pub async fn close(mut self) {
        self.stop.take();
        if let Some(d) = self.direct.take() {
            d.close().await;
        }
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        // Dropping the sender ends the serve loop (and dropping `direct` its listener).
        self.stop.take();
    }
}

struct ServeCtx {
    client: Client,
    spec: Target,
}

async fn serve_loop<F, Fut, E>(
    ctx: Arc<ServeCtx>,
    handler: Arc<F>,
    subs: Vec<crate::Subscription>,
    mut stop: oneshot::Receiver<()>,
) where
    F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: fmt::Display + 'static,
{
    let mut incoming = futures::stream::select_all(subs);
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            m = incoming.next() => match m {
                Some(m) => {
                    running.spawn(handle(ctx.clone(), handler.clone(), m));
                }
                None => break,
            },
            Some(_) = running.join_next(), if !running.is_empty() => {}
        }
    }
    // Unsubscribe first, then let the requests in hand finish.
    drop(incoming);
    while running.join_next().await.is_some() {}
    let _ = ctx.client.flush().await;
}

async fn handle<F, Fut, E>(ctx: Arc<ServeCtx>, handler: Arc<F>, m: Message)
where
    F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: fmt::Display + 'static,
{
    let Some(reply) = answer(&ctx.spec, &*handler, m).await else {
        return;
    };
    if let Err(e) = ctx.client.publish_message(&reply).await {
        tracing::debug!("RPC reply not sent: {e}");
    }
}
