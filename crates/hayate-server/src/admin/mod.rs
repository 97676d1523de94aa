//! The admin HTTP listener (`[admin] listen`, default `127.0.0.1:4780`): a JSON API on the
//! server's state, Prometheus metrics, the live dashboard, and health checks.
//! docs/admin-api.md describes every route; docs/operations.md how to run and scrape it.
//!
//! - `GET /healthz`: 200 while the process serves HTTP. `GET /readyz`: 200 once every
//!   listener accepts, 503 before. Both open to all.
//! - `GET /metrics`: Prometheus text (OpenMetrics 1.0).
//! - `GET /`, `/dashboard`: the dashboard; `GET /api/dashboard`, `/api/events` (SSE): its data.
//! - `GET /api/overview`, `GET /api/connections`, `GET|DELETE /api/connections/{id}`,
//!   `GET /api/subscriptions`, `GET|PUT /api/log`, `POST /api/reload`, `GET /api/groups`,
//!   `GET /api/queues`, `GET|POST /api/streams`, `GET|DELETE /api/streams/{name}`.
//!
//! Every route but the health checks goes through [`guard`]: with users configured
//! (`auth.required`), HTTP Basic credentials (or `Authorization: Bearer <token>`) of a user
//! listed in `[admin] users`, checked by the broker's own authenticator with the client's
//! address (so failed attempts count toward its lock-out as on any protocol); without users,
//! a `Host` that is an IP address or `localhost`; and JSON bodies for POST. At most
//! [`MAX_CONNECTIONS`] connections are served at once; past that, a new connection takes
//! the slot of the oldest one waiting for a request head (else of the oldest whose writes
//! have been blocked for [`WRITE_BLOCKED_CUT`]), or, when every one is in a request, one of
//! [`SPARE_SLOTS`] that answer only the health checks, so an idle flood cannot starve a
//! liveness probe. A connection whose writes make no progress for [`WRITE_TIMEOUT`] is
//! closed.
//!
//! Everything it reads is a snapshot taken under short locks: the connection registry, a
//! listener's traffic class, the broker registry's read lock, and each outbox's lock for as
//! long as it takes to read its queued bytes.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hayate_broker::Broker;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::{Authenticator, Credentials};
use crate::mqtt::Mqtt;
use crate::ops::Ops;

/// What the admin listener serves from.
pub struct AdminState {
    /// The engine.
    pub broker: Broker,
    /// Listeners, connections, readiness.
    pub ops: Arc<Ops>,
    /// The MQTT front-end (its statistics).
    pub mqtt: Arc<Mqtt>,
    /// The broker's users, for the admin's own authentication.
    pub auth: Arc<dyn Authenticator>,
    /// Users allowed (`[admin] users`; a reload replaces them).
    pub users: Arc<std::sync::RwLock<Vec<String>>>,
    /// The process's log filter, when the program lets the API change it.
    pub log: Option<LogControl>,
    /// Reloads the configuration, when the program lets the API do it.
    pub reload: Option<ReloadControl>,
    /// Shared memory offered to native clients (`native.shm`), for its metrics.
    pub shm: Option<Arc<crate::shm::ShmOffer>>,
}

/// Reads the configuration again and applies what can change while running; `Ok` says
/// what was applied.
pub type ReloadControl = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Reads the log filter (`None`) or sets it (`Some(filter)`), returning the filter now.
pub type LogControl = Arc<dyn Fn(Option<&str>) -> Result<String, String> + Send + Sync>;

struct Shared {
    state: AdminState,
    registry: Registry,
    /// What the sampler computed last (rates, history, top keys): the dashboard's data.
    sampled: std::sync::Mutex<Sampled>,
    /// The top key prefixes of the last tick, shared with the metrics collector.
    top_keys: TopKeys,
    /// The listener's connections by slot.
    slots: Arc<Slots>,
}

type TopKeys = Arc<std::sync::Mutex<Vec<(String, f64)>>>;

/// Points of history kept: five minutes at one a second.
const HISTORY: usize = 300;

/// The sampler's state: per-second rates from the counters' differences.
#[derive(Default)]
struct Sampled {
    at: Option<std::time::Instant>,
    /// Per listener: the totals at the last tick.
    listeners: Vec<hayate_io::traffic::Totals>,
    /// Per connection id: its totals at the last tick.
    conns: std::collections::HashMap<u64, hayate_io::traffic::Totals>,
    /// Rates computed at the last tick.
    listener_rates: Vec<(f64, f64)>,
    conn_rates: std::collections::HashMap<u64, (f64, f64)>,
    total: Rates,
    top_keys: Vec<(String, f64)>,
    /// (unix seconds, published msg/s, delivered msg/s).
    history: std::collections::VecDeque<(u64, f64, f64)>,
}

#[derive(Default, Clone, Copy, Serialize)]
struct Rates {
    msgs_in: f64,
    msgs_out: f64,
    bytes_in: f64,
    bytes_out: f64,
}

/// Top key prefixes kept for the dashboard and `/metrics`.
const TOP_KEYS: usize = 10;

