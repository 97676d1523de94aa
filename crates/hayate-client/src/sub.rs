//! Subscriptions.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use hayate_core::{Key, Message};
use hayate_native::Items;
use tokio::sync::mpsc;

/// Whoever delivers into a subscription and must hear when it is dropped: a broker
/// connection, or a peer [`Node`](crate::peer::Node).
pub(crate) trait Unsubscribe: Send + Sync + std::fmt::Debug {
    fn unsubscribe(&self, sid: u32);
}

/// Messages delivered to a subscription together: what [`Subscription::next_batch`] gives.
#[derive(Debug, Clone)]
pub enum Batch {
    /// Messages on any keys, each with its options (MSG frames, a peer node's hand-over).
    Messages(Vec<Message>),
    /// Plain messages on one key (a MSG_BATCH), their payloads as they came: sliced out
    /// only when taken ([`Items`]).
    Plain {
        /// The key of every message.
        key: Key,
        /// The payloads.
        payloads: Items,
    },
}

impl Batch {
    /// How many messages.
    pub fn len(&self) -> usize {
        match self {
            Batch::Messages(v) => v.len(),
            Batch::Plain { payloads, .. } => payloads.len(),
        }
    }

    /// Whether there are none (never, for a batch from [`Subscription::next_batch`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every message's payload, borrowed (no reference count touched for a plain batch).
    pub fn payloads(&self) -> Payloads<'_> {
        match self {
            Batch::Messages(v) => Payloads::Messages(v.iter()),
            Batch::Plain { payloads, .. } => Payloads::Plain(payloads.iter()),
        }
    }

    /// The messages, in order.
    pub fn into_messages(self) -> impl Iterator<Item = Message> {
        Ready::from(self)
    }
}

/// The payloads of a [`Batch`], borrowed: [`Batch::payloads`].
#[derive(Debug, Clone)]
pub enum Payloads<'a> {
    /// Of [`Batch::Messages`].
    Messages(std::slice::Iter<'a, Message>),
    /// Of [`Batch::Plain`].
    Plain(hayate_native::items::Iter<'a>),
}

impl<'a> Iterator for Payloads<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            Payloads::Messages(i) => i.next().map(|m| &m.payload[..]),
            Payloads::Plain(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Payloads::Messages(i) => i.size_hint(),
            Payloads::Plain(i) => i.size_hint(),
        }
    }
}

impl ExactSizeIterator for Payloads<'_> {}

/// What is left of the batch a subscription took last.
#[derive(Debug)]
enum Ready {
    Messages(std::vec::IntoIter<Message>),
    Plain {
        key: Key,
        payloads: hayate_native::items::IntoIter,
    },
}

impl Default for Ready {
    fn default() -> Ready {
        Ready::Messages(Vec::new().into_iter())
    }
}

impl From<Batch> for Ready {
    fn from(b: Batch) -> Ready {
        match b {
            Batch::Messages(v) => Ready::Messages(v.into_iter()),
            Batch::Plain { key, payloads } => Ready::Plain {
                key,
                payloads: payloads.into_iter(),
            },
        }
    }
}

impl Ready {
    /// The rest as a batch, if any is left.
    fn take_rest(&mut self) -> Option<Batch> {
        let b = match std::mem::take(self) {
            Ready::Messages(v) => Batch::Messages(v.collect()),
            Ready::Plain { key, payloads } => Batch::Plain {
                key,
                payloads: payloads.rest(),
            },
        };
        (!b.is_empty()).then_some(b)
    }
}

impl Iterator for Ready {
    type Item = Message;

    fn next(&mut self) -> Option<Message> {
        match self {
            Ready::Messages(v) => v.next(),
            // The key's reference count and the payload's are taken here, on the
            // subscriber's task, not on the connection's reader.
            Ready::Plain { key, payloads } if payloads.len() > 1 => {
                payloads.next().map(|p| Message::new(key.clone(), p))
            }
            // The last one takes the key, so that nothing of the batch stays here (a key
            // may be a slice of a fan-out entry read in place, which it would hold).
            Ready::Plain { .. } => match std::mem::take(self) {
                Ready::Plain { key, mut payloads } => payloads.next().map(|p| Message::new(key, p)),
                Ready::Messages(_) => None,
            },
        }
    }
}

/// A stream of the messages delivered to one subscription. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    sid: u32,
    rx: mpsc::Receiver<Batch>,
    ready: Ready,
    lost: Arc<AtomicU64>,
    owner: Arc<dyn Unsubscribe>,
}

impl Subscription {
    /// A subscription taking what `rx` brings; dropping it tells `owner`.
    pub(crate) fn new(
        sid: u32,
        rx: mpsc::Receiver<Batch>,
        lost: Arc<AtomicU64>,
        owner: Arc<dyn Unsubscribe>,
    ) -> Subscription {
        Subscription {
            sid,
            rx,
            ready: Ready::default(),
            lost,
            owner,
        }
    }

    /// The next message, or `None` once the subscription or connection has ended.
    pub async fn next(&mut self) -> Option<Message> {
        if let Some(m) = self.ready.next() {
            return Some(m);
        }
        let batch = self.rx.recv().await?;
        self.ready = batch.into();
        self.ready.next()
    }

    /// The messages that arrived together next (the rest of a batch [`Subscription::next`]
    /// began, if any), or `None` once the subscription or connection has ended. A plain
    /// batch (many messages on one key from one publisher's batch, as the broker sends
    /// them) is taken whole: no [`Message`] is made for its payloads, which
    /// [`Batch::payloads`] lends out. For a subscriber of many small messages this is the
    /// cheapest way to take them. Never an empty batch.
    pub async fn next_batch(&mut self) -> Option<Batch> {
        if let Some(b) = self.ready.take_rest() {
            return Some(b);
        }
        self.rx.recv().await
    }

    /// Messages dropped for this subscription (a `drop` subscription whose outbox was full
    /// at the broker, or whose queue was full at a peer node), as reported so far.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// The subscription id on this connection.
    pub fn id(&self) -> u32 {
        self.sid
    }
}

impl futures::Stream for Subscription {
    type Item = Message;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        if let Some(m) = self.ready.next() {
            return Poll::Ready(Some(m));
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(batch)) => {
                self.ready = batch.into();
                Poll::Ready(self.ready.next())
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.owner.unsubscribe(self.sid);
    }
}
