//! The admin API's routes and the handlers of its JSON API: overview, connections,
//! subscriptions, log filter, reload, queue groups, queues and streams.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hayate_core::sync::lock;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde_json::{Value, json};

use super::dashboard::{Sampled, TopKeys, dashboard_data, dashboard_page, events};
use super::guard::guard;
use super::metrics::{Metrics, metrics_text};
use super::slots::Slots;
use super::{AdminState, MAX_BODY, MAX_CONNECTIONS, Shared, St, error};

/// The routes, and the state the sampler keeps up to date.
pub(super) fn router(state: AdminState) -> (Router, Arc<Shared>) {
    let mut registry = Registry::default();
    let top_keys = TopKeys::default();
    let slots = Arc::new(Slots::default());
    let metrics = Metrics {
        broker: state.broker.clone(),
        ops: state.ops.clone(),
        figures: state.figures.clone(),
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
        .route(
            "/api/queues/{ns}/{*name}",
            axum::routing::delete(delete_queue),
        )
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
pub(super) fn probe_routes(shared: Arc<Shared>) -> Router {
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

async fn readyz(State(s): St) -> Response {
    if s.state.ops.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

/// One connection as the API shows it.
#[derive(Debug, Serialize)]
pub(super) struct ConnView {
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

pub(super) fn conn_views(s: &Shared, only: Option<u64>) -> Vec<ConnView> {
    let subs = s.state.broker.subscriptions_by_session();
    let rates = lock(&s.sampled).conn_rates.clone();
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

pub(super) fn listener_views(s: &Shared) -> Vec<Value> {
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

pub(super) fn overview_json(s: &Shared) -> Value {
    let b = &s.state.broker;
    let stats = b.stats();
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let mem = &b.config().memory;
    let latency = stats.delivery_latency.snapshot();
    let mut v = json!({
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
        "delivery_latency": {
            "count": latency.count,
            "p50": latency.quantile(0.5),
            "p99": latency.quantile(0.99),
            "p999": latency.quantile(0.999),
        },
    });
    // Each front-end's section (`mqtt`): what it publishes with a field.
    if let Value::Object(o) = &mut v {
        for (section, fields) in s.state.figures.sections() {
            o.entry(section).or_insert(fields);
        }
    }
    v
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

/// One queue as `/api/queues` and the dashboard show it (`waiting` = `depth`, the name
/// the list had when it showed STOMP's queues only).
pub(super) fn queue_json(q: &hayate_broker::queue::QueueView) -> Value {
    json!({
        "ns": q.ns, "name": q.name, "kind": q.kind, "durable": q.durable,
        "depth": q.depth, "unacked": q.unacked, "consumers": q.consumers,
        "dropped": q.dropped, "dead_lettered": q.dead_lettered, "bytes": q.bytes,
        "waiting": q.depth,
    })
}

async fn queues(State(s): St) -> Response {
    let v: Vec<Value> = s.state.broker.queues().iter().map(queue_json).collect();
    axum::Json(v).into_response()
}

/// `DELETE /api/queues/{ns}/{name}` (`_` or an empty `ns`: the default namespace, AMQP
/// vhost `/`, STOMP and native): the queue goes, with its messages; its consumers are
/// cancelled.
async fn delete_queue(State(s): St, Path((ns, name)): Path<(String, String)>) -> Response {
    let ns = if ns == "_" { String::new() } else { ns };
    let id = hayate_broker::queue::QueueId {
        ns: std::sync::Arc::from(ns.as_str()),
        name: std::sync::Arc::from(name.as_str()),
    };
    let Some(q) = s.state.broker.queue(&id) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no queue {name:?} in {ns:?}"),
        );
    };
    tracing::info!(ns, name, "queue deleted by the admin API");
    // Through the front-end that keeps it, when one does (AMQP forgets it too).
    q.delete_unused(&s.state.broker);
    StatusCode::NO_CONTENT.into_response()
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
