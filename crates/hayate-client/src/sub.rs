//! Subscriptions.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use hayate_core::Message;
use tokio::sync::mpsc;

/// Whoever delivers into a subscription and must hear when it is dropped: a broker
/// connection, or a peer [`Node`](crate::peer::Node).
pub(crate) trait Unsubscribe: Send + Sync + std::fmt::Debug {
    fn unsubscribe(&self, sid: u32);
}

/// A stream of the messages delivered to one subscription. Dropping it unsubscribes.
#[derive(Debug)]
pub struct Subscription {
    pub(crate) sid: u32,
    pub(crate) rx: mpsc::Receiver<Vec<Message>>,
    pub(crate) ready: std::vec::IntoIter<Message>,
    pub(crate) lost: Arc<AtomicU64>,
    pub(crate) owner: Arc<dyn Unsubscribe>,
}

impl Subscription {
    /// The next message, or `None` once the subscription or connection has ended.
    pub async fn next(&mut self) -> Option<Message> {
        if let Some(m) = self.ready.next() {
            return Some(m);
        }
        let batch = self.rx.recv().await?;
        self.ready = batch.into_iter();
        self.ready.next()
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
                self.ready = batch.into_iter();
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
