//! Subscriptions.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use hayate_core::sync::lock;
use hayate_core::{Key, Message};
use hayate_native::Items;
use tokio::sync::{Notify, mpsc, oneshot};

/// The subscription id of a connection's (or a peer node's) reply inbox: never given to a
/// subscription.
pub(crate) const INBOX_SID: u32 = u32::MAX;

/// Requests waiting for their replies, by token: the last segment of the reply-to key.
pub(crate) type Requests = Mutex<HashMap<u64, oneshot::Sender<Message>>>;

/// Hands `reply`, which came to the reply inbox, to the request waiting for it, if any.
pub(crate) fn complete_request(requests: &Requests, reply: Message) {
    let token = reply
        .key
        .as_str()
        .rsplit('/')
        .next()
        .and_then(|t| t.parse::<u64>().ok());
    if let Some(tx) = token.and_then(|t| lock(requests).remove(&t)) {
        let _ = tx.send(reply);
    }
}

/// A new subscription, and what whoever delivers into it keeps.
pub(crate) struct Opened {
    pub(crate) sid: u32,
    pub(crate) sub: Subscription,
    pub(crate) tx: SubSender,
    pub(crate) lost: Arc<AtomicU64>,
}

/// Opens a subscription with the next id from `next` (counting from 1; an error once they
/// are spent) and a [`queue`] of `capacity` batches and `bytes`; dropping it tells `owner`.
pub(crate) fn open(
    next: &AtomicU32,
    capacity: usize,
    bytes: usize,
    owner: Arc<dyn Unsubscribe>,
) -> crate::Result<Opened> {
    let sid = next.fetch_add(1, Ordering::Relaxed);
    if sid == INBOX_SID {
        return Err(crate::Error::Protocol("subscription ids exhausted".into()));
    }
    let (tx, rx) = queue(capacity, bytes);
    let lost = Arc::new(AtomicU64::new(0));
    Ok(Opened {
        sid,
        sub: Subscription::new(sid, rx, lost.clone(), owner),
        tx,
        lost,
    })
}

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

    /// The bytes it holds, as a subscription's queue counts them: every message's
    /// payload, or a plain batch's items as they came (lengths included).
    pub fn bytes(&self) -> usize {
        match self {
            Batch::Messages(v) => v.iter().map(|m| m.payload.len()).sum(),
            Batch::Plain { payloads, .. } => payloads.wire().len(),
        }
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
    rx: mpsc::Receiver<Queued>,
    room: Arc<Room>,
    /// Bytes of batches taken off the queue and not yet given back to `room`: given back
    /// together once they reach a sixteenth of the bound, or before the queue is waited on
    /// (so the receiver does not touch the count shared with the sender for every batch).
    owed: usize,
    ready: Ready,
    lost: Arc<AtomicU64>,
    owner: Arc<dyn Unsubscribe>,
}

impl Subscription {
    /// A subscription taking what is sent into `queue`'s sender; dropping it tells
    /// `owner`.
    pub(crate) fn new(
        sid: u32,
        queue: QueueEnd,
        lost: Arc<AtomicU64>,
        owner: Arc<dyn Unsubscribe>,
    ) -> Subscription {
        Subscription {
            sid,
            rx: queue.rx,
            room: queue.room,
            owed: 0,
            ready: Ready::default(),
            lost,
            owner,
        }
    }

