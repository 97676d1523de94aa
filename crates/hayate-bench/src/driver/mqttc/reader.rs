//! The reader task: decodes every packet of each read, owes PUBACKs, frees acknowledged
//! packet ids and hands the payloads of a read to their subscriptions.

use anyhow::bail;
use bytes::{Bytes, BytesMut};
use hayate_core::sync::lock;
use hayate_mqtt::{Ack, ByteStr, Packet, QoS};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use super::{MAX_BATCH, MAX_PACKET, READ_CHUNK, Shared};

/// Payloads of one read for one topic.
struct Batch {
    topic: ByteStr,
    payloads: Vec<Bytes>,
}

pub(super) async fn read_loop(
    rd: &mut super::Rd,
    buf: &mut BytesMut,
    s: &Shared,
) -> anyhow::Result<()> {
    let version = s.version;
    let mut batches: Vec<Batch> = Vec::new();
    let mut pubacks: Vec<u16> = Vec::new();
    let mut acked: Vec<u16> = Vec::new();
    loop {
        loop {
            let packet = match hayate_mqtt::decode(buf, version, MAX_PACKET) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => {
                    settle(s, &mut batches, &mut pubacks, &mut acked).await;
                    bail!("decoding a packet from the broker: {e}");
                }
            };
            match packet {
                Packet::Publish(p) => {
                    match p.qos {
                        QoS::AtMostOnce => {}
                        QoS::AtLeastOnce => pubacks.extend(p.packet_id),
                        QoS::ExactlyOnce => bail!("QoS 2 PUBLISH from the broker (not subscribed)"),
                    }
                    match batches.last_mut() {
                        Some(b) if b.topic == p.topic && b.payloads.len() < MAX_BATCH => {
                            b.payloads.push(p.payload)
                        }
                        _ => batches.push(Batch {
                            topic: p.topic,
                            payloads: vec![p.payload],
                        }),
                    }
                    if batches.len() >= 64 {
                        settle(s, &mut batches, &mut pubacks, &mut acked).await;
                    }
                }
                Packet::PubAck(a) => {
                    if a.reason_code.is_error() {
                        s.fail(format!(
                            "mqtt: PUBLISH refused by the broker: {}",
                            a.reason_code
                        ));
                    }
                    acked.push(a.packet_id);
                }
                Packet::SubAck(a) => {
                    lock(&s.out).free_id(a.packet_id);
                    if let Some(tx) = lock(&s.subacks).remove(&a.packet_id) {
                        let _ = tx.send(a.reason_codes);
                    }
                }
                Packet::UnsubAck(a) => {
                    lock(&s.out).free_id(a.packet_id);
                }
                Packet::PingResp => {
                    if let Some(Some(tx)) = lock(&s.out).pings.pop_front() {
                        let _ = tx.send(());
                    }
                }
                Packet::Disconnect(d) => {
                    settle(s, &mut batches, &mut pubacks, &mut acked).await;
                    bail!(
                        "the broker sent DISCONNECT: {}{}",
                        d.reason_code,
                        d.properties
                            .reason_string
                            .as_ref()
                            .map(|s| format!(": {s}"))
                            .unwrap_or_default()
                    );
                }
                other => bail!("unexpected {} from the broker", other.packet_type().name()),
            }
        }
        settle(s, &mut batches, &mut pubacks, &mut acked).await;
        // Room for the next packet in place when its size is known, else a large read.
        let want = hayate_mqtt::packet_len(buf, version, MAX_PACKET)
            .ok()
            .flatten()
            .map_or(READ_CHUNK, |n| n.saturating_sub(buf.len()).max(READ_CHUNK));
        if buf.capacity() - buf.len() < want {
            buf.reserve(want.max(READ_CHUNK * 2));
        }
        if rd.read_buf(buf).await? == 0 {
            bail!("connection closed by the broker");
        }
    }
}

/// After a read's packets are decoded: writes the PUBACKs owed and frees the acknowledged
/// packet ids (one lock), then hands the payloads to their subscriptions.
async fn settle(
    s: &Shared,
    batches: &mut Vec<Batch>,
    pubacks: &mut Vec<u16>,
    acked: &mut Vec<u16>,
) {
    if !pubacks.is_empty() || !acked.is_empty() {
        let mut out = lock(&s.out);
        let was_empty = out.buf.is_empty();
        for id in pubacks.drain(..) {
            out.encode(&Packet::PubAck(Ack::new(id)), s.version);
        }
        let mut freed = 0;
        for id in acked.drain(..) {
            if out.free_id(id) {
                freed += 1;
            }
        }
        out.inflight -= freed.min(out.inflight);
        // Publishers waiting for the window resume once an eighth of it is free (one wake-up
        // per many PUBACKs, not one per PUBACK, yet no stall with a small window).
        let resume = freed > 0 && out.inflight + (s.window / 8).max(1) <= s.window;
        let wrote = was_empty && !out.buf.is_empty();
        drop(out);
        if wrote {
            s.wake.notify_one();
        }
        if resume {
            s.acks.notify_waiters();
        }
    }
    if batches.is_empty() {
        return;
    }
    let txs: Vec<Option<mpsc::Sender<Vec<Bytes>>>> = {
        let routes = lock(&s.routes);
        batches
            .iter()
            .map(|b| routes.get(b.topic.as_str()).cloned())
            .collect()
    };
    for (b, tx) in batches.drain(..).zip(txs) {
        if let Some(tx) = tx {
            // A closed receiver is a subscription given up: drop.
            let _ = tx.send(b.payloads).await;
        }
    }
}
