//! Dead letters: what a front-end makes of a message that left a queue unacknowledged
//! ([`DeadLetterer`]), and the queue's dead-letter task, which publishes them in order
//! from a session of its own.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use hayate_core::Message;

use super::{QItem, Queue, QueueId, Reason};
use crate::outbox::{Encoder, OutBuf};
use crate::{Batch, Broker};

/// Dead letters waiting for their task, at most (past it they are dropped, counted).
pub const DEAD_LETTER_BACKLOG: usize = 65_536;

/// What becomes of a queue's dead letters (AMQP: a message to its dead-letter exchange
/// with `x-first-death-*` headers; cycles and forbidden keys dropped).
pub trait DeadLetterer: Send + Sync {
    /// The message to publish for `item`, which left queue `queue` for `why`; `None`
    /// drops it.
    fn letter(&self, queue: &QueueId, item: QItem, why: Reason) -> Option<Message>;
}

/// The dead-letter task's publishing session's encoder: it subscribes to nothing.
struct NoOutput;

impl Encoder for NoOutput {
    fn encode(&mut self, _sid: u32, _batch: Batch<'_>, _origin: u64, _out: &mut OutBuf) {}
    fn encode_lost(&mut self, _sid: u32, _count: u64, _out: &mut OutBuf) {}
}

impl Queue {
    /// Where dead letters go: a task makes each into a message with `dl` and publishes
    /// them one after the other, in the order they left the queue, from a session of its
    /// own (opened at the first), so a dead-letter route whose subscriber holds its
    /// publishers back holds back this queue's dead letters only. Set once.
    pub fn set_dead_letterer(&self, broker: &Broker, dl: Arc<dyn DeadLetterer>) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<(QItem, Reason)>(DEAD_LETTER_BACKLOG);
        if self.dead.set(tx).is_err() {
            return;
        }
        let broker = broker.clone();
        let id = self.id.clone();
        tokio::spawn(async move {
            let mut session = None;
            while let Some((m, why)) = rx.recv().await {
                let Some(msg) = dl.letter(&id, m, why) else {
                    continue;
                };
                let session =
                    session.get_or_insert_with(|| broker.open_session(Box::new(NoOutput)));
                session.publish(Batch::One(&msg)).await;
                session.flush();
            }
        });
    }

    /// Messages that leave the queue unacknowledged: settled in the store, counted, and
    /// handed to the dead-letter task if there is one (the caller may hold a publisher's
    /// outbox lock; a dead letter may come back to this very queue).
    pub(super) fn dead_letter_all(&self, items: Vec<QItem>, why: Reason) {
        if items.is_empty() {
            return;
        }
        for m in &items {
            self.forget(m);
        }
        if why != Reason::Rejected {
            self.dropped
                .fetch_add(items.len() as u64, Ordering::Relaxed);
        }
        if let Some(tx) = self.dead.get() {
            for m in items {
                match tx.try_send((m, why)) {
                    Ok(()) => {
                        self.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        self.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}
