//! The Prometheus collector behind `GET /metrics`: every figure read at scrape time, by
//! family group (listeners' traffic and connections, the broker, its memory budget, the
//! admin listener, the front-ends' published figures, streams, the busiest key prefixes).
//! docs/admin-api.md lists every family.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hayate_broker::Broker;
use hayate_core::sync::lock;
use hayate_front::ops::Ops;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::dashboard::TopKeys;
use super::figures::{FigureKind, Figures};
use super::slots::Slots;
use super::{St, error};

/// `GET /metrics`: what the collector reads now, as OpenMetrics text.
pub(super) async fn metrics_text(State(s): St) -> Response {
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

/// The Prometheus collector: every figure read at scrape time.
pub(super) struct Metrics {
    pub(super) broker: Broker,
    pub(super) ops: Arc<Ops>,
    /// What the front-ends publish.
    pub(super) figures: Figures,
    pub(super) top_keys: TopKeys,
    pub(super) slots: Arc<Slots>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Queues `/metrics` shows one by one; the others are summed.
const MAX_QUEUE_SERIES: usize = 1000;

/// A sample's labels.
type Labels = Vec<(&'static str, String)>;

type Encoded = Result<(), std::fmt::Error>;

/// Reads one of a listener's traffic totals.
type Reading = fn(&hayate_io::traffic::Totals) -> u64;

/// The one sample of a family without labels.
fn single<T>(v: T) -> [(Labels, T); 1] {
    [(Vec::new(), v)]
}

/// A family of `kind`: one unlabelled sample, or one per row of labels.
fn family<T: Copy, M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    (name, help, kind): (&str, &str, MetricType),
    rows: &[(Labels, T)],
    make: fn(T) -> M,
) -> Encoded {
    let mut enc = e.encode_descriptor(name, help, None, kind)?;
    match rows {
        [(labels, v)] if labels.is_empty() => make(*v).encode(enc)?,
        _ => {
            for (labels, v) in rows {
                make(*v).encode(enc.encode_family(labels)?)?;
            }
        }
    }
    Ok(())
}

/// A counter family: one unlabelled sample, or one per row of labels.
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, rows: &[(Labels, u64)]) -> Encoded {
    family(
        e,
        (name, help, MetricType::Counter),
        rows,
        ConstCounter::new,
    )
}

/// A gauge family: one unlabelled sample, or one per row of labels.
fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, rows: &[(Labels, f64)]) -> Encoded {
    family(e, (name, help, MetricType::Gauge), rows, ConstGauge::new)
}

/// A histogram family without labels.
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
        let e = &mut e;
        self.encode_process(e)?;
        self.encode_listeners(e)?;
        self.encode_broker(e)?;
        self.encode_queues(e)?;
        self.encode_memory(e)?;
        self.encode_admin(e)?;
        self.encode_figures(e)?;
        self.encode_streams(e)?;
        self.encode_top_keys(e)
    }
}

impl Metrics {
    /// The broker's version and uptime.
    fn encode_process(&self, e: &mut DescriptorEncoder) -> Encoded {
        gauge(
            e,
            "hayate_build_info",
            "The broker's version (the value is 1).",
            &[(
                vec![("version", env!("CARGO_PKG_VERSION").to_string())],
                1.0,
            )],
        )?;
        gauge(
            e,
            "hayate_uptime_seconds",
            "Seconds since the server started.",
            &single(self.ops.uptime_secs()),
        )
    }

