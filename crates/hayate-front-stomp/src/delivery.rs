//! The outbound half of a STOMP connection: deliveries become MESSAGE frames, and messages
//! of `client` / `client-individual` subscriptions are remembered until acknowledged.
//!
//! [`StompDeliveries`] is shared by the outbox's [`StompEncoder`] (under the outbox lock) and the
//! connection's reader (ACK, NACK, SUBSCRIBE, UNSUBSCRIBE), as MQTT's delivery state is;
//! lock order: outbox, then this state.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use bytes::BufMut;
use hayate_broker::{Batch, Encoder, OutBuf};
use hayate_core::sync::lock;
use hayate_core::{Key, KeyExpr, Message};
use hayate_stomp::{Version, encode_message_head};

/// Shared delivery state.
pub(crate) type SharedDeliveries = Arc<Mutex<StompDeliveries>>;

/// How a subscription's messages are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckMode {
    Auto,
    /// Cumulative: an ACK covers every earlier message of the subscription.
    Client,
    ClientIndividual,
}

/// What a subscription is attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `/topic/<expr>`: fan-out.
    Topic,
    /// `/queue/<name>`: one member of the queue group `name` on `expr`.
    Queue { name: String, expr: KeyExpr },
    /// The connection's temp-queues (`/temp-queue/<name>`), all on one inbox subscription.
    Temp,
}

/// One subscription.
#[derive(Debug, Clone)]
pub(crate) struct Sub {
    /// The client's subscription id.
    pub(crate) id: String,
    /// The destination as subscribed (for MESSAGE frames of queues).
    pub(crate) destination: String,
    pub(crate) ack: AckMode,
    pub(crate) kind: Kind,
}

/// The delivery state of one STOMP connection.
#[derive(Debug)]
pub(crate) struct StompDeliveries {
    pub(crate) version: Version,
    /// Subscriptions by broker subscription id.
    pub(crate) subs: HashMap<u32, Sub>,
    /// The key prefix of this connection's temp-queues (`_inbox/<session>/`).
    pub(crate) temp_prefix: String,
    /// Subscription id shown for each temp-queue the client subscribed to explicitly.
    pub(crate) temp_ids: HashMap<String, String>,
    /// Number of the next MESSAGE of an `auto` subscription (its id is `a<n>`; those of
    /// acknowledged subscriptions are the broker's delivery ids, which the client ACKs).
    next_msg: u64,
    /// Reused for each MESSAGE's `message-id` and `destination`.
    id_buf: String,
    dest_buf: String,
}

/// The STOMP destination a key is shown as in a `reply-to` header.
pub(crate) fn reply_destination(key: &Key) -> String {
    format!("/queue/{}", key.as_str())
}

impl StompDeliveries {
    pub(crate) fn new(temp_prefix: String) -> StompDeliveries {
        StompDeliveries {
            version: Version::V1_0,
            subs: HashMap::new(),
            temp_prefix,
            temp_ids: HashMap::new(),
            next_msg: 1,
            id_buf: String::new(),
            dest_buf: String::new(),
        }
    }

    /// Writes one MESSAGE to subscription `sid`: of an `auto` subscription (`delivery`
    /// `None`), or a delivery of an acknowledged one, held by the broker until ACKed.
    fn deliver(
        &mut self,
        sid: u32,
        key: &Key,
        payload: &bytes::Bytes,
        msg: Option<&Message>,
        delivery: Option<u64>,
        out: &mut OutBuf,
    ) {
        let Some(sub) = self.subs.get(&sid) else {
            return;
        };
        // Built in buffers kept across deliveries: no allocation per message.
        let mut message_id = std::mem::take(&mut self.id_buf);
        message_id.clear();
        match delivery {
            Some(d) => {
                let _ = write!(message_id, "{d}");
            }
            None => {
                let _ = write!(message_id, "a{}", self.next_msg);
                self.next_msg += 1;
            }
        }
        let mut dest = std::mem::take(&mut self.dest_buf);
        dest.clear();
        let (destination, subscription): (&str, &str) = match &sub.kind {
            Kind::Topic => {
                dest.push_str("/topic/");
                dest.push_str(key.as_str());
                (&dest, &sub.id)
            }
            Kind::Queue { .. } => (&sub.destination, &sub.id),
            Kind::Temp => {
                let name = key
                    .as_str()
                    .strip_prefix(self.temp_prefix.as_str())
                    .unwrap_or(key.as_str());
                dest.push_str("/temp-queue/");
                dest.push_str(name);
                let id = self
                    .temp_ids
                    .get(name)
                    .map_or(dest.as_str(), String::as_str);
                (&dest, id)
            }
        };
        write_message(
            destination,
            subscription,
            &message_id,
            sub.ack,
            msg,
            payload,
            self.version,
            out,
        );
        self.id_buf = message_id;
        self.dest_buf = dest;
    }
}

/// Whether a header value can be written in `version`: a NUL ends a frame and cannot be
/// escaped; 1.0 cannot escape line ends, and 1.1 has no escape for CR (`\\r` is 1.2's, and a
/// 1.1 client must take an unknown escape as a fatal error).
fn header_safe(v: &str, version: Version) -> bool {
    !v.contains('\0')
        && match version {
            Version::V1_0 => !v.contains(['\n', '\r']),
            Version::V1_1 => !v.contains('\r'),
            _ => true,
        }
}

