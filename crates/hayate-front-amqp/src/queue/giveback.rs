//! Deliveries given back (requeued in place, or dead-lettered) and dead letters: what
//! leaves a queue unacknowledged.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_core::sync::lock;

use super::{QMsg, Queue, Unacked};

/// Gives back deliveries taken together (basic.recover, basic.nack or basic.reject with
/// `multiple`, a channel closed): each goes back to its place in its queue, redelivered
/// (`requeue`), or is dead-lettered, and only once all are back does each queue dispatch
/// (once). So they are redelivered in their original order (their places in the queue), as
/// RabbitMQ does, whatever order they come in; given back one by one, each went out again
/// at once, the last given back first.
pub(crate) fn give_back_all(items: impl IntoIterator<Item = Unacked>, requeue: bool) {
    let mut queues: Vec<Arc<Queue>> = Vec::new();
    for u in items {
        if !queues.iter().any(|q| Arc::ptr_eq(q, &u.queue)) {
            queues.push(u.queue.clone());
        }
        let q = u.queue.clone();
        q.take_back(u, requeue);
    }
    for q in queues {
        q.dispatch();
    }
}

/// Dead letters waiting for their task, at most (past it they are dropped, counted).
pub(super) const DEAD_LETTER_BACKLOG: usize = 65_536;

/// Publishes a dead letter (the message, and why: [`REJECTED`], [`EXPIRED`], [`MAXLEN`]).
pub(crate) type DeadLetters = Arc<
    dyn Fn(QMsg, &'static str) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync,
>;

/// Why a message left a queue without being acknowledged (the `x-death` reason).
pub(crate) const REJECTED: &str = "rejected";
pub(crate) const EXPIRED: &str = "expired";
pub(crate) const MAXLEN: &str = "maxlen";
pub(crate) const DELIVERY_LIMIT: &str = "delivery_limit";

impl Queue {
    /// Where dead letters go (set when the queue has `x-dead-letter-exchange`): a task
    /// publishes them one after the other, in the order they left the queue.
    pub(crate) fn set_dead_letters(&self, f: DeadLetters) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(QMsg, &'static str)>(DEAD_LETTER_BACKLOG);
        *lock(&self.dead) = Some(tx);
        tokio::spawn(async move {
            while let Some((m, why)) = rx.recv().await {
                f(m, why).await;
            }
        });
    }

    /// A delivery given back: to its place at the front of the queue (redelivered), or
    /// dead-lettered. Not dispatched: see [`give_back_all`].
    pub(super) fn take_back(self: &Arc<Self>, u: Unacked, requeue: bool) {
        if let Some(c) = &u.consumer {
            c.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        {
            let mut st = lock(&self.st);
            st.unacked_bytes = st.unacked_bytes.saturating_sub(u.msg.size());
        }
        let mut m = u.msg;
        if requeue && self.args.quorum {
            // A quorum queue counts returns (shown as `x-delivery-count`) and, past its
            // delivery limit, dead-letters the message instead.
            m.returns = m.returns.saturating_add(1);
            set_delivery_count(&mut m);
            if let (Some((s, _)), Some(id)) = (&self.store, m.stored) {
                s.note_return(id, m.returns);
            }
            if self.args.delivery_limit.is_some_and(|l| m.returns > l) {
                self.dead_letter_all(vec![m], DELIVERY_LIMIT);
                return;
            }
        }
        if requeue {
            m.redelivered = true;
            self.put(m, true, false);
        } else {
            self.dead_letter_all(vec![m], REJECTED);
        }
    }

    /// Messages that leave the queue unacknowledged: counted, and handed to the
    /// dead-letter task if there is one (the caller may hold a publisher's outbox lock; a
    /// dead letter may come back to this very queue).
    pub(super) fn dead_letter_all(&self, msgs: Vec<QMsg>, why: &'static str) {
        if msgs.is_empty() {
            return;
        }
        for m in &msgs {
            self.forget(m);
        }
        if why != REJECTED {
            self.dropped.fetch_add(msgs.len() as u64, Ordering::Relaxed);
        }
        let tx = lock(&self.dead).clone();
        if let Some(tx) = tx {
            for m in msgs {
                if tx.try_send((m, why)).is_err() {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Sets a quorum queue message's `x-delivery-count` header to its count of returns.
pub(super) fn set_delivery_count(m: &mut QMsg) {
    let h = m.msg.headers.get_or_insert_with(Vec::new);
    h.retain(|(k, _)| k != "x-delivery-count");
    h.push((
        "x-delivery-count".into(),
        bytes::Bytes::from(m.returns.to_string()),
    ));
}
