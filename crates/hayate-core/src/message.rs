//! Messages.

use std::time::Instant;

use bytes::Bytes;

use crate::Key;

/// Optional message headers: ordered name/value pairs (a name may repeat).
pub type Headers = Vec<(String, Bytes)>;

/// Payloads shorter than this are copied by [`Message::compact`].
pub const COMPACT_PAYLOAD_MAX: usize = 32 * 1024;

/// A message as it travels through Hayate.
///
/// Cloning is cheap: the key and payload are reference-counted [`Bytes`], so fan-out to many
/// subscribers never copies the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Where the message was published.
    pub key: Key,
    /// The payload, opaque to Hayate.
    pub payload: Bytes,
    /// Where a reply should be published (request/reply).
    pub reply_to: Option<Key>,
    /// Correlates a reply with its request.
    pub correlation_id: Option<Bytes>,
    /// Application headers.
    pub headers: Option<Headers>,
    /// Delivery attributes some protocols carry (MQTT QoS, retain, expiry, ...).
    pub attrs: Attrs,
}

/// The delivery guarantee a publisher asked for (MQTT's QoS of a PUBLISH).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Guarantee {
    /// At most once (MQTT QoS 0).
    AtMostOnce = 0,
    /// At least once (MQTT QoS 1).
    AtLeastOnce = 1,
    /// Exactly once (MQTT QoS 2).
    ExactlyOnce = 2,
}

/// Delivery attributes of a message. All default to "not stated"; the native protocol does
/// not carry them yet, MQTT does (and STOMP's content-type travels as a header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs {
    /// What the publisher asked for; `None` (native, STOMP) = whatever the subscription
    /// was granted.
    pub guarantee: Option<Guarantee>,
    /// Published with MQTT's retain flag (shown to retain-as-published subscribers).
    pub retain: bool,
    /// The payload is declared UTF-8 text (MQTT payload format indicator 1).
    pub utf8: bool,
    /// When the message expires: it is not delivered after this instant.
    pub expires: Option<Instant>,
    /// Delivered before to a receiver that gave it back (NACK) or went away without
    /// acknowledging it; shown to acknowledged receivers (native MSG_ACKED, STOMP/AMQP's
    /// redelivered).
    pub redelivered: bool,
    /// The delivery id of a message received on an acknowledged subscription (what the
    /// receiver acknowledges); 0 otherwise. Set by the receiving side only: publishing never
    /// carries it.
    pub delivery: u64,
    /// For a message delivered by a stream consumer: its offset in the stream.
    pub stream_offset: Option<u64>,
    /// For a message delivered by a stream consumer: how many times it has been delivered,
    /// this time included (1 the first time).
    pub deliveries: u32,
}

impl Message {
    /// The same message with its key, reply-to, correlation id, header values and (below
    /// [`COMPACT_PAYLOAD_MAX`]) payload in allocations of their own (see [`Key::compact`]):
    /// what a store that keeps messages for long (retained messages, offline sessions,
    /// queues without consumers) keeps, so that a small message does not pin the read
    /// buffer it arrived in. A larger payload is shared as it is: it fills most of its
    /// buffer (or has one of its own), and copying it for each of many stores would cost
    /// more than it saves.
    pub fn compact(&self) -> Message {
        Message {
            key: self.key.compact(),
            payload: if self.payload.len() < COMPACT_PAYLOAD_MAX {
                Bytes::copy_from_slice(&self.payload)
            } else {
                self.payload.clone()
            },
            reply_to: self.reply_to.as_ref().map(Key::compact),
            correlation_id: self
                .correlation_id
                .as_ref()
                .map(|c| Bytes::copy_from_slice(c)),
            headers: self.headers.as_ref().map(|h| {
                h.iter()
                    .map(|(n, v)| (n.clone(), Bytes::copy_from_slice(v)))
                    .collect()
            }),
            attrs: self.attrs,
        }
    }

    /// A plain message: key and payload, no metadata.
    pub fn new(key: Key, payload: impl Into<Bytes>) -> Message {
        Message {
            key,
            payload: payload.into(),
            reply_to: None,
            correlation_id: None,
            headers: None,
            attrs: Attrs::default(),
        }
    }

    /// The reply to this request: `payload` on its reply-to key, echoing its correlation id;
    /// `None` when the message has no reply-to key.
    pub fn reply(&self, payload: impl Into<Bytes>) -> Option<Message> {
        let mut r = Message::new(self.reply_to.clone()?, payload);
        r.correlation_id = self.correlation_id.clone();
        Some(r)
    }

    /// True when the message carries nothing but a key and a payload.
    pub fn is_plain(&self) -> bool {
        self.reply_to.is_none()
            && self.correlation_id.is_none()
            && self.headers.is_none()
            && self.attrs == Attrs::default()
    }
}
