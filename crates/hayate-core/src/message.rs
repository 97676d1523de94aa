//! Messages.

use bytes::Bytes;

use crate::Key;

/// Optional message headers: ordered name/value pairs (a name may repeat).
pub type Headers = Vec<(String, Bytes)>;

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
}

impl Message {
    /// A plain message: key and payload, no metadata.
    pub fn new(key: Key, payload: impl Into<Bytes>) -> Message {
        Message {
            key,
            payload: payload.into(),
            reply_to: None,
            correlation_id: None,
            headers: None,
        }
    }

    /// True when the message carries nothing but a key and a payload.
    pub fn is_plain(&self) -> bool {
        self.reply_to.is_none() && self.correlation_id.is_none() && self.headers.is_none()
    }
}