    /// Per listener: messages and bytes each way, RPC calls and replies, connections open,
    /// accepted and refused; then the bytes queued for every connection.
    fn encode_listeners(&self, e: &mut DescriptorEncoder) -> Encoded {
        let mut per_listener = Vec::new();
        let mut live = Vec::new();
        let mut accepted = Vec::new();
        let mut refused = Vec::new();
        let counts = self.ops.connections_per_listener();
        for (l, n) in self.ops.listeners.iter().zip(counts) {
            let labels: Labels = vec![
                ("protocol", l.protocol.to_string()),
                ("listener", l.addr.clone()),
            ];
            per_listener.push((labels.clone(), l.traffic.totals()));
            live.push((labels.clone(), n as f64));
            accepted.push((labels.clone(), l.accepted.load(Relaxed)));
            refused.push((labels, l.refused.load(Relaxed)));
        }
        let rows = |f: Reading| -> Vec<(Labels, u64)> {
            per_listener
                .iter()
                .map(|(l, t)| (l.clone(), f(t)))
                .collect()
        };
        let traffic: [(&str, &str, Reading); 6] = [
            (
                "hayate_messages_received",
                "Messages published by clients, per listener.",
                |t| t.msgs_in,
            ),
            (
                "hayate_received_payload_bytes",
                "Payload bytes of the messages published by clients, per listener.",
                |t| t.bytes_in,
            ),
            (
                "hayate_messages_sent",
                "Messages delivered to clients (queued for their connection), per listener.",
                |t| t.msgs_out,
            ),
            (
                "hayate_sent_payload_bytes",
                "Payload bytes of the messages delivered to clients, per listener.",
                |t| t.bytes_out,
            ),
            (
                "hayate_rpc_calls",
                "Requests published by clients (messages carrying a reply-to), per listener.",
                |t| t.calls,
            ),
            (
                "hayate_rpc_replies",
                "Replies published by clients (messages to a reply inbox, _inbox/...), per \
                 listener.",
                |t| t.replies,
            ),
        ];
        for (name, help, f) in traffic {
            counter(e, name, help, &rows(f))?;
        }
        gauge(
            e,
            "hayate_connections",
            "Connections open now, per listener.",
            &live,
        )?;
        counter(
            e,
            "hayate_connections_accepted",
            "Connections accepted, per listener.",
            &accepted,
        )?;
        counter(
            e,
            "hayate_connections_refused",
            "Connections refused by a connection limit before any byte was read.",
            &refused,
        )?;
        let outbox: usize = self.ops.conns.list().iter().map(|c| c.queued_bytes()).sum();
        gauge(
            e,
            "hayate_outbox_bytes",
            "Bytes queued for clients and not yet written, all connections.",
            &single(outbox as f64),
        )
    }

    /// Every queue's depth, unacknowledged deliveries and consumers (labels `ns`, `name`):
    /// at most [`MAX_QUEUE_SERIES`] queues (the deepest), the rest summed in one series
    /// labelled `name="_other"`.
    fn encode_queues(&self, e: &mut DescriptorEncoder) -> Encoded {
        let mut qs = self.broker.queues();
        qs.sort_by(|a, b| b.depth.cmp(&a.depth).then(b.unacked.cmp(&a.unacked)));
        let rest = qs.split_off(qs.len().min(MAX_QUEUE_SERIES));
        let row = |ns: &str, name: &str, v: usize| {
            (
                vec![("ns", ns.to_string()), ("name", name.to_string())],
                v as f64,
            )
        };
        type Field = fn(&hayate_broker::queue::QueueView) -> usize;
        let fields: [(&str, &str, Field); 3] = [
            (
                "hayate_queue_depth",
                "Messages ready in a queue (any protocol).",
                |q| q.depth,
            ),
            (
                "hayate_queue_unacked",
                "Deliveries of a queue not yet acknowledged.",
                |q| q.unacked,
            ),
            (
                "hayate_queue_consumers",
                "Consumers of a queue (any protocol).",
                |q| q.consumers,
            ),
        ];
        for (name, help, f) in fields {
            let mut rows: Vec<(Labels, f64)> =
                qs.iter().map(|q| row(&q.ns, &q.name, f(q))).collect();
            if !rest.is_empty() {
                rows.push(row("", "_other", rest.iter().map(f).sum()));
            }
            if rows.is_empty() {
                continue;
            }
            gauge(e, name, help, &rows)?;
        }
        Ok(())
    }

