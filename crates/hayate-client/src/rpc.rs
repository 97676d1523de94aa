//! RPC over the bus, in the style of oslo.messaging.
//!
//! Servers listen on a *topic*; each has a *server name* and speaks one *version*
//! (`MAJOR.MINOR`) of the topic's interface, optionally within a *namespace*. Clients address
//! a [`Target`] and:
//! - [`Client::call`]: send a request to one server and wait for its reply (round-robin among
//!   the topic's servers, or the one named in the target);
//! - [`Client::cast`]: the same without a reply;
//! - [`Client::fanout`]: send to every server of the topic, without a reply.
//!
//! [`Client::serve`] runs a server: an async handler `(method, payload) -> Result<Bytes, E>`
//! called for every accepted request, until the returned [`RpcServer`] is closed or dropped.
//!
//! A request carries the version it needs; a server whose major version is the same and
//! whose minor version is at least the requested one handles it, any other server answers a
//! call with an "unsupported version" error ([`RpcError::UnsupportedVersion`]). A namespace
//! mismatch is answered the same way ([`RpcError::NamespaceMismatch`]). Errors returned by
//! the handler travel back as [`RpcError::Remote`]. What an unknown method does is up to the
//! handler (returning an error is the usual answer).
//!
//! ```no_run
//! # async fn demo() -> Result<(), hayate_client::rpc::RpcError> {
//! use std::time::Duration;
//! use bytes::Bytes;
//! use hayate_client::Client;
//! use hayate_client::rpc::{Target, Version};
//!
//! let client = Client::connect("127.0.0.1:4700").await?;
//! let spec = Target::new("calc").server("calc-1").version(Version::new(1, 2));
//! let server = client
//!     .serve(&spec, |method: String, payload: Bytes| async move {
//!         match method.as_str() {
//!             "echo" => Ok(payload),
//!             other => Err(format!("unknown method {other}")),
//!         }
//!     })
//!     .await?;
//! let reply = client
//!     .call(&Target::new("calc"), "echo", "hi", Duration::from_secs(1))
//!     .await?;
//! assert_eq!(&reply[..], b"hi");
//! server.close().await;
//! # Ok(()) }
//! ```
//!
//! The wire convention (keys, queue groups, headers, replies) is specified in `docs/rpc.md`
//! so that clients and servers in any language interoperate.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use hayate_core::{Key, Message};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::peer::{PeerOptions, PeerServer};
use crate::{Client, Error};

/// First segment of every RPC key.
pub const KEY_PREFIX: &str = "rpc";
/// Request header: the method name (UTF-8, required).
pub const HEADER_METHOD: &str = "rpc-method";
/// Request header: the requested version, `MAJOR.MINOR` (absent = `1.0`). In an
/// `unsupported-version` error reply: the version the server speaks.
pub const HEADER_VERSION: &str = "rpc-version";
/// Request header: the namespace (absent or empty = none). In a `namespace-mismatch` error
/// reply: the server's namespace (absent = none).
pub const HEADER_NAMESPACE: &str = "rpc-namespace";
/// Reply header: `ok` or `error`.
pub const HEADER_STATUS: &str = "rpc-status";
/// Error reply header: what went wrong (`remote`, `unsupported-version`,
/// `namespace-mismatch`, `bad-request`).
pub const HEADER_ERROR: &str = "rpc-error";

/// A version of an RPC interface: `MAJOR.MINOR`. The default is `1.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible changes bump the major version.
    pub major: u32,
    /// Backward-compatible additions bump the minor version.
    pub minor: u32,
}

impl Version {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Version {
        Version { major, minor }
    }

    /// True when a server speaking `self` can handle a request for `requested`: the same
    /// major version and at least the requested minor version.
    pub fn can_serve(self, requested: Version) -> bool {
        self.major == requested.major && self.minor >= requested.minor
    }
}

