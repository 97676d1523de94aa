//! The session outbox's [`Encoder`]: [`MqttEncoder`] hands broker deliveries to the delivery
//! state and reports the bytes it holds through [`HeldCounter`], without its lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use hayate_broker::{Batch, Encoder, OutBuf};

use super::{SharedDeliveries, lock};

/// The [`Encoder`] of an MQTT session's outbox.
#[derive(Debug)]
pub(crate) struct MqttEncoder {
    pub(crate) out: SharedDeliveries,
    pub(crate) held: HeldCounter,
}

/// The held bytes of a session's deliveries while a connection is attached (0 offline),
/// readable without the delivery state's lock (the budget check of every offer reads it).
#[derive(Debug, Clone)]
pub(crate) struct HeldCounter {
    pub(super) held: Arc<AtomicUsize>,
    pub(super) online: Arc<AtomicBool>,
}

impl Encoder for MqttEncoder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, origin: u64, out: &mut OutBuf) {
        let mut st = lock(&self.out);
        batch.each(|key, payload, msg| st.deliver(sid, key, payload, msg, origin, false, out));
    }

    fn encode_lost(&mut self, _sid: u32, count: u64, _out: &mut OutBuf) {
        // MQTT has no way to tell a subscriber; count it.
        lock(&self.out).dropped += count;
    }

    fn held_bytes(&self) -> usize {
        if self.held.online.load(Ordering::Relaxed) {
            self.held.held.load(Ordering::Relaxed)
        } else {
            0
        }
    }
}
