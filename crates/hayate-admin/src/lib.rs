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
//! Every route but the health checks goes through `guard` (guard.rs): with users configured
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
//!
//! The files, by noun: `listener.rs` the accept loop and `slots.rs` its connection slots;
//! `guard.rs` who may use the API; `api.rs` the routes and the JSON API's handlers;
//! `metrics.rs` the Prometheus collector; `dashboard.rs` the sampler (rates, history) and
//! the dashboard's page and events; `figures.rs` what front-ends publish to it ([`Figures`]:
//! the admin side imports no front-end).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hayate_broker::Broker;
use hayate_front::auth::Authenticator;
use hayate_front::ops::Ops;
use prometheus_client::registry::Registry;
use serde_json::json;

mod api;
mod dashboard;
mod figures;
mod guard;
mod listener;
mod metrics;
mod slots;

pub use figures::{Figure, FigureKind, Figures};
pub use listener::serve;

/// What the admin listener serves from.
pub struct AdminState {
    /// The engine.
    pub broker: Broker,
    /// Listeners, connections, readiness.
    pub ops: Arc<Ops>,
    /// What the front-ends publish (MQTT's clients and held messages, the shared-memory
    /// fan-out): in `/metrics`, and as their sections of `/api/overview`.
    pub figures: Figures,
    /// The broker's users, for the admin's own authentication.
    pub auth: Arc<dyn Authenticator>,
    /// Users allowed (`[admin] users`; a reload replaces them).
    pub users: Arc<std::sync::RwLock<Vec<String>>>,
    /// The process's log filter, when the program lets the API change it.
    pub log: Option<LogControl>,
    /// Reloads the configuration, when the program lets the API do it.
    pub reload: Option<ReloadControl>,
}

/// Reads the configuration again and applies what can change while running; `Ok` says
/// what was applied.
pub type ReloadControl = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Reads the log filter (`None`) or sets it (`Some(filter)`), returning the filter now.
pub type LogControl = Arc<dyn Fn(Option<&str>) -> Result<String, String> + Send + Sync>;

/// What the routes, the sampler and the accept loop share.
struct Shared {
    state: AdminState,
    registry: Registry,
    /// What the sampler computed last (rates, history, top keys): the dashboard's data.
    sampled: std::sync::Mutex<dashboard::Sampled>,
    /// The top key prefixes of the last tick, shared with the metrics collector.
    top_keys: dashboard::TopKeys,
    /// The listener's connections by slot.
    slots: Arc<slots::Slots>,
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

/// The client's address, for handlers and the guard.
#[derive(Clone, Copy, Debug)]
struct Peer(std::net::SocketAddr);

type St = State<Arc<Shared>>;

/// An error answer: `{"error": msg}` with `status`.
fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, axum::Json(json!({ "error": msg.into() }))).into_response()
}