impl Default for Version {
    fn default() -> Self {
        Version::new(1, 0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A version string that is not `MAJOR.MINOR`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version {0:?} (expected MAJOR.MINOR, e.g. 1.0)")]
pub struct VersionError(pub String);

impl FromStr for Version {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Version, VersionError> {
        let err = || VersionError(s.to_string());
        let (major, minor) = s.split_once('.').ok_or_else(err)?;
        let num = |p: &str| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            p.parse::<u32>().map_err(|_| err())
        };
        Ok(Version::new(num(major)?, num(minor)?))
    }
}

/// Where an RPC goes (for [`Client::call`], [`Client::cast`], [`Client::fanout`]) or what a
/// server is (for [`Client::serve`]).
///
/// `topic` and `server` must each be one valid key segment: non-empty, without `/`, and not
/// `*` or `**`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The topic: the interface the servers implement.
    pub topic: String,
    /// A server name: a call or cast goes to this server only; required to serve.
    pub server: Option<String>,
    /// The namespace; requests and servers must agree on it (`None` matches only `None`).
    pub namespace: Option<String>,
    /// For a request, the version the caller needs; for a server, the version it speaks.
    pub version: Version,
}

impl Target {
    /// A target for `topic`: any server, no namespace, version 1.0.
    pub fn new(topic: impl Into<String>) -> Target {
        Target {
            topic: topic.into(),
            server: None,
            namespace: None,
            version: Version::default(),
        }
    }

    /// Sets the server name.
    pub fn server(mut self, server: impl Into<String>) -> Target {
        self.server = Some(server.into());
        self
    }

    /// Sets the namespace (an empty one is the same as none).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Target {
        let ns = namespace.into();
        self.namespace = (!ns.is_empty()).then_some(ns);
        self
    }

    /// Sets the version.
    pub fn version(mut self, version: Version) -> Target {
        self.version = version;
        self
    }

    /// `rpc/<topic>`: the key of calls and casts to any server of the topic, and the queue
    /// group its servers join on it.
    pub fn topic_key(&self) -> Result<Key, RpcError> {
        make_key(&format!("{KEY_PREFIX}/{}", segment("topic", &self.topic)?))
    }

    /// `rpc/<topic>/server/<server>`: the key of calls and casts to one server.
    pub fn server_key(&self) -> Result<Key, RpcError> {
        let server = self
            .server
            .as_deref()
            .ok_or_else(|| RpcError::InvalidTarget("no server name".into()))?;
        make_key(&format!(
            "{KEY_PREFIX}/{}/server/{}",
            segment("topic", &self.topic)?,
            segment("server", server)?
        ))
    }

    /// `rpc/<topic>/fanout`: the key of fan-out casts to every server of the topic.
    pub fn fanout_key(&self) -> Result<Key, RpcError> {
        make_key(&format!(
            "{KEY_PREFIX}/{}/fanout",
            segment("topic", &self.topic)?
        ))
    }

    /// Where a call or cast goes: the server key when a server is named, else the topic key.
    fn direct_key(&self) -> Result<Key, RpcError> {
        if self.server.is_some() {
            self.server_key()
        } else {
            self.topic_key()
        }
    }

    fn request(&self, key: Key, method: &str, payload: Bytes) -> Result<Message, RpcError> {
        if method.is_empty() {
            return Err(RpcError::InvalidTarget("empty method name".into()));
        }
        let mut headers = vec![
            (
                HEADER_METHOD.to_string(),
                Bytes::copy_from_slice(method.as_bytes()),
            ),
            (
                HEADER_VERSION.to_string(),
                Bytes::from(self.version.to_string()),
            ),
        ];
        if let Some(ns) = &self.namespace {
            headers.push((
                HEADER_NAMESPACE.to_string(),
                Bytes::copy_from_slice(ns.as_bytes()),
            ));
        }
        let mut m = Message::new(key, payload);
        m.headers = Some(headers);
        Ok(m)
    }
}

fn segment<'a>(what: &str, s: &'a str) -> Result<&'a str, RpcError> {
    if s.is_empty() || s.contains('/') || s == "*" || s == "**" {
        return Err(RpcError::InvalidTarget(format!(
            "the {what} {s:?} is not one key segment (non-empty, no `/`, not `*` or `**`)"
        )));
    }
    Ok(s)
}