/// Serves the admin API on `listener` until `stop` changes.
pub async fn serve(listener: TcpListener, state: AdminState, mut stop: watch::Receiver<bool>) {
    let (app, shared) = router(state);
    let slots = shared.slots.clone();
    let probes = probe_routes(shared.clone());
    // The sampler: rates once a second, for as long as the listener serves.
    let sampler = tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            sample(&shared);
        }
    });
    // hyper's HTTP/1 server with a timer, so that its header read timeout holds: a client
    // that sends a request's head slowly, or keeps a connection idle between requests, is
    // cut off after HEADER_TIMEOUT instead of holding one of the MAX_CONNECTIONS slots.
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEAD);
    // A spare slot's connection: one request, whose head must come within PROBE_TIMEOUT.
    let mut probe_http = hyper::server::conn::http1::Builder::new();
    probe_http
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(PROBE_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        .keep_alive(false);
    let mut conns = tokio::task::JoinSet::new();
    // Once a second, connections whose writes have been blocked for WRITE_TIMEOUT are closed.
    let mut sweep = tokio::time::interval(std::time::Duration::from_secs(1));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (s, addr) = tokio::select! {
            _ = stop.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            _ = sweep.tick() => {
                let stalled = slots.lock().take_stalled();
                for c in stalled {
                    c.abort();
                }
                continue;
            }
            c = accept(&listener) => c,
        };
        // The slot is taken under the table's lock, the task spawned after it: a task
        // spawned while the runtime shuts down is dropped at once, inside `spawn`, and its
        // `Release` takes that lock (a spawn under it deadlocked the listener's shutdown).
        let (kind, id, state, cut) = {
            let mut table = slots.lock();
            let (kind, cut) = table.make_room();
            let Some(kind) = kind else {
                // Every slot, spare ones included, is in a request: closed at once.
                continue;
            };
            let id = table.next_id();
            let state = Arc::new(ConnState::new());
            table.insert(
                kind,
                id,
                Slot {
                    state: state.clone(),
                    abort: None,
                },
            );
            (kind, id, state, cut)
        };
        let io = hyper_util::rt::TokioIo::new(Watched {
            s,
            state: state.clone(),
        });
        let release = Release {
            slots: slots.clone(),
            id,
        };
        let abort = match kind {
            Kind::Served => {
                let app = app
                    .clone()
                    .layer(axum::Extension(axum::extract::ConnectInfo(Peer(addr))));
                let conn = http.serve_connection(io, Marked::new(app, state));
                conns.spawn(async move {
                    let _release = release;
                    if let Err(e) = conn.await {
                        tracing::debug!(peer = %addr, "admin connection: {e}");
                    }
                })
            }
            Kind::Spare => {
                let conn = probe_http.serve_connection(io, Marked::new(probes.clone(), state));
                conns.spawn(async move {
                    let _release = release;
                    if let Err(e) = conn.await {
                        tracing::debug!(peer = %addr, "admin connection (spare slot): {e}");
                    }
                })
            }
        };
        // Only this loop takes slots out (make_room, take_stalled), so the handle is in
        // place before anyone may need it; a task already ended has removed its slot.
        slots.lock().set_abort(kind, id, abort);
        if let Some(cut) = cut {
            cut.abort();
        }
        // The connection's task reads what it was sent before the next accept: a client
        // that sent its request with its connection is never taken for an idle one.
        tokio::task::yield_now().await;
    }
    conns.abort_all();
    sampler.abort();
}