    /// Subscriptions, queue groups, drops, slow consumers, stalls, sessions, and the
    /// delivery latency.
    fn encode_broker(&self, e: &mut DescriptorEncoder) -> Encoded {
        let b = &self.broker;
        gauge(
            e,
            "hayate_subscriptions",
            "Subscriptions, all protocols.",
            &single(b.subscription_count() as f64),
        )?;
        gauge(
            e,
            "hayate_queue_groups",
            "Queue groups with at least one member.",
            &single(b.queue_groups().len() as f64),
        )?;
        let st = b.stats();
        let queue_dropped: u64 = b.queues().iter().map(|q| q.dropped).sum();
        counter(
            e,
            "hayate_dropped_messages",
            "Messages dropped, by reason: outbox_full (a drop subscriber's outbox was full, \
             or its stall policy dropped), queue_full (a queue's length limit or overflow \
             policy: dropped or refused, any protocol), unplaced (a queue group's members all left while it was routed).",
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
            e,
            "hayate_slow_consumers",
            "Connections cut off as slow consumers (blocked past limits.max_block_ms).",
            &single(st.slow_consumers.load(Relaxed)),
        )?;
        counter(
            e,
            "hayate_stalls",
            "Times a block subscriber's full outbox made a publisher wait.",
            &single(st.stalls.load(Relaxed)),
        )?;
        counter(
            e,
            "hayate_sessions_opened",
            "Broker sessions opened (every protocol; MQTT persistent sessions once).",
            &single(st.sessions_opened.load(Relaxed)),
        )?;
        histogram(
            e,
            "hayate_delivery_latency_seconds",
            "Time from a publish reaching the broker to its delivery being written to a \
             subscriber's socket (one publish in 16 per session timed, each subscriber's \
             outbox timing one at a time).",
            &st.delivery_latency.snapshot(),
        )
    }

    /// The broker-wide memory budget.
    fn encode_memory(&self, e: &mut DescriptorEncoder) -> Encoded {
        let mem = &self.broker.config().memory;
        gauge(
            e,
            "hayate_memory_used_bytes",
            "Bytes charged to the broker-wide memory budget now.",
            &single(mem.used() as f64),
        )?;
        gauge(
            e,
            "hayate_memory_limit_bytes",
            "The broker-wide memory budget (limits.memory_budget).",
            &single(mem.limit() as f64),
        )?;
        counter(
            e,
            "hayate_memory_refused",
            "Requests the memory budget refused.",
            &single(mem.refused()),
        )
    }

    /// The admin listener's own connections.
    fn encode_admin(&self, e: &mut DescriptorEncoder) -> Encoded {
        let (open, cut) = {
            let t = self.slots.lock();
            (t.open(), t.cut)
        };
        gauge(
            e,
            "hayate_admin_connections",
            "Admin listener connections open now, spare slots included.",
            &single(open as f64),
        )?;
        counter(
            e,
            "hayate_admin_connections_cut",
            "Admin connections closed to make room for new ones (waiting for a request head, \
             or writes blocked for 1 s, when every slot was taken), new ones closed when \
             every slot was in a request, and connections whose writes made no progress \
             for 10 s.",
            &single(cut),
        )
    }

    /// What the front-ends publish (the shared-memory offer, MQTT), in their order.
    fn encode_figures(&self, e: &mut DescriptorEncoder) -> Encoded {
        for f in self.figures.iter() {
            let Some((name, help)) = f.family() else {
                continue;
            };
            match f.kind() {
                FigureKind::Gauge => gauge(e, name, help, &single(f.value() as f64))?,
                FigureKind::Counter => counter(e, name, help, &single(f.value()))?,
            }
        }
        Ok(())
    }

    /// Per stream: records and bytes held; per durable consumer: its lag.
    fn encode_streams(&self, e: &mut DescriptorEncoder) -> Encoded {
        let mut records = Vec::new();
        let mut bytes = Vec::new();
        let mut pending = Vec::new();
        for s in &self.broker.streams() {
            let i = s.info();
            let l: Labels = vec![("stream", s.name().to_string())];
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
            e,
            "hayate_stream_records",
            "Records a stream holds.",
            &records,
        )?;
        gauge(e, "hayate_stream_bytes", "Bytes a stream holds.", &bytes)?;
        gauge(
            e,
            "hayate_consumer_pending",
            "Records of its stream a durable consumer has not yet been given (its lag).",
            &pending,
        )
    }

    /// The busiest key prefixes of the sampler's last tick.
    fn encode_top_keys(&self, e: &mut DescriptorEncoder) -> Encoded {
        let top: Vec<_> = lock(&self.top_keys)
            .iter()
            .map(|(k, r)| (vec![("prefix", k.clone())], *r))
            .collect();
        gauge(
            e,
            "hayate_top_key_prefix_rate",
            "Messages per second published on the busiest key prefixes (first two levels; at \
             most 10, sampled one publish in 16 per session, over the last second).",
            &top,
        )
    }
}