fn make_key(s: &str) -> Result<Key, RpcError> {
    Key::new(s).map_err(|e| RpcError::InvalidTarget(format!("{s:?}: {e}")))
}

/// Why an RPC failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The handler returned an error (its message), or the server reported an error this
    /// client does not classify.
    #[error("remote error: {message}")]
    Remote {
        /// The error message from the server.
        message: String,
    },
    /// The server does not speak a compatible version.
    #[error("unsupported version {requested}; server speaks {server}")]
    UnsupportedVersion {
        /// The version the request asked for.
        requested: Version,
        /// The version the server speaks.
        server: Version,
    },
    /// The request's namespace is not the server's.
    #[error(
        "namespace mismatch: requested {}, server has {}",
        show_ns(.requested),
        show_ns(.server)
    )]
    NamespaceMismatch {
        /// The request's namespace.
        requested: Option<String>,
        /// The server's namespace.
        server: Option<String>,
    },
    /// The server could not read the request (no method, malformed version, ...).
    #[error("bad request: {message}")]
    BadRequest {
        /// The server's explanation.
        message: String,
    },
    /// No reply within the timeout (no server, or a server too slow).
    #[error("RPC timed out")]
    Timeout,
    /// The reply does not follow the RPC convention.
    #[error("malformed reply: {0}")]
    BadReply(String),
    /// The target or method cannot be expressed on the wire (e.g. a topic with `/`), or a
    /// server was started without a name.
    #[error("invalid target: {0}")]
    InvalidTarget(String),
    /// The connection failed.
    #[error(transparent)]
    Client(Error),
}

fn show_ns(ns: &Option<String>) -> String {
    match ns {
        Some(n) => format!("{n:?}"),
        None => "none".into(),
    }
}

impl From<Error> for RpcError {
    fn from(e: Error) -> Self {
        match e {
            Error::Timeout => RpcError::Timeout,
            e => RpcError::Client(e),
        }
    }
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a Bytes> {
    m.headers
        .as_ref()?
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v)
}

fn header_str<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    header(m, name).and_then(|v| std::str::from_utf8(v).ok())
}

/// Turns a reply into the call's result.
fn read_reply(reply: Message, requested: &Target) -> Result<Bytes, RpcError> {
    let text = |p: &Bytes| String::from_utf8_lossy(p).into_owned();
    match header(&reply, HEADER_STATUS).map(|v| &v[..]) {
        Some(b"ok") => Ok(reply.payload),
        Some(b"error") => {
            let message = text(&reply.payload);
            Err(match header_str(&reply, HEADER_ERROR) {
                Some("unsupported-version") => {
                    match header_str(&reply, HEADER_VERSION).map(str::parse) {
                        Some(Ok(server)) => RpcError::UnsupportedVersion {
                            requested: requested.version,
                            server,
                        },
                        _ => RpcError::BadReply(format!(
                            "unsupported-version error without a valid {HEADER_VERSION}: \
                             {message}"
                        )),
                    }
                }
                Some("namespace-mismatch") => RpcError::NamespaceMismatch {
                    requested: requested.namespace.clone(),
                    server: header_str(&reply, HEADER_NAMESPACE)
                        .filter(|s| !s.is_empty())
                        .map(str::to_string),
                },
                Some("bad-request") => RpcError::BadRequest { message },
                _ => RpcError::Remote { message },
            })
        }
        Some(other) => Err(RpcError::BadReply(format!(
            "{HEADER_STATUS} is {:?}",
            String::from_utf8_lossy(other)
        ))),
        None => Err(RpcError::BadReply(format!("no {HEADER_STATUS} header"))),
    }
}