/// The next connection (an accept that fails is retried after 50 ms).
async fn accept(listener: &TcpListener) -> (tokio::net::TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((s, a)) => {
                let _ = s.set_nodelay(true);
                // A fixed send buffer (no autotuning up to tcp_wmem's 4 MiB): what a client
                // that reads nothing pins in the kernel is bounded, and its writes block soon.
                let _ = socket2::SockRef::from(&s).set_send_buffer_size(SEND_BUFFER);
                return (s, a);
            }
            Err(e) => {
                tracing::debug!("admin listener: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// How long a request's head (request line and headers) may take to arrive, and how long
/// a connection may stay idle between requests.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a request's body may take to arrive (after its head).
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest request head the admin listener reads: past it, the request is refused
/// (431) and the connection closed.
pub const MAX_HEAD: usize = 16 * 1024;

/// The largest request body the admin API takes (a stream definition, a log filter).
pub const MAX_BODY: usize = 64 * 1024;

/// Admin connections served at once, at most (besides [`SPARE_SLOTS`]). When all are taken,
/// a new connection takes the slot of the oldest one waiting for a request head (idle
/// between requests, or never sent a whole head), else of the oldest whose writes have been
/// blocked for [`WRITE_BLOCKED_CUT`], which is closed; when there is neither, it gets a
/// spare slot.
pub const MAX_CONNECTIONS: usize = 64;

/// Connections kept for health checks when every one of the [`MAX_CONNECTIONS`] slots is in
/// a request: one request each, its head within [`PROBE_TIMEOUT`]; `GET /healthz` and
/// `GET /readyz` are answered, anything else gets 503, and the connection is closed. When
/// these are taken too, the oldest of them waiting for a head is closed to make room; a new
/// connection is closed at once only when every slot is in a request.
pub const SPARE_SLOTS: usize = 8;

/// How long a connection's writes may make no progress (its client reads nothing) before
/// it is closed, whatever slots are free.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The send buffer asked for each admin connection's socket (Linux doubles it).
pub const SEND_BUFFER: usize = 64 * 1024;

/// When every slot is taken and none waits for a request head, a connection whose writes
/// have been blocked this long (its client reads nothing) is closed for a new one.
pub const WRITE_BLOCKED_CUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a spare slot's connection may take to send its request head.
pub const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

mod slots;
use slots::{ConnState, Kind, Marked, Release, Slot, Slots, Watched};

/// The client's address, for handlers and the guard.
#[derive(Clone, Copy, Debug)]
struct Peer(std::net::SocketAddr);

/// One tick of the sampler: rates over the time since the last one.
fn sample(s: &Shared) {
    let now = std::time::Instant::now();
    let listeners: Vec<_> = s
        .state
        .ops
        .listeners
        .iter()
        .map(|l| l.traffic.totals())
        .collect();
    let conns: std::collections::HashMap<u64, _> = s
        .state
        .ops
        .conns
        .list()
        .iter()
        .map(|e| (e.id, e.traffic()))
        .collect();
    let keys = s.state.broker.key_sampler().take();
    let mut g = s
        .sampled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let secs =
        g.at.map(|t| now.duration_since(t).as_secs_f64())
            .unwrap_or(0.0);
    let rate = |new: u64, old: u64| {
        if secs > 0.0 {
            new.saturating_sub(old) as f64 / secs
        } else {
            0.0
        }
    };
    let mut total = Rates::default();
    let mut listener_rates = Vec::with_capacity(listeners.len());
    for (i, t) in listeners.iter().enumerate() {
        let old = g.listeners.get(i).copied().unwrap_or(*t);
        let r = Rates {
            msgs_in: rate(t.msgs_in, old.msgs_in),
            msgs_out: rate(t.msgs_out, old.msgs_out),
            bytes_in: rate(t.bytes_in, old.bytes_in),
            bytes_out: rate(t.bytes_out, old.bytes_out),
        };
        total.msgs_in += r.msgs_in;
        total.msgs_out += r.msgs_out;
        total.bytes_in += r.bytes_in;
        total.bytes_out += r.bytes_out;
        listener_rates.push((r.msgs_in, r.msgs_out));
    }
    let conn_rates = conns
        .iter()
        .map(|(id, t)| {
            // A connection new since the last tick starts at 0 (a resumed MQTT session
            // brings its whole past count).
            let old = g.conns.get(id).copied().unwrap_or(*t);
            (
                *id,
                (rate(t.msgs_in, old.msgs_in), rate(t.msgs_out, old.msgs_out)),
            )
        })
        .collect();
    g.top_keys = keys
        .into_iter()
        .take(TOP_KEYS)
        .map(|(k, c)| (k, if secs > 0.0 { c as f64 / secs } else { 0.0 }))
        .collect();
    let unix = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if g.at.is_some() {
        g.history.push_back((unix, total.msgs_in, total.msgs_out));
        while g.history.len() > HISTORY {
            g.history.pop_front();
        }
    }
    *s.top_keys
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = g.top_keys.clone();
    g.at = Some(now);
    g.listeners = listeners;
    g.conns = conns;
    g.listener_rates = listener_rates;
    g.conn_rates = conn_rates;
    g.total = total;
}

/// Everything the dashboard shows, as one JSON document.
fn dashboard_json(s: &Shared) -> Value {
    let conns = conn_views(s, None);
    let queues = s.state.broker.declared_queues();
    let streams: Vec<Value> = s
        .state
        .broker
        .streams()
        .iter()
        .map(|st| {
            let i = st.info();
            let consumers: Vec<Value> = st
                .consumer_list()
                .iter()
                .map(|c| json!({ "name": c.config().name, "pending": c.info().pending }))
                .collect();
            json!({ "name": st.name(), "records": i.records, "bytes": i.bytes, "consumers": consumers })
        })
        .collect();
    let overview = overview_json(s);
    let mut listeners = listener_views(s);
    // Only what the sampler computed is read under its lock.
    let g = s
        .sampled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for (l, r) in listeners.iter_mut().zip(&g.listener_rates) {
        l["msgs_in_rate"] = json!(r.0);
        l["msgs_out_rate"] = json!(r.1);
    }
    let connections: Vec<Value> = conns
        .into_iter()
        .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
        .collect();
    json!({
        "overview": overview,
        "rates": g.total,
        "listeners": listeners,
        "connections": connections,
        "top_keys": g.top_keys.iter().map(|(k, r)| json!({ "prefix": k, "rate": r })).collect::<Vec<_>>(),
        "streams": streams,
        "queue_dropped": queues.iter().map(|q| q.3).sum::<u64>(),
        "history": g.history.iter().map(|(t, i, o)| json!([t, i, o])).collect::<Vec<_>>(),
    })
}

async fn dashboard_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("dashboard.html"),
    )
        .into_response()
}

async fn dashboard_data(State(s): St) -> Response {
    axum::Json(dashboard_json(&s)).into_response()
}

/// Server-sent events: the dashboard's document once a second.
async fn events(State(s): St) -> Response {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let stream = futures::stream::unfold((s, true), |(s, first)| async move {
        if !first {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let ev = Event::default().data(dashboard_json(&s).to_string());
        Some((Ok::<_, std::convert::Infallible>(ev), (s, false)))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The routes, and the state the sampler keeps up to date.
fn router(state: AdminState) -> (Router, Arc<Shared>) {
    let mut registry = Registry::default();
    let top_keys = TopKeys::default();
    let slots = Arc::new(Slots::default());
    let metrics = Metrics {
        broker: state.broker.clone(),
        ops: state.ops.clone(),
        mqtt: state.mqtt.clone(),
        shm: state.shm.clone(),
        top_keys: top_keys.clone(),
        slots: slots.clone(),
    };
    registry.register_collector(Box::new(metrics));
    let shared = Arc::new(Shared {
        state,
        registry,
        sampled: std::sync::Mutex::new(Sampled::default()),
        top_keys,
        slots,
    });
    (routes(shared.clone()), shared)
}

fn routes(shared: Arc<Shared>) -> Router {
    // Everything but the health checks goes through `guard` (credentials, origin).
    let guarded = Router::new()
        .route("/", get(dashboard_page))
        .route("/dashboard", get(dashboard_page))
        .route("/api/dashboard", get(dashboard_data))
        .route("/api/events", get(events))
        .route("/metrics", get(metrics_text))
        .route("/api/overview", get(overview))
        .route("/api/connections", get(connections))
        .route(
            "/api/connections/{id}",
            get(connection).delete(close_connection),
        )
        .route("/api/log", get(log_get).put(log_put))
        .route("/api/reload", axum::routing::post(reload))
        .route("/api/groups", get(groups))
        .route("/api/subscriptions", get(subscriptions))
        .route("/api/queues", get(queues))
        .route("/api/streams", get(streams).post(create_stream))
        .route("/api/streams/{name}", get(stream).delete(delete_stream))
        .route_layer(axum::middleware::from_fn_with_state(shared.clone(), guard))
        // Bodies without a length (chunked) are cut at the same limit.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(guarded)
        .with_state(shared)
}

/// What a spare slot's connection is answered: the health checks, and 503 for the rest.
fn probe_routes(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "every admin connection slot is in use ({MAX_CONNECTIONS}); only /healthz \
                     and /readyz are answered now"
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            r
        })
        .with_state(shared)
}

/// In front of every route but the health checks:
/// - with users configured, the credentials of an `[admin] users` user, checked with the
///   client's address (so failed attempts count toward its lock-out, as on every protocol);
/// - without users (an open API), a `Host` that is an IP address or `localhost`: a web page
///   on a name that resolves to 127.0.0.1 (DNS rebinding) cannot read or act through the
///   visitor's browser;
/// - a body sent with POST must be `application/json`, which a cross-site HTML form cannot
///   send (and fetch cannot without a CORS preflight this listener never allows).
async fn guard(
    State(s): St,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .map(|c| c.0.0.ip());
    if let Err(r) = authorize(&s, req.headers(), peer).await {
        return r;
    }
    if !s.state.auth.required() && !local_host(req.headers()) {
        return error(
            StatusCode::FORBIDDEN,
            "without users configured, the admin API answers only requests for an IP \
             address or localhost (Host header)",
        );
    }
    // A body announced past the limit is refused before any of it is read (a client that
    // announces 100 MiB and sends a byte would otherwise hold the connection).
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request bodies are at most {MAX_BODY} bytes"),
        );
    }
    if req.method() == axum::http::Method::POST {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        if !json {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "POST bodies must be Content-Type: application/json",
            );
        }
    }
    // The body, read whole here within BODY_TIMEOUT (a client that sends its head and then
    // trickles the body would otherwise hold the connection for as long as it likes).
    let (parts, body) = req.into_parts();
    let body = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request bodies are at most {MAX_BODY} bytes"),
            );
        }
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
            );
        }
    };
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(body),
    ))
    .await
}

