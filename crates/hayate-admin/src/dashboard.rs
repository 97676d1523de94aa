//! The dashboard: the sampler (once a second, per-second rates from the counters'
//! differences, five minutes of history, the busiest key prefixes), the page, and its data
//! as one JSON document (`/api/dashboard`) or server-sent events (`/api/events`).

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use hayate_core::sync::lock;
use serde::Serialize;
use serde_json::{Value, json};

use super::api::{conn_views, listener_views, overview_json};
use super::{Shared, St};

/// The top key prefixes with their rates (msg/s), busiest first.
pub(super) type TopKeys = Arc<std::sync::Mutex<Vec<(String, f64)>>>;

/// Points of history kept: five minutes at one a second.
const HISTORY: usize = 300;

/// The sampler's state: per-second rates from the counters' differences.
#[derive(Default)]
pub(super) struct Sampled {
    at: Option<std::time::Instant>,
    /// Per listener: the totals at the last tick.
    listeners: Vec<hayate_io::traffic::Totals>,
    /// Per connection id: its totals at the last tick.
    conns: std::collections::HashMap<u64, hayate_io::traffic::Totals>,
    /// Rates computed at the last tick.
    listener_rates: Vec<(f64, f64)>,
    pub(super) conn_rates: std::collections::HashMap<u64, (f64, f64)>,
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

/// One tick of the sampler: rates over the time since the last one.
pub(super) fn sample(s: &Shared) {
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
    let mut g = lock(&s.sampled);
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
    *lock(&s.top_keys) = g.top_keys.clone();
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
    let mut queues = s.state.broker.queues();
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
    let g = lock(&s.sampled);
    for (l, r) in listeners.iter_mut().zip(&g.listener_rates) {
        l["msgs_in_rate"] = json!(r.0);
        l["msgs_out_rate"] = json!(r.1);
    }
    // The 20 deepest.
    queues.sort_by_key(|q| std::cmp::Reverse(q.depth));
    let top_queues: Vec<Value> = queues.iter().take(20).map(super::api::queue_json).collect();
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
        "queue_dropped": queues.iter().map(|q| q.dropped).sum::<u64>(),
        "queues": top_queues,
        "history": g.history.iter().map(|(t, i, o)| json!([t, i, o])).collect::<Vec<_>>(),
    })
}

pub(super) async fn dashboard_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("dashboard.html"),
    )
        .into_response()
}

pub(super) async fn dashboard_data(State(s): St) -> Response {
    axum::Json(dashboard_json(&s)).into_response()
}

/// Server-sent events: the dashboard's document once a second.
pub(super) async fn events(State(s): St) -> Response {
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
