//! What a queue's broker session is given ([`QueueEncoder`]: into the queue, each publish
//! once, [`Taken`]), and what queues did with a publish for its publisher ([`ROUTED`]).

use std::sync::{Arc, Weak};

use hayate_broker::{Batch, Encoder, OutBuf};

use hayate_broker::queue::Via;

use super::Queue;
use crate::names;
use crate::store::Store;

/// What queues did with a message an AMQP connection's task is routing, for its publish
/// to read after: a queue encodes synchronously in the publishing task, so what it notes
/// here reaches the publish that caused it (and nobody else's).
#[derive(Debug, Default)]
pub(crate) struct Routed {
    /// A queue took it (a headers binding's arguments matched): routed, for `mandatory`.
    pub(crate) queued: std::cell::Cell<bool>,
    /// A queue refused it (`x-overflow` `reject-publish`, or no room in the memory
    /// budget): the publisher's confirm is a basic.nack, as in RabbitMQ.
    pub(crate) refused: std::cell::Cell<bool>,
    /// Durable queues stored it: the confirm waits until these records are durable.
    pub(crate) stored: std::cell::RefCell<Vec<(Arc<Store>, u64)>>,
    /// Offers to queues' bindings and routes (each counted as delivered by the broker,
    /// taken or not: a headers binding's arguments, a route's hops, a key of another vhost
    /// may refuse it): a mandatory publish is routed if a queue took it or something other
    /// than a queue was offered it.
    pub(crate) queue_offers: std::cell::Cell<usize>,
}

tokio::task_local! {
    pub(crate) static ROUTED: Routed;
}

fn note_refused() {
    let _ = ROUTED.try_with(|r| r.refused.set(true));
}

fn note_stored(store: &Arc<Store>, offset: u64) {
    let _ = ROUTED.try_with(|r| r.stored.borrow_mut().push((store.clone(), offset)));
}

/// A queue's broker session's encoder: appends what its bindings receive to the queue.
pub(crate) struct QueueEncoder {
    pub(crate) queue: Weak<Queue>,
    /// The last publishes taken, as `hayate_broker::session::current_publish` names them,
    /// with the items of each batch taken: a publish matching several bindings enters the
    /// queue once, as in RabbitMQ.
    pub(crate) taken: Taken,
}

/// The publishes a queue took last (one entry per publishing session, the most recent
/// [`TAKEN_SESSIONS`]).
#[derive(Debug, Default)]
pub(crate) struct Taken(std::collections::VecDeque<((u64, u64), Vec<bool>)>);

/// Publishing sessions whose last publish a queue remembers. One forgotten (more sessions
/// publishing into the queue at the same moment) can only let a duplicate in, as before.
const TAKEN_SESSIONS: usize = 16;

impl Taken {
    /// Item `i` of publish `p` (of `n` items) was taken already; else notes it as taken
    /// (`(0, 0)`, no publish known: never a duplicate).
    pub(super) fn seen(&mut self, p: (u64, u64), i: usize, n: usize) -> bool {
        if p == (0, 0) {
            return false;
        }
        let e = match self.0.iter().position(|(q, _)| q.0 == p.0) {
            Some(at) if self.0[at].0 == p => &mut self.0[at].1,
            Some(at) => {
                let e = &mut self.0[at];
                e.0 = p;
                e.1.clear();
                e.1.resize(n, false);
                &mut e.1
            }
            None => {
                if self.0.len() == TAKEN_SESSIONS {
                    self.0.pop_front();
                }
                self.0.push_back((p, vec![false; n]));
                &mut self.0.back_mut().expect("pushed").1
            }
        };
        if e.len() < n {
            e.resize(n, false);
        }
        std::mem::replace(&mut e[i], true)
    }
}

impl Encoder for QueueEncoder {
    fn encode(&mut self, sid: u32, batch: Batch<'_>, _origin: u64, _out: &mut OutBuf) {
        let _ = ROUTED.try_with(|r| r.queue_offers.set(r.queue_offers.get() + batch.len()));
        let Some(q) = self.queue.upgrade() else {
            return;
        };
        let Some((exchange, args, via)) = q.binding(sid) else {
            return;
        };
        let x = exchange.as_str().unwrap_or("");
        let publish = hayate_broker::session::current_publish();
        for i in 0..batch.len() {
            let msg = batch.message(i);
            // A key of another vhost (a `/` binding's wildcard covers them all): not this
            // queue's.
            if q.vhost.foreign(msg.key.as_str()) {
                continue;
            }
            if args
                .as_ref()
                .is_some_and(|a| !crate::headers_match(a, &msg))
            {
                continue;
            }
            let rk = names::routing_key_of(x, q.vhost.strip(msg.key.as_str()));
            // A route: every further exchange-to-exchange hop of one of its paths, and the
            // queue's binding, must take it too.
            if via.as_ref().is_some_and(|paths| {
                !paths
                    .iter()
                    .any(|hops| hops.iter().all(|h| h.passes(&rk, &msg)))
            }) {
                continue;
            }
            // Taken already through another of the queue's bindings.
            if self.taken.seen(publish, i, batch.len()) {
                continue;
            }
            let _ = ROUTED.try_with(|r| r.queued.set(true));
            // The string's buffer becomes the subject's (no second copy); a routing key
            // is a short string (cut at 255 bytes).
            let subject = if rk.len() <= 255 {
                bytes::Bytes::from(rk)
            } else {
                hayate_amqp::ShortStr::lit(&rk).bytes().clone()
            };
            let via = Via {
                source: exchange.bytes().clone(),
                subject,
            };
            let offered = q.core.offer(q.core.item(msg, via));
            if offered.refused {
                note_refused();
            }
            if let (Some(o), Some((store, _))) = (offered.stored, &q.store) {
                note_stored(store, o);
            }
        }
    }

    fn encode_lost(&mut self, _sid: u32, count: u64, _out: &mut OutBuf) {
        if let Some(q) = self.queue.upgrade() {
            q.note_dropped(count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Taken;

    #[test]
    fn a_publish_is_taken_once_per_item_whatever_the_bindings_and_interleavings() {
        let mut t = Taken::default();
        // Publish 7 of session 1, two items, offered through two bindings.
        assert!(!t.seen((1, 7), 0, 2));
        assert!(!t.seen((1, 7), 1, 2));
        // Session 2's publish offered in between.
        assert!(!t.seen((2, 3), 0, 1));
        assert!(t.seen((1, 7), 0, 2), "the second binding's offer of item 0");
        assert!(t.seen((1, 7), 1, 2));
        assert!(t.seen((2, 3), 0, 1));
        // Session 1's next publish is new.
        assert!(!t.seen((1, 8), 0, 1));
        // No publish known: never a duplicate.
        assert!(!t.seen((0, 0), 0, 1));
        assert!(!t.seen((0, 0), 0, 1));
        // Sixteen other sessions push session 1 out: a duplicate can then pass, nothing
        // is refused.
        for s in 10..26 {
            assert!(!t.seen((s, 1), 0, 1));
        }
        assert!(!t.seen((1, 8), 0, 1));
    }
}
