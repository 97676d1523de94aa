//! `$SYS` statistics: the front-end's counters ([`MqttStats`]) and the retained `$SYS/broker/...`
//! messages the background task publishes from them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use hayate_broker::Session;
use hayate_core::Message;

use super::{Mqtt, translate};
use hayate_core::sync::lock;

/// Counters for `$SYS`.
#[derive(Debug, Default)]
pub struct MqttStats {
    /// Clients connected now.
    pub connected: AtomicU64,
    /// PUBLISH packets received from clients.
    pub received: AtomicU64,
    /// Connections accepted over the broker's life.
    pub connections: AtomicU64,
    /// Retained messages not kept because `mqtt.max_retained_bytes` was reached or the
    /// memory budget had no room for their footprint.
    pub retained_refused: AtomicU64,
    /// QoS 1 and 2 deliveries every session holds now (in flight, waiting for the window,
    /// queued for an offline persistent session), and their bytes (payload, topic and
    /// properties).
    pub held: Arc<HeldTotals>,
}

/// The deliveries MQTT sessions hold, summed: each session adds what changed in its own
/// (see `MqttDeliveries::sync_held`) and takes its share back when it goes.
#[derive(Debug, Default)]
pub struct HeldTotals {
    /// Deliveries held.
    pub messages: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
}

impl Mqtt {
    pub(super) async fn publish_sys(&self, session: &mut Session) {
        let reg_count = lock(&self.registry).len();
        let retained = lock(&self.retained).len();
        let s = &self.stats;
        let items = [
            (
                "$SYS/broker/version",
                format!("hayate {}", env!("CARGO_PKG_VERSION")),
            ),
            (
                "$SYS/broker/uptime",
                format!("{} seconds", self.started.elapsed().as_secs()),
            ),
            (
                "$SYS/broker/clients/connected",
                s.connected.load(Ordering::Relaxed).to_string(),
            ),
            ("$SYS/broker/clients/total", reg_count.to_string()),
            (
                "$SYS/broker/messages/received",
                s.received.load(Ordering::Relaxed).to_string(),
            ),
            (
                "$SYS/broker/subscriptions/count",
                self.broker.subscription_count().to_string(),
            ),
            ("$SYS/broker/retained messages/count", retained.to_string()),
            (
                "$SYS/broker/messages/dropped",
                self.broker
                    .stats()
                    .dropped
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
            (
                "$SYS/broker/clients/slow",
                self.broker
                    .stats()
                    .slow_consumers
                    .load(Ordering::Relaxed)
                    .to_string(),
            ),
        ];
        for (topic, value) in items {
            let Ok(key) = translate::topic_to_key(topic) else {
                continue;
            };
            let mut m = Message::new(key, Bytes::from(value));
            m.attrs.retain = true;
            m.attrs.utf8 = true;
            self.publish_from(session, &m).await;
        }
    }
}