/// Whether the request's `Host` names an IP address or `localhost` (with or without a port).
fn local_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        // HTTP/1.0 without Host: not a browser's request.
        return true;
    };
    let name = if let Some(rest) = host.strip_prefix('[') {
        // [v6]:port
        return rest
            .split(']')
            .next()
            .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok());
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

type St = State<Arc<Shared>>;

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": msg.into() }))).into_response()
}

/// Checks the request's credentials when the broker has users; `Err` is the answer.
async fn authorize(
    s: &Shared,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<(), Response> {
    let st = &s.state;
    if !st.auth.required() {
        return Ok(());
    }
    let unauthorized = || {
        let mut r = error(StatusCode::UNAUTHORIZED, "credentials required");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"hayate admin\""),
        );
        r
    };
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(unauthorized());
    };
    let (user, password, token);
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    if scheme.eq_ignore_ascii_case("Basic") {
        let b = rest;
        let decoded = decode_base64(b.trim()).ok_or_else(unauthorized)?;
        let text = String::from_utf8(decoded).map_err(|_| unauthorized())?;
        let (u, p) = text.split_once(':').ok_or_else(unauthorized)?;
        (user, password, token) = (Some(u.to_string()), Some(p.as_bytes().to_vec()), None);
    } else if scheme.eq_ignore_ascii_case("Bearer") {
        let t = rest;
        (user, password, token) = (None, None, Some(t.trim().as_bytes().to_vec()));
    } else {
        return Err(unauthorized());
    }
    let creds = Credentials {
        user: user.as_deref(),
        password: password.as_deref(),
        token: token.as_deref(),
        peer,
        verified: None,
    };
    let id = match st.auth.authenticate("admin", creds).await {
        Ok(id) => id,
        Err(crate::auth::AuthError::Throttled) => {
            return Err(error(
                StatusCode::TOO_MANY_REQUESTS,
                crate::auth::AuthError::Throttled.to_string(),
            ));
        }
        Err(crate::auth::AuthError::Busy) => {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                crate::auth::AuthError::Busy.to_string(),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            return Err(r);
        }
        Err(_) => return Err(unauthorized()),
    };
    match id.user.as_deref() {
        Some(u)
            if st
                .users
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .any(|a| a == u) =>
        {
            Ok(())
        }
        Some(u) => {
            tracing::info!(user = u, "admin API refused: not in [admin] users");
            Err(error(
                StatusCode::FORBIDDEN,
                format!("user {u} is not in [admin] users"),
            ))
        }
        None => Err(unauthorized()),
    }
}