impl Client {
    /// Calls `method` on one server of `target` and waits up to `timeout` for the result:
    /// the server named by `target.server`, or else the next server of the topic in
    /// round-robin order.
    pub async fn call(
        &self,
        target: &Target,
        method: &str,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Bytes, RpcError> {
        let m = target.request(target.direct_key()?, method, payload.into())?;
        let reply = self.request_message(m, timeout).await?;
        read_reply(reply, target)
    }

    /// Sends `method` to one server of `target` (as [`call`](Client::call) chooses it)
    /// without waiting for anything: returns once the request is buffered for sending.
    /// Nobody is told if no server receives it, or if the server rejects it.
    pub async fn cast(
        &self,
        target: &Target,
        method: &str,
        payload: impl Into<Bytes>,
    ) -> Result<(), RpcError> {
        let m = target.request(target.direct_key()?, method, payload.into())?;
        Ok(self.publish_message(&m).await?)
    }

    /// Sends `method` to every server of `target.topic` (`target.server` is ignored),
    /// without a reply.
    pub async fn fanout(
        &self,
        target: &Target,
        method: &str,
        payload: impl Into<Bytes>,
    ) -> Result<(), RpcError> {
        let m = target.request(target.fanout_key()?, method, payload.into())?;
        Ok(self.publish_message(&m).await?)
    }

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

/// An error reply: its `rpc-error` kind, message and extra headers.
struct Rejection {
    kind: &'static str,
    message: String,
    extra: Option<(&'static str, Bytes)>,
}

impl Rejection {
    fn new(kind: &'static str, message: impl Into<String>) -> Rejection {
        Rejection {
            kind,
            message: message.into(),
            extra: None,
        }
    }
}

/// Checks a request against the server's spec; returns its method.
fn accept(spec: &Target, m: &Message) -> Result<String, Rejection> {
    let method = match header(m, HEADER_METHOD).map(|v| std::str::from_utf8(v)) {
        Some(Ok(method)) if !method.is_empty() => method.to_string(),
        Some(_) => {
            return Err(Rejection::new(
                "bad-request",
                format!("{HEADER_METHOD} is empty or not UTF-8"),
            ));
        }
        None => {
            return Err(Rejection::new(
                "bad-request",
                format!("no {HEADER_METHOD} header"),
            ));
        }
    };
    let requested = match header(m, HEADER_VERSION) {
        None => Version::default(),
        Some(v) => match std::str::from_utf8(v).ok().map(str::parse::<Version>) {
            Some(Ok(v)) => v,
            _ => {
                return Err(Rejection::new(
                    "bad-request",
                    format!(
                        "invalid {HEADER_VERSION} {:?} (expected MAJOR.MINOR)",
                        String::from_utf8_lossy(v)
                    ),
                ));
            }
        },
    };
    if !spec.version.can_serve(requested) {
        let mut r = Rejection::new(
            "unsupported-version",
            format!(
                "unsupported version {requested}; server speaks {}",
                spec.version
            ),
        );
        r.extra = Some((HEADER_VERSION, Bytes::from(spec.version.to_string())));
        return Err(r);
    }
    let ns = header(m, HEADER_NAMESPACE).filter(|v| !v.is_empty());
    let ours = spec.namespace.as_deref().map(str::as_bytes);
    if ns.map(|v| &v[..]) != ours {
        let shown = |n: Option<&[u8]>| match n {
            Some(n) => format!("{:?}", String::from_utf8_lossy(n)),
            None => "none".into(),
        };
        let mut r = Rejection::new(
            "namespace-mismatch",
            format!(
                "namespace mismatch: requested {}, server has {}",
                shown(ns.map(|v| &v[..])),
                shown(ours)
            ),
        );
        r.extra = spec
            .namespace
            .as_ref()
            .map(|n| (HEADER_NAMESPACE, Bytes::copy_from_slice(n.as_bytes())));
        return Err(r);
    }
    Ok(method)
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

/// Checks request `m` against `spec`, runs the handler and returns the reply to send (to the
/// request's reply-to key), or `None` for a cast or fan-out (whose failure is logged).
async fn answer<F, Fut, E>(spec: &Target, handler: &F, m: Message) -> Option<Message>
where
    F: Fn(String, Bytes) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Bytes, E>> + Send + 'static,
    E: fmt::Display + 'static,
{
    let outcome = match accept(spec, &m) {
        Ok(method) => {
            let run = AssertUnwindSafe(handler(method, m.payload.clone())).catch_unwind();
            match run.await {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(e)) => Err(Rejection::new("remote", e.to_string())),
                Err(_) => Err(Rejection::new("remote", "the handler panicked")),
            }
        }
        Err(r) => Err(r),
    };
    if m.reply_to.is_none() {
        if let Err(r) = outcome {
            tracing::warn!(topic = %spec.topic, key = %m.key, kind = r.kind,
                "RPC cast failed: {}", r.message);
        }
        return None;
    }
    let (payload, headers) = match outcome {
        Ok(payload) => (
            payload,
            vec![(HEADER_STATUS.to_string(), Bytes::from_static(b"ok"))],
        ),
        Err(rej) => {
            let mut h = vec![
                (HEADER_STATUS.to_string(), Bytes::from_static(b"error")),
                (
                    HEADER_ERROR.to_string(),
                    Bytes::from_static(rej.kind.as_bytes()),
                ),
            ];
            if let Some((name, value)) = rej.extra {
                h.push((name.to_string(), value));
            }
            (Bytes::from(rej.message), h)
        }
    };
    let mut reply = m.reply(payload)?;
    reply.headers = Some(headers);
    Some(reply)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn versions_parse_print_and_negotiate() {
        let v: Version = "1.3".parse().unwrap();
        assert_eq!(v, Version::new(1, 3));
        assert_eq!(v.to_string(), "1.3");
        for bad in ["1", "1.", ".1", "a.b", "1.2.3", "+1.0", "1.-1", " 1.0", ""] {
            assert!(bad.parse::<Version>().is_err(), "{bad:?} accepted");
        }
        assert!(v.can_serve(Version::new(1, 0)));
        assert!(v.can_serve(Version::new(1, 3)));
        assert!(!v.can_serve(Version::new(1, 4)));
        assert!(!v.can_serve(Version::new(2, 0)));
        assert!(!Version::new(2, 5).can_serve(Version::new(1, 0)));
        assert_eq!(Version::default(), Version::new(1, 0));
    }

    #[test]
    fn keys_follow_the_convention_and_reject_bad_segments() {
        let t = Target::new("calc").server("c1");
        assert_eq!(t.topic_key().unwrap().as_str(), "rpc/calc");
        assert_eq!(t.server_key().unwrap().as_str(), "rpc/calc/server/c1");
        assert_eq!(t.fanout_key().unwrap().as_str(), "rpc/calc/fanout");
        for bad in ["", "a/b", "*", "**", "/a"] {
            assert!(Target::new(bad).topic_key().is_err(), "topic {bad:?}");
            assert!(
                Target::new("t").server(bad).server_key().is_err(),
                "server {bad:?}"
            );
        }
        assert!(Target::new("t").server_key().is_err());
        assert_eq!(Target::new("t").namespace("").namespace, None);
    }

    #[test]
    fn requests_carry_method_version_and_namespace() {
        let t = Target::new("calc")
            .namespace("ns")
            .version(Version::new(2, 1));
        let m = t
            .request(t.topic_key().unwrap(), "add", Bytes::from_static(b"x"))
            .unwrap();
        assert_eq!(header_str(&m, HEADER_METHOD), Some("add"));
        assert_eq!(header_str(&m, HEADER_VERSION), Some("2.1"));
        assert_eq!(header_str(&m, HEADER_NAMESPACE), Some("ns"));
        assert!(t.request(t.topic_key().unwrap(), "", Bytes::new()).is_err());
        let spec = Target::new("calc").server("s").version(Version::new(2, 3));
        assert!(matches!(
            accept(&spec, &m),
            Err(Rejection {
                kind: "namespace-mismatch",
                ..
            })
        ));
        let spec = spec.namespace("ns");
        assert_eq!(accept(&spec, &m).ok().as_deref(), Some("add"));
        let spec = spec.version(Version::new(2, 0));
        let r = accept(&spec, &m).err().unwrap();
        assert_eq!(r.kind, "unsupported-version");
        assert_eq!(r.message, "unsupported version 2.1; server speaks 2.0");
    }
}
