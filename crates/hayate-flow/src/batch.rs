//! A unit of publication: one message, or many plain messages on one key.

use bytes::Bytes;
use hayate_core::{Key, Message};

/// What a publisher hands the broker in one call. All items share one key.
#[derive(Debug, Clone, Copy)]
pub enum Batch<'a> {
    /// One message, possibly with reply-to, correlation id and headers.
    One(&'a Message),
    /// Several plain messages (payload only) on one key.
    Plain {
        /// The key of every item.
        key: &'a Key,
        /// The payloads.
        payloads: &'a [Bytes],
    },
}

impl<'a> Batch<'a> {
    /// The key of every item.
    pub fn key(&self) -> &'a Key {
        match self {
            Batch::One(m) => &m.key,
            Batch::Plain { key, .. } => key,
        }
    }

    /// Number of messages.
    pub fn len(&self) -> usize {
        match self {
            Batch::One(_) => 1,
            Batch::Plain { payloads, .. } => payloads.len(),
        }
    }

    /// True if there is nothing to deliver.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload size of item `i`.
    pub fn payload_len(&self, i: usize) -> usize {
        match self {
            Batch::One(m) => m.payload.len(),
            Batch::Plain { payloads, .. } => payloads[i].len(),
        }
    }

    /// An estimate of the encoded size of item `i`, used for outbox accounting.
    pub fn cost(&self, i: usize) -> usize {
        let meta = match self {
            Batch::One(m) => {
                m.reply_to.as_ref().map_or(0, |r| r.as_bytes().len())
                    + m.correlation_id.as_ref().map_or(0, Bytes::len)
                    + m.headers
                        .as_ref()
                        .map_or(0, |h| h.iter().map(|(k, v)| k.len() + v.len() + 8).sum())
            }
            Batch::Plain { .. } => 0,
        };
        self.payload_len(i) + meta + 16
    }

    /// Items `from..to`.
    pub fn slice(&self, from: usize, to: usize) -> Batch<'a> {
        match *self {
            Batch::One(m) => {
                debug_assert!(from == 0 && to == 1);
                Batch::One(m)
            }
            Batch::Plain { key, payloads } => Batch::Plain {
                key,
                payloads: &payloads[from..to],
            },
        }
    }

    /// Calls `f` with the key, the payload and (for [`Batch::One`]) the whole message of
    /// every item, in order: how an encoder walks a batch without building messages.
    pub fn each(&self, mut f: impl FnMut(&Key, &Bytes, Option<&Message>)) {
        match self {
            Batch::One(m) => f(&m.key, &m.payload, Some(m)),
            Batch::Plain { key, payloads } => {
                for p in *payloads {
                    f(key, p, None);
                }
            }
        }
    }

    /// Item `i` as an owned message (cheap: reference counts only).
    pub fn message(&self, i: usize) -> Message {
        match self {
            Batch::One(m) => (*m).clone(),
            Batch::Plain { key, payloads } => Message::new((*key).clone(), payloads[i].clone()),
        }
    }
}
