//! What the front-ends publish to the admin listener (`/metrics`, `/api/overview`): the
//! server knows both sides, so it reads each front-end's statistics into
//! [`Figures`](crate::admin::Figures) and the admin side imports no front-end.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::admin::{Figure, Figures};
use crate::mqtt::Mqtt;
use crate::shm::ShmOffer;

/// The figures of every front-end, in the order `/metrics` lists them: the shared-memory
/// offer (when there is one), then MQTT.
pub(super) fn front_figures(mqtt: &Arc<Mqtt>, shm: Option<&Arc<ShmOffer>>) -> Figures {
    let mut figures = Figures::new();
    if let Some(shm) = shm {
        shm_figures(&mut figures, shm);
    }
    mqtt_figures(&mut figures, mqtt);
    figures
}

/// The shared-memory offer (`native.shm`): connections on it, and what the fan-out arenas
/// did (only with arenas, `native.shm_fanout_bytes` above 0).
fn shm_figures(figures: &mut Figures, shm: &Arc<ShmOffer>) {
    let s = shm.clone();
    figures.push(Figure::gauge("shm", move || s.active() as u64).metric(
        "hayate_shm_connections",
        "Native connections on shared memory now (native.shm_max_connections at most).",
    ));
    if shm.fanout_stats().is_none() {
        return;
    }
    let fanout = |f: fn(&crate::fanout::FanoutStats) -> u64| {
        let s = shm.clone();
        move || s.fanout_stats().map_or(0, f)
    };
    figures
        .push(
            Figure::counter("shm", fanout(|st| st.entries.load(Relaxed))).metric(
                "hayate_shm_fanout_entries",
                "Entries written to the fan-out arenas: one per message (or publisher's \
                 batch) for all of a user's shared-memory subscribers.",
            ),
        )
        .push(
            Figure::counter("shm", fanout(|st| st.refs.load(Relaxed))).metric(
                "hayate_shm_fanout_refs",
                "Deliveries by reference to the fan-out arena (MSG_REF frames).",
            ),
        )
        .push(
            Figure::counter("shm", fanout(|st| st.copies.load(Relaxed))).metric(
                "hayate_shm_fanout_copies",
                "Deliveries large enough for the arena sent as copies: no room in it, or \
                 the client held its quota (a quarter).",
            ),
        );
}

/// MQTT: clients connected, connections accepted, and the QoS 1/2 deliveries its sessions
/// hold (the overview's `mqtt` section).
fn mqtt_figures(figures: &mut Figures, mqtt: &Arc<Mqtt>) {
    let read = |f: fn(&Mqtt) -> u64| {
        let m = mqtt.clone();
        move || f(&m)
    };
    figures
        .push(
            Figure::gauge("mqtt", read(|m| m.stats.connected.load(Relaxed)))
                .field("connected")
                .metric(
                    "hayate_mqtt_clients_connected",
                    "MQTT clients connected now.",
                ),
        )
        .push(
            Figure::counter("mqtt", read(|m| m.stats.connections.load(Relaxed)))
                .field("connections"),
        )
        .push(
            Figure::gauge("mqtt", read(|m| m.stats.held.messages.load(Relaxed)))
                .field("held_messages")
                .metric(
                    "hayate_mqtt_held_messages",
                    "QoS 1 and 2 deliveries MQTT sessions hold now: in flight (not yet \
                     acknowledged), waiting for the in-flight window, or queued for offline \
                     persistent sessions.",
                ),
        )
        .push(
            Figure::gauge("mqtt", read(|m| m.stats.held.bytes.load(Relaxed)))
                .field("held_bytes")
                .metric(
                    "hayate_mqtt_held_bytes",
                    "Payload and topic bytes of the deliveries in hayate_mqtt_held_messages.",
                ),
        );
}