/// Standard base64 (with or without padding); `None` for anything else.
fn decode_base64(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    if s.len() > 4096 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

async fn readyz(State(s): St) -> Response {
    if s.state.ops.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn metrics_text(State(s): St) -> Response {
    let mut body = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut body, &s.registry) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// One connection as the API shows it.
#[derive(Debug, Serialize)]
struct ConnView {
    id: u64,
    protocol: &'static str,
    listener: String,
    peer: Option<String>,
    user: Option<String>,
    client_id: Option<String>,
    /// Seconds since the Unix epoch.
    since: u64,
    session: Option<u64>,
    subscriptions: usize,
    outbox_bytes: usize,
    msgs_in: u64,
    bytes_in: u64,
    msgs_out: u64,
    bytes_out: u64,
    calls: u64,
    replies: u64,
    /// Messages per second in and out over the sampler's last second.
    msgs_in_rate: f64,
    msgs_out_rate: f64,
    closing: bool,
}

fn conn_views(s: &Shared, only: Option<u64>) -> Vec<ConnView> {
    let subs = s.state.broker.subscriptions_by_session();
    let rates = s
        .sampled
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .conn_rates
        .clone();
    let list = match only {
        Some(id) => s.state.ops.conns.get(id).into_iter().collect(),
        None => s.state.ops.conns.list(),
    };
    list.into_iter()
        .map(|e| {
            let t = e.traffic();
            let session = e.session_id();
            ConnView {
                id: e.id,
                protocol: e.protocol,
                listener: e.listener.clone(),
                peer: e.peer.map(|a| a.to_string()),
                user: e.user(),
                client_id: e.client_id(),
                since: e
                    .since
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
                session,
                subscriptions: session.and_then(|id| subs.get(&id).copied()).unwrap_or(0),
                outbox_bytes: e.queued_bytes(),
                msgs_in: t.msgs_in,
                bytes_in: t.bytes_in,
                msgs_out: t.msgs_out,
                bytes_out: t.bytes_out,
                calls: t.calls,
                replies: t.replies,
                msgs_in_rate: rates.get(&e.id).map_or(0.0, |r| r.0),
                msgs_out_rate: rates.get(&e.id).map_or(0.0, |r| r.1),
                closing: e.is_closing(),
            }
        })
        .collect()
}

async fn connections(State(s): St) -> Response {
    axum::Json(conn_views(&s, None)).into_response()
}

fn parse_id(id: &str) -> Result<u64, Box<Response>> {
    id.parse().map_err(|_| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a connection id"),
        ))
    })
}

async fn connection(State(s): St, Path(id): Path<String>) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    match conn_views(&s, Some(id)).pop() {
        Some(v) => axum::Json(v).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no connection {id}")),
    }
}

async fn close_connection(State(s): St, Path(id): Path<String>) -> Response {
    let id = match parse_id(&id) {
        Ok(id) => id,
        Err(r) => return *r,
    };
    match s.state.ops.conns.get(id) {
        Some(e) => {
            tracing::info!(
                id,
                protocol = e.protocol,
                peer = ?e.peer,
                user = ?e.user(),
                "connection closed by the admin API"
            );
            e.close();
            (
                StatusCode::ACCEPTED,
                axum::Json(json!({ "id": id, "closing": true })),
            )
                .into_response()
        }
        None => error(StatusCode::NOT_FOUND, format!("no connection {id}")),
    }
}

fn listener_views(s: &Shared) -> Vec<Value> {
    let live = s.state.ops.connections_per_listener();
    s.state
        .ops
        .listeners
        .iter()
        .zip(live)
        .map(|(l, live)| {
            let t = l.traffic.totals();
            json!({
                "protocol": l.protocol,
                "addr": l.addr,
                "connections": live,
                "accepted": l.accepted.load(std::sync::atomic::Ordering::Relaxed),
                "refused": l.refused.load(std::sync::atomic::Ordering::Relaxed),
                "msgs_in": t.msgs_in,
                "bytes_in": t.bytes_in,
                "msgs_out": t.msgs_out,
                "bytes_out": t.bytes_out,
                "calls": t.calls,
                "replies": t.replies,
            })
        })
        .collect()
}

async fn overview(State(s): St) -> Response {
    axum::Json(overview_json(&s)).into_response()
}

fn overview_json(s: &Shared) -> Value {
    let b = &s.state.broker;
    let stats = b.stats();
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let mem = &b.config().memory;
    let latency = stats.delivery_latency.snapshot();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": s.state.ops.uptime_secs(),
        "ready": s.state.ops.is_ready(),
        "connections": s.state.ops.conns.len(),
        "subscriptions": b.subscription_count(),
        "listeners": listener_views(s),
        "memory": {
            "used": mem.used(),
            "peak": mem.peak(),
            "limit": mem.limit(),
            "refused": mem.refused(),
        },
        "broker": {
            "sessions_opened": ld(&stats.sessions_opened),
            "dropped": ld(&stats.dropped),
            "unplaced": ld(&stats.unplaced),
            "stalls": ld(&stats.stalls),
            "slow_consumers": ld(&stats.slow_consumers),
        },
        "mqtt": {
            "connected": ld(&s.state.mqtt.stats.connected),
            "connections": ld(&s.state.mqtt.stats.connections),
            "held_messages": ld(&s.state.mqtt.stats.held.messages),
            "held_bytes": ld(&s.state.mqtt.stats.held.bytes),
        },
        "delivery_latency": {
            "count": latency.count,
            "p50": latency.quantile(0.5),
            "p99": latency.quantile(0.99),
            "p999": latency.quantile(0.999),
        },
    })
}

async fn log_get(State(s): St) -> Response {
    match &s.state.log {
        None => error(
            StatusCode::NOT_FOUND,
            "this program does not expose its log filter",
        ),
        Some(c) => match c(None) {
            Ok(f) => axum::Json(json!({ "filter": f })).into_response(),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
        },
    }
}