    /// The next batch off the queue.
    async fn recv(&mut self) -> Option<Batch> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next batch off the queue, if there is one; gives back what it owes before it
    /// waits (not `try_recv` first: it parks the thread while a sender is mid-send).
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Batch>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(q)) => Poll::Ready(Some(self.taken(q))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                // About to wait: senders waiting for room must get it.
                self.give_owed();
                Poll::Pending
            }
        }
    }

    /// Counts `q`'s bytes as taken off the queue.
    fn taken(&mut self, q: Queued) -> Batch {
        self.owed += q.bytes;
        if self.owed >= self.room.give_at {
            self.give_owed();
        }
        q.batch
    }

    fn give_owed(&mut self) {
        if self.owed > 0 {
            self.room.give(std::mem::take(&mut self.owed));
        }
    }

    /// The next message, or `None` once the subscription or connection has ended.
    pub async fn next(&mut self) -> Option<Message> {
        if let Some(m) = self.ready.next() {
            return Some(m);
        }
        let batch = self.recv().await?;
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
        self.recv().await
    }

    /// Payload bytes queued for this subscription and not yet taken (the batch
    /// [`Subscription::next`] is taking messages from no longer counts): at most the
    /// connection's or node's `subscription_bytes`, or one batch when a batch alone is
    /// larger.
    pub fn pending_bytes(&self) -> usize {
        self.room
            .used
            .load(Ordering::Relaxed)
            .saturating_sub(self.owed)
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
        match self.poll_recv(cx) {
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

/// A batch in a subscription's queue, with the bytes it counts for.
#[derive(Debug)]
struct Queued {
    batch: Batch,
    bytes: usize,
}

/// The byte bound of one subscription's queue, shared by its sender and receiver.
#[derive(Debug)]
struct Room {
    /// Bytes of the batches queued (taken when sent, given back when received).
    used: AtomicUsize,
    limit: usize,
    /// What the receiver lets pile up before it gives bytes back (`limit / 16`).
    give_at: usize,
    /// Senders waiting in [`Room::take`]; the receiver wakes them only when there are some.
    waiting: AtomicUsize,
    freed: Notify,
}

impl Room {
    /// Takes `n` bytes if they fit (or the queue is empty: a batch alone may be larger
    /// than the limit).
    fn try_take(&self, n: usize) -> bool {
        // SeqCst: against `give`'s store and load of `waiting` (a sender that sees no room
        // is seen waiting by the receiver that makes room).
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u == 0 || u.saturating_add(n) <= self.limit).then(|| u.saturating_add(n))
            })
            .is_ok()
    }

    /// Waits until `n` bytes fit, and takes them.
    async fn take(&self, n: usize) {
        if self.try_take(n) {
            return;
        }
        let _waiting = Waiting::new(&self.waiting);
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(n) {
                return;
            }
            freed.await;
        }
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.freed.notify_waiters();
        }
    }
}

/// Counts a sender in [`Room::waiting`] while it lives (a wait given up by a timeout
/// included).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(w: &'a AtomicUsize) -> Waiting<'a> {
        w.fetch_add(1, Ordering::SeqCst);
        Waiting(w)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A subscription's queue: at most `capacity` batches and `bytes` payload bytes (past
/// which only an empty queue takes a batch). Its receiving end goes to
/// [`Subscription::new`].
pub(crate) fn queue(capacity: usize, bytes: usize) -> (SubSender, QueueEnd) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    let room = Arc::new(Room {
        used: AtomicUsize::new(0),
        limit: bytes.max(1),
        give_at: (bytes / 16).max(1),
        waiting: AtomicUsize::new(0),
        freed: Notify::new(),
    });
    (
        SubSender {
            tx,
            room: room.clone(),
        },
        QueueEnd { rx, room },
    )
}

/// The receiving end of [`queue`], for [`Subscription::new`].
#[derive(Debug)]
pub(crate) struct QueueEnd {
    rx: mpsc::Receiver<Queued>,
    room: Arc<Room>,
}

/// Why [`SubSender::try_send`] did not queue a batch (it is given back).
#[derive(Debug)]
pub(crate) enum TrySendError {
    /// No room: too many batches or bytes queued.
    Full(Batch),
    /// The subscription is gone.
    Closed,
}

/// The subscription is gone.
#[derive(Debug)]
pub(crate) struct Closed;

/// Whoever delivers into one subscription: queues batches within its bounds.
#[derive(Debug, Clone)]
pub(crate) struct SubSender {
    tx: mpsc::Sender<Queued>,
    room: Arc<Room>,
}

impl SubSender {
    /// Queues `batch` if there is room now.
    pub(crate) fn try_send(&self, batch: Batch) -> Result<(), TrySendError> {
        let bytes = batch.bytes();
        if !self.room.try_take(bytes) {
            return Err(if self.tx.is_closed() {
                TrySendError::Closed
            } else {
                TrySendError::Full(batch)
            });
        }
        self.tx.try_send(Queued { batch, bytes }).map_err(|e| {
            self.room.give(bytes);
            match e {
                mpsc::error::TrySendError::Full(q) => TrySendError::Full(q.batch),
                mpsc::error::TrySendError::Closed(_) => TrySendError::Closed,
            }
        })
    }

    /// Waits for room for `bytes` bytes and one batch, and holds it for
    /// [`Permit::send`]. Cancelling the wait (a timeout) takes nothing.
    pub(crate) async fn reserve(&self, bytes: usize) -> Result<Permit, Closed> {
        let permit = self.tx.clone().reserve_owned().await.map_err(|_| Closed)?;
        tokio::select! {
            () = self.room.take(bytes) => {}
            () = self.tx.closed() => return Err(Closed),
        }
        Ok(Permit {
            permit: Some(permit),
            room: self.room.clone(),
            bytes,
        })
    }