/// Whether a header name can be written in `version`: as a value, and in 1.0 (no escapes)
/// without `:`, which would end the name early (a `content-length:5` header name would be
/// read as a `content-length` header).
fn header_name_safe(k: &str, version: Version) -> bool {
    header_safe(k, version) && (version.escapes() || !k.contains(':'))
}

/// A correlation id as a header value: as it is when it is printable text, otherwise
/// `hex:` and its bytes in hex (a native client's ids are binary). A SEND's `hex:`
/// correlation id is turned back into bytes ([`correlation_bytes`]).
pub(crate) fn correlation_header(c: &[u8], version: Version) -> String {
    match std::str::from_utf8(c) {
        Ok(s)
            if header_safe(s, version)
                && !s.starts_with("hex:")
                && !s.contains(|ch: char| ch.is_control()) =>
        {
            s.to_string()
        }
        _ => {
            let mut h = String::with_capacity(4 + 2 * c.len());
            h.push_str("hex:");
            for b in c {
                h.push_str(&format!("{b:02x}"));
            }
            h
        }
    }
}

/// The bytes of a SEND's `correlation-id` header (see [`correlation_header`]).
pub(crate) fn correlation_bytes(h: &str) -> bytes::Bytes {
    if let Some(hex) = h.strip_prefix("hex:")
        && hex.len() % 2 == 0
        && let Some(v) = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()
    {
        return bytes::Bytes::from(v);
    }
    bytes::Bytes::copy_from_slice(h.as_bytes())
}

/// Writes one MESSAGE frame.
#[allow(clippy::too_many_arguments)]
fn write_message(
    destination: &str,
    subscription: &str,
    message_id: &str,
    ack: AckMode,
    msg: Option<&Message>,
    payload: &bytes::Bytes,
    version: Version,
    out: &mut OutBuf,
) {
    // Empty (no allocation) for the common message with no header of its own.
    let mut owned: Vec<(String, String)> = Vec::new();
    if ack != AckMode::Auto && version == Version::V1_2 {
        owned.push(("ack".into(), message_id.to_string()));
    }
    if let Some(m) = msg {
        if m.attrs.redelivered {
            // Given before (NACKed, or left unacknowledged by a consumer that went), as
            // RabbitMQ's STOMP adapter says it.
            owned.push(("redelivered".into(), "true".into()));
        }
        if let Some(r) = &m.reply_to {
            owned.push(("reply-to".into(), reply_destination(r)));
        }
        if let Some(c) = &m.correlation_id {
            owned.push(("correlation-id".into(), correlation_header(c, version)));
        }
        if let Some(h) = &m.headers {
            for (k, v) in h {
                if let Ok(v) = std::str::from_utf8(v)
                    && header_safe(v, version)
                    && header_name_safe(k, version)
                    && !matches!(
                        k.as_str(),
                        "destination"
                            | "subscription"
                            | "message-id"
                            | "content-length"
                            | "ack"
                            | "redelivered"
                    )
                {
                    owned.push((k.clone(), v.to_string()));
                }
            }
        }
    }
    let headers: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    encode_message_head(
        destination,
        subscription,
        message_id,
        &headers,
        payload.len(),
        version,
        out.tail(),
    );
    out.put_payload(payload);
    out.tail().put_u8(0);
}

/// The [`Encoder`] of a STOMP connection's outbox.
#[derive(Debug)]
pub(crate) struct StompEncoder {
    pub(crate) out: SharedDeliveries,
}

impl Encoder for StompEncoder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, _origin: u64, out: &mut OutBuf) {
        let mut st = lock(&self.out);
        batch.each(|key, payload, msg| st.deliver(sid, key, payload, msg, None, out));
    }

    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut OutBuf) {}

    fn encode_acked(&mut self, sid: u32, delivery: u64, msg: &Message, out: &mut OutBuf) {
        lock(&self.out).deliver(sid, &msg.key, &msg.payload, Some(msg), Some(delivery), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each version's subscribers can parse: 1.0 has no escapes (no line ends, no `:`
    /// in a name: `content-length:5` as a name would read as a content-length header), 1.1
    /// escapes LF but has no escape for CR, 1.2 escapes both; a NUL never.
    #[test]
    fn headers_are_written_only_where_the_version_can_carry_them() {
        use Version::*;
        for (s, v10, v11, v12) in [
            ("plain", true, true, true),
            ("a\nb", false, true, true),
            ("a\rb", false, false, true),
            ("a\0b", false, false, false),
        ] {
            assert_eq!(
                [V1_0, V1_1, V1_2].map(|v| header_safe(s, v)),
                [v10, v11, v12],
                "{s:?}"
            );
        }
        assert!(!header_name_safe("content-length:5", V1_0));
        assert!(header_name_safe("content-length:5", V1_1));
        assert!(header_safe("a:b", V1_0), "a colon in a value is fine");
    }
}