/// Sets the log filter: the body is the filter text (`info,hayate_server::mqtt=debug`).
async fn log_put(State(s): St, body: axum::body::Bytes) -> Response {
    let Some(c) = &s.state.log else {
        return error(
            StatusCode::NOT_FOUND,
            "this program does not expose its log filter",
        );
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return error(StatusCode::BAD_REQUEST, "the filter is not UTF-8");
    };
    match c(Some(text.trim())) {
        Ok(f) => {
            tracing::info!(filter = %f, "log filter set by the admin API");
            axum::Json(json!({ "filter": f })).into_response()
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// Reloads the configuration (as SIGHUP does).
async fn reload(State(s): St) -> Response {
    let Some(c) = s.state.reload.clone() else {
        return error(
            StatusCode::NOT_FOUND,
            "this program does not reload its configuration",
        );
    };
    match tokio::task::spawn_blocking(move || c()).await {
        Ok(Ok(applied)) => {
            tracing::info!("configuration reloaded by the admin API: {applied}");
            axum::Json(json!({ "reloaded": true, "applied": applied })).into_response()
        }
        Ok(Err(e)) => {
            tracing::warn!("configuration reload refused: {e}");
            error(StatusCode::BAD_REQUEST, e)
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /api/subscriptions` filters.
#[derive(Debug, serde::Deserialize)]
struct SubQuery {
    key: Option<String>,
    expr: Option<String>,
    group: Option<String>,
    connection: Option<u64>,
    limit: Option<usize>,
}

/// Most subscriptions one answer lists (`limit` is capped to it).
const MAX_LISTED: usize = 10_000;

async fn subscriptions(State(s): St, q: axum::extract::Query<SubQuery>) -> Response {
    let key = match q.key.as_deref().map(hayate_core::Key::new).transpose() {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("key: {e}")),
    };
    let expr = match q.expr.as_deref().map(hayate_core::KeyExpr::new).transpose() {
        Ok(x) => x,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("expr: {e}")),
    };
    let conns = s.state.ops.conns.list();
    let session = match q.connection {
        None => None,
        Some(id) => match conns.iter().find(|c| c.id == id) {
            None => return error(StatusCode::NOT_FOUND, format!("no connection {id}")),
            // Before its session is open a connection has no subscriptions.
            Some(c) => Some(c.session_id().unwrap_or(0)),
        },
    };
    let limit = q.limit.unwrap_or(1000).min(MAX_LISTED);
    let (subs, total) = s.state.broker.subscriptions(hayate_broker::SubFilter {
        session,
        key: key.as_ref(),
        expr: expr.as_ref(),
        group: q.group.as_deref(),
        limit,
    });
    let by_session: std::collections::HashMap<u64, u64> = conns
        .iter()
        .filter_map(|c| c.session_id().map(|sid| (sid, c.id)))
        .collect();
    let list: Vec<Value> = subs
        .into_iter()
        .map(|v| {
            json!({
                "connection": by_session.get(&v.session),
                "session": v.session,
                "sid": v.sid,
                "expr": v.expr,
                "group": v.group,
                "ack": v.ack,
                "congestion": if v.drop { "drop" } else { "block" },
            })
        })
        .collect();
    axum::Json(json!({ "total": total, "subscriptions": list })).into_response()
}

async fn groups(State(s): St) -> Response {
    let v: Vec<Value> = s
        .state
        .broker
        .queue_groups()
        .into_iter()
        .map(|(name, expr, members)| json!({ "name": name, "expr": expr, "members": members }))
        .collect();
    axum::Json(v).into_response()
}

async fn queues(State(s): St) -> Response {
    let v: Vec<Value> = s
        .state
        .broker
        .declared_queues()
        .into_iter()
        .map(|(name, expr, waiting, dropped)| {
            json!({ "name": name, "expr": expr, "waiting": waiting, "dropped": dropped })
        })
        .collect();
    axum::Json(v).into_response()
}

fn stream_view(st: &hayate_broker::Stream) -> Value {
    let consumers: Vec<Value> = st
        .consumer_list()
        .iter()
        .map(|c| json!({ "name": c.config().name, "config": c.config(), "state": c.info() }))
        .collect();
    json!({ "name": st.name(), "info": st.info(), "consumers": consumers })
}

async fn streams(State(s): St) -> Response {
    let v: Vec<Value> = s
        .state
        .broker
        .streams()
        .iter()
        .map(|st| stream_view(st))
        .collect();
    axum::Json(v).into_response()
}

async fn stream(State(s): St, Path(name): Path<String>) -> Response {
    match s.state.broker.stream(&name) {
        Some(st) => axum::Json(stream_view(&st)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no stream {name}")),
    }
}

/// Creates a stream: the body is the definition `hayate stream add` sends (docs/protocol.md,
/// "Stream API"). File work: on the blocking pool.
async fn create_stream(State(s): St, body: axum::body::Bytes) -> Response {
    let broker = s.state.broker.clone();
    let key = format!("{}add", hayate_broker::stream::api::STREAM_API);
    match tokio::task::spawn_blocking(move || {
        hayate_broker::stream::api::handle(&broker, &key, &body, None)
    })
    .await
    {
        Ok(r) if r.ok => (StatusCode::CREATED, axum::Json(r)).into_response(),
        Ok(r) => (StatusCode::BAD_REQUEST, axum::Json(r)).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn delete_stream(State(s): St, Path(name): Path<String>) -> Response {
    let broker = s.state.broker.clone();
    let n = name.clone();
    match tokio::task::spawn_blocking(move || broker.delete_stream(&n)).await {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(hayate_broker::StreamError::NotFound(_))) => {
            error(StatusCode::NOT_FOUND, format!("no stream {name}"))
        }
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The Prometheus collector: every figure read at scrape time.
struct Metrics {
    broker: Broker,
    ops: Arc<Ops>,
    mqtt: Arc<Mqtt>,
    shm: Option<Arc<crate::shm::ShmOffer>>,
    top_keys: TopKeys,
    slots: Arc<Slots>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, u64)],
) -> Result<(), std::fmt::Error> {
    let m = ConstCounter::new(0u64);
    let mut enc = e.encode_descriptor(name, help, None, m.metric_type())?;
    match rows {
        [(labels, v)] if labels.is_empty() => ConstCounter::new(*v).encode(enc)?,
        _ => {
            for (labels, v) in rows {
                ConstCounter::new(*v).encode(enc.encode_family(labels)?)?;
            }
        }
    }
    Ok(())
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &[(Vec<(&str, String)>, f64)],
) -> Result<(), std::fmt::Error> {
    let m = ConstGauge::new(0f64);
    let mut enc = e.encode_descriptor(name, help, None, m.metric_type())?;
    match rows {
        [(labels, v)] if labels.is_empty() => ConstGauge::new(*v).encode(enc)?,
        _ => {
            for (labels, v) in rows {
                ConstGauge::new(*v).encode(enc.encode_family(labels)?)?;
            }
        }
    }
    Ok(())
}

fn histogram(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &hayate_broker::latency::LatencySnapshot,
) -> Result<(), std::fmt::Error> {
    let mut enc = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    enc.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        h.sum, h.count, &h.buckets, None,
    )
}

impl Collector for Metrics {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let none = Vec::<(&str, String)>::new;
        let conns = self.ops.conns.list();
        let mut per_listener = Vec::new();
        let mut live = Vec::new();
        let mut accepted = Vec::new();
        let mut refused = Vec::new();
        let counts = self.ops.connections_per_listener();
        for (l, n) in self.ops.listeners.iter().zip(counts) {
            let labels = vec![
                ("protocol", l.protocol.to_string()),
                ("listener", l.addr.clone()),
            ];
            per_listener.push((labels.clone(), l.traffic.totals()));
            live.push((labels.clone(), n as f64));
            accepted.push((labels.clone(), l.accepted.load(Relaxed)));
            refused.push((labels, l.refused.load(Relaxed)));
        }
        let rows = |f: fn(&hayate_io::traffic::Totals) -> u64| -> Vec<(Vec<(&str, String)>, u64)> {
            per_listener
                .iter()
                .map(|(l, t)| (l.clone(), f(t)))
                .collect()
        };
        gauge(
            &mut e,
            "hayate_build_info",
            "The broker's version (the value is 1).",
            &[(
                vec![("version", env!("CARGO_PKG_VERSION").to_string())],
                1.0,
            )],
        )?;
        gauge(
            &mut e,
            "hayate_uptime_seconds",
            "Seconds since the server started.",
            &[(none(), self.ops.uptime_secs())],
        )?;
        counter(
            &mut e,
            "hayate_messages_received",
            "Messages published by clients, per listener.",
            &rows(|t| t.msgs_in),
        )?;
        counter(
            &mut e,
            "hayate_received_payload_bytes",
            "Payload bytes of the messages published by clients, per listener.",
            &rows(|t| t.bytes_in),
        )?;
        counter(
            &mut e,
            "hayate_messages_sent",
            "Messages delivered to clients (queued for their connection), per listener.",
            &rows(|t| t.msgs_out),
        )?;
        counter(
            &mut e,
            "hayate_sent_payload_bytes",
            "Payload bytes of the messages delivered to clients, per listener.",
            &rows(|t| t.bytes_out),
        )?;
        counter(
            &mut e,
            "hayate_rpc_calls",
            "Requests published by clients (messages carrying a reply-to), per listener.",
            &rows(|t| t.calls),
        )?;
        counter(
            &mut e,
            "hayate_rpc_replies",
            "Replies published by clients (messages to a reply inbox, _inbox/...), per listener.",
            &rows(|t| t.replies),
        )?;
        gauge(
            &mut e,
            "hayate_connections",
            "Connections open now, per listener.",
            &live,
        )?;
        counter(
            &mut e,
            "hayate_connections_accepted",
            "Connections accepted, per listener.",
            &accepted,
        )?;
        counter(
            &mut e,
            "hayate_connections_refused",
            "Connections refused by a connection limit before any byte was read.",
            &refused,
        )?;
        let outbox: usize = conns.iter().map(|c| c.queued_bytes()).sum();
        gauge(
            &mut e,
            "hayate_outbox_bytes",
            "Bytes queued for clients and not yet written, all connections.",
            &[(none(), outbox as f64)],
        )?;
        let b = &self.broker;
        gauge(
            &mut e,
            "hayate_subscriptions",
            "Subscriptions, all protocols.",
            &[(none(), b.subscription_count() as f64)],
        )?;
        let groups = b.queue_groups();
        gauge(
            &mut e,
            "hayate_queue_groups",
            "Queue groups with at least one member.",
            &[(none(), groups.len() as f64)],
        )?;
        let st = b.stats();
        let queues = b.declared_queues();
        let queue_dropped: u64 = queues.iter().map(|q| q.3).sum();
        counter(
            &mut e,
            "hayate_dropped_messages",
            "Messages dropped, by reason: outbox_full (a drop subscriber's outbox was full, \
             or its stall policy dropped), queue_full (a declared queue without members was \
             full), unplaced (a queue group's members all left while it was routed).",
            &[
                (
                    vec![("reason", "outbox_full".to_string())],
                    st.dropped.load(Relaxed),
                ),
                (vec![("reason", "queue_full".to_string())], queue_dropped),
                (
                    vec![("reason", "unplaced".to_string())],
                    st.unplaced.load(Relaxed),
                ),
            ],
        )?;
        counter(
            &mut e,
            "hayate_slow_consumers",
            "Connections cut off as slow consumers (blocked past limits.max_block_ms).",
            &[(none(), st.slow_consumers.load(Relaxed))],
        )?;
        counter(
            &mut e,
            "hayate_stalls",
            "Times a block subscriber's full outbox made a publisher wait.",
            &[(none(), st.stalls.load(Relaxed))],
        )?;
        counter(
            &mut e,
            "hayate_sessions_opened",
            "Broker sessions opened (every protocol; MQTT persistent sessions once).",
            &[(none(), st.sessions_opened.load(Relaxed))],
        )?;
        histogram(
            &mut e,
            "hayate_delivery_latency_seconds",
            "Time from a publish reaching the broker to its delivery being written to a \
             subscriber's socket (one publish in 16 per session timed, each subscriber's \
             outbox timing one at a time).",
            &st.delivery_latency.snapshot(),
        )?;
        let mem = &b.config().memory;
        gauge(
            &mut e,
            "hayate_memory_used_bytes",
            "Bytes charged to the broker-wide memory budget now.",
            &[(none(), mem.used() as f64)],
        )?;
        gauge(
            &mut e,
            "hayate_memory_limit_bytes",
            "The broker-wide memory budget (limits.memory_budget).",
            &[(none(), mem.limit() as f64)],
        )?;
        counter(
            &mut e,
            "hayate_memory_refused",
            "Requests the memory budget refused.",
            &[(none(), mem.refused())],
        )?;
        let (open, cut) = {
            let t = self.slots.lock();
            (t.open(), t.cut)
        };
        gauge(
            &mut e,
            "hayate_admin_connections",
            "Admin listener connections open now, spare slots included.",
            &[(none(), open as f64)],
        )?;
        counter(
            &mut e,
            "hayate_admin_connections_cut",
            "Admin connections closed to make room for new ones (waiting for a request head, \
             or writes blocked for 1 s, when every slot was taken), new ones closed when \
             every slot was in a request, and connections whose writes made no progress \
             for 10 s.",
            &[(none(), cut)],
        )?;
        if let Some(shm) = &self.shm {
            gauge(
                &mut e,
                "hayate_shm_connections",
                "Native connections on shared memory now (native.shm_max_connections at most).",
                &[(none(), shm.active() as f64)],
            )?;
            if let Some(st) = shm.fanout_stats() {
                counter(
                    &mut e,
                    "hayate_shm_fanout_entries",
                    "Entries written to the fan-out arenas: one per message (or publisher's \
                     batch) for all of a user's shared-memory subscribers.",
                    &[(none(), st.entries.load(Relaxed))],
                )?;
                counter(
                    &mut e,
                    "hayate_shm_fanout_refs",
                    "Deliveries by reference to the fan-out arena (MSG_REF frames).",
                    &[(none(), st.refs.load(Relaxed))],
                )?;
                counter(
                    &mut e,
                    "hayate_shm_fanout_copies",
                    "Deliveries large enough for the arena sent as copies: no room in it, or \
                     the client held its quota (a quarter).",
                    &[(none(), st.copies.load(Relaxed))],
                )?;
            }
        }
        gauge(
            &mut e,
            "hayate_mqtt_clients_connected",
            "MQTT clients connected now.",
            &[(none(), self.mqtt.stats.connected.load(Relaxed) as f64)],
        )?;
        let held = &self.mqtt.stats.held;
        gauge(
            &mut e,
            "hayate_mqtt_held_messages",
            "QoS 1 and 2 deliveries MQTT sessions hold now: in flight (not yet acknowledged), \
             waiting for the in-flight window, or queued for offline persistent sessions.",
            &[(none(), held.messages.load(Relaxed) as f64)],
        )?;
        gauge(
            &mut e,
            "hayate_mqtt_held_bytes",
            "Payload and topic bytes of the deliveries in hayate_mqtt_held_messages.",
            &[(none(), held.bytes.load(Relaxed) as f64)],
        )?;
        let streams = b.streams();
        let mut records = Vec::new();
        let mut bytes = Vec::new();
        let mut pending = Vec::new();
        for s in &streams {
            let i = s.info();
            let l = vec![("stream", s.name().to_string())];
            records.push((l.clone(), i.records as f64));
            bytes.push((l, i.bytes as f64));
            for c in s.consumer_list() {
                let ci = c.info();
                pending.push((
                    vec![
                        ("stream", s.name().to_string()),
                        ("consumer", c.config().name.clone()),
                    ],
                    ci.pending as f64,
                ));
            }
        }
        gauge(
            &mut e,
            "hayate_stream_records",
            "Records a stream holds.",
            &records,
        )?;
        gauge(
            &mut e,
            "hayate_stream_bytes",
            "Bytes a stream holds.",
            &bytes,
        )?;
        gauge(
            &mut e,
            "hayate_consumer_pending",
            "Records of its stream a durable consumer has not yet been given (its lag).",
            &pending,
        )?;
        let top: Vec<_> = self
            .top_keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(k, r)| (vec![("prefix", k.clone())], *r))
            .collect();
        gauge(
            &mut e,
            "hayate_top_key_prefix_rate",
            "Messages per second published on the busiest key prefixes (first two levels; at \
             most 10, sampled one publish in 16 per session, over the last second).",
            &top,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::decode_base64;

    #[test]
    fn base64() {
        assert_eq!(decode_base64("YWxpY2U6cHc=").unwrap(), b"alice:pw");
        assert_eq!(decode_base64("YWxpY2U6cHc").unwrap(), b"alice:pw");
        assert_eq!(decode_base64("").unwrap(), b"");
        assert!(decode_base64("a b").is_none());
        assert!(decode_base64(&"A".repeat(5000)).is_none());
    }
}