    /// Waits for room and queues `batch` (the broker connection's reader: waiting is
    /// the back-pressure of a slow subscriber).
    pub(crate) async fn send(&self, batch: Batch) -> Result<(), Closed> {
        let permit = self.reserve(batch.bytes()).await?;
        permit.send(batch);
        Ok(())
    }
}

/// Room held in a subscription's queue for one batch: [`SubSender::reserve`].
#[derive(Debug)]
pub(crate) struct Permit {
    permit: Option<mpsc::OwnedPermit<Queued>>,
    room: Arc<Room>,
    bytes: usize,
}

impl Permit {
    /// Queues `batch`, counted as the bytes reserved (its [`Batch::bytes`]).
    pub(crate) fn send(mut self, batch: Batch) {
        let bytes = std::mem::take(&mut self.bytes);
        if let Some(p) = self.permit.take() {
            p.send(Queued { batch, bytes });
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.room.give(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(len: usize) -> Batch {
        let key = Key::new("q").unwrap();
        Batch::Messages(vec![Message::new(key, vec![0u8; len])])
    }

    /// Senders that wait for room are woken as the receiver takes: all of them get
    /// through, and the queue never holds more than its bound plus one batch.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_senders_all_get_through_within_the_bound() {
        const LIMIT: usize = 1000;
        const EACH: usize = 2000;
        let (tx, end) = queue(4, LIMIT);
        let room = end.room.clone();
        let mut sub = Subscription::new(1, end, Arc::new(AtomicU64::new(0)), Arc::new(Nobody));
        let senders: Vec<_> = (0..4)
            .map(|s| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    for i in 0..EACH {
                        let len = (s * 131 + i * 37) % 700 + 1;
                        if i % 2 == 0 {
                            tx.send(batch(len)).await.unwrap();
                        } else {
                            let p = tx.reserve(len).await.unwrap();
                            p.send(batch(len));
                        }
                    }
                })
            })
            .collect();
        drop(tx);
        let mut got = 0;
        while let Some(b) = sub.next_batch().await {
            assert!(room.used.load(Ordering::SeqCst) <= LIMIT + 700);
            assert!(sub.pending_bytes() <= LIMIT + 700);
            got += b.len();
        }
        for s in senders {
            s.await.unwrap();
        }
        assert_eq!(got, 4 * EACH);
        assert_eq!(sub.pending_bytes(), 0);
    }

    /// The receiver gives back what it took lazily, but always before it waits: a sender
    /// of a batch nearly as large as the bound is not left waiting on bytes the receiver
    /// owes.
    #[tokio::test]
    async fn a_receiver_about_to_wait_gives_back_what_it_took() {
        let (tx, end) = queue(16, 1600);
        let mut sub = Subscription::new(1, end, Arc::new(AtomicU64::new(0)), Arc::new(Nobody));
        tx.send(batch(50)).await.unwrap();
        assert_eq!(sub.next_batch().await.unwrap().bytes(), 50);
        let big = tokio::spawn(async move { tx.send(batch(1590)).await.unwrap() });
        let b = tokio::time::timeout(std::time::Duration::from_secs(5), sub.next_batch())
            .await
            .expect("the sender was left waiting")
            .unwrap();
        assert_eq!(b.bytes(), 1590);
        big.await.unwrap();
    }

    #[derive(Debug)]
    struct Nobody;

    impl Unsubscribe for Nobody {
        fn unsubscribe(&self, _: u32) {}
    }

    /// `try_send` refuses past the bound (but an empty queue takes anything), and a
    /// reservation dropped unused gives its bytes back.
    #[tokio::test]
    async fn try_send_keeps_to_the_bound_and_a_dropped_permit_gives_back() {
        let (tx, end) = queue(16, 100);
        assert!(
            tx.try_send(batch(500)).is_ok(),
            "an empty queue takes anything"
        );
        assert!(matches!(tx.try_send(batch(1)), Err(TrySendError::Full(_))));
        let mut sub_rx = end.rx;
        let q = sub_rx.recv().await.unwrap();
        end.room.give(q.bytes);
        assert!(tx.try_send(batch(60)).is_ok());
        assert!(matches!(tx.try_send(batch(60)), Err(TrySendError::Full(_))));
        let p = tx.reserve(40).await.unwrap();
        assert_eq!(end.room.used.load(Ordering::SeqCst), 100);
        drop(p);
        assert_eq!(end.room.used.load(Ordering::SeqCst), 60);
        drop(sub_rx);
        assert!(matches!(tx.try_send(batch(60)), Err(TrySendError::Closed)));
    }
}
