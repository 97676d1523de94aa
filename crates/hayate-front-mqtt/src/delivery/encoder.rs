//! The session outbox's [`Encoder`]: [`MqttEncoder`] hands broker deliveries to the delivery
//! state and reports the bytes it holds through [`HeldCounter`], without its lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use hayate_broker::{Batch, Encoder, OutBuf};

use super::SharedDeliveries;
use hayate_core::sync::lock;

/// The [`Encoder`] of an MQTT session's outbox.
#[derive(Debug)]
pub(crate) struct MqttEncoder {
    pub(crate) out: SharedDeliveries,
    pub(crate) held: HeldCounter,
    /// Deliveries discarded since the outbox last asked (count, payload bytes).
    pub(crate) skipped: (u64, u64),
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
        let mut skipped = (0, 0);
        batch.each(|key, payload, msg| {
            if !st.deliver(sid, key, payload, msg, origin, false, out) {
                skipped.0 += 1;
                skipped.1 += payload.len() as u64;
            }
        });
        self.skipped.0 += skipped.0;
        self.skipped.1 += skipped.1;
    }

    fn take_skipped(&mut self) -> (u64, u64) {
        std::mem::take(&mut self.skipped)
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
