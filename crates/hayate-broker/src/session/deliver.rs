//! Delivery: offering a batch to each target's outbox, round robin within queue groups, and
//! what happens when an outbox is full (drop, or wait at most `max_block`, then the
//! subscription's stall policy).

use std::sync::atomic::Ordering;
use std::time::Duration;

use hayate_core::route::RoundRobin;
use hayate_core::{Congestion, Stall};

use super::Session;
use crate::Batch;
use crate::outbox::Offer;
use crate::route::Target;

impl Session {
    pub(super) async fn deliver_group(
        &mut self,
        id: &str,
        rr: &RoundRobin,
        members: &[Target],
        batch: Batch<'_>,
        park: bool,
    ) -> usize {
        // Round-robin per message: consecutive items of a batch go to consecutive members.
        let mut delivered = 0;
        let mut i = 0;
        while i < batch.len() {
            // The next member whose session is still open takes it (one outbox lock per
            // member tried: the offer itself reports a closed session). Members with a
            // connection come first; a detached one (an offline MQTT session) only when no
            // member is connected.
            let mut done = false;
            let any_attached = members.iter().any(|t| t.outbox.is_attached());
            for t in rr.rotation(members) {
                if any_attached && !t.outbox.is_attached() {
                    continue;
                }
                let (n_delivered, closed) = self.deliver(t, batch_item(batch, i)).await;
                delivered += n_delivered;
                if !closed {
                    done = true;
                    break;
                }
            }
            if !done && !park {
                break;
            }
            if !done {
                // Every member went away while this was routed (their sessions closed): what
                // is left waits in the group's declared queue, or is counted as unplaced.
                let rest = batch.slice(i, batch.len());
                let backlog = self.broker.read().queues.get(id).map(|(_, b)| b.clone());
                match backlog {
                    Some(b) => b.push(rest),
                    None => {
                        self.broker
                            .shared
                            .stats
                            .unplaced
                            .fetch_add(rest.len() as u64, Ordering::Relaxed);
                    }
                }
                break;
            }
            i += 1;
        }
        delivered
    }

    /// The common case of [`Session::deliver`], without a future: one offer that takes the
    /// whole batch (or finds the session closed, or is the publisher's own no-echo
    /// subscription), with the same result. `Err(took)` when the outbox could take only
    /// `took` items: the caller delivers the rest with [`Session::deliver`], which may
    /// wait.
    pub(super) fn deliver_now(
        &mut self,
        t: &Target,
        batch: Batch<'_>,
    ) -> Result<(usize, bool), usize> {
        let own = t.session == self.id;
        if own && t.no_echo {
            // Skipped like a closed member, so a queue group tries its next member.
            return Ok((0, true));
        }
        let offer = t.outbox.offer(t.sid, self.id, batch, own);
        match offer {
            Offer::Closed => Ok((0, true)),
            Offer::Took(n) => {
                if n > 0 {
                    self.mark_output(&t.outbox);
                    if let Some(at) = self.probe {
                        t.outbox
                            .probe(at, &self.broker.shared.stats.delivery_latency);
                    }
                }
                if n == batch.len() {
                    Ok((n, false))
                } else {
                    Err(n)
                }
            }
        }
    }

    /// Offers `batch` to one target; returns the number delivered and whether the target's
    /// session turned out to be closed (nothing more was delivered to it).
    pub(super) async fn deliver(&mut self, t: &Target, batch: Batch<'_>) -> (usize, bool) {
        let mut rest = batch;
        let mut delivered = 0;
        // Registered for a space notification only once an offer has failed (the common
        // path, where everything fits, neither registers nor makes the writer notify).
        let mut space = None;
        let mut deadline = None;
        loop {
            let took = match self.deliver_now(t, rest) {
                Ok((n, closed)) => return (delivered + n, closed),
                Err(took) => took,
            };
            delivered += took;
            // The outbox is full: its writer must run (offer woke it). Send what this
            // session queued elsewhere before possibly waiting.
            self.flush();
            // An offline session's outbox (nobody writes it) and a stalled `Stall::Drop`
            // subscriber drop at once instead of blocking.
            let drop_now = match t.congestion {
                Congestion::Drop => true,
                Congestion::Block => {
                    !t.outbox.is_attached() || (t.stall == Stall::Drop && t.outbox.is_stalled())
                }
            };
            if drop_now {
                self.count_dropped(t, (rest.len() - took) as u64);
                return (delivered, false);
            }
            rest = rest.slice(took, rest.len());
            let Some(s) = space.take() else {
                // Register, then offer again: room made after this offer failed but before
                // registering would otherwise be missed.
                space = Some(t.outbox.wait_space());
                continue;
            };
            // Registered before the offer that just failed: wait, at most `max_block` in
            // all for this delivery.
            let Some(max) = self.broker.shared.config.max_block else {
                s.await;
                continue;
            };
            let until = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + max);
            if tokio::time::timeout_at(until, s).await.is_ok() {
                continue;
            }
            self.stalled(t, max, rest.len() as u64);
            if t.stall == Stall::Drop {
                return (delivered, false);
            }
            // Cut off: the next offer is accepted (and discarded, or held by the tracker for
            // giving back) without waiting.
        }
    }

    fn count_dropped(&self, t: &Target, lost: u64) {
        t.outbox.count_lost(t.sid, lost);
        self.broker
            .shared
            .stats
            .dropped
            .fetch_add(lost, Ordering::Relaxed);
    }

    /// A publisher waited `max` for room in `t`'s outbox: apply its stall policy.
    fn stalled(&self, t: &Target, max: Duration, waiting: u64) {
        let stats = &self.broker.shared.stats;
        match t.stall {
            Stall::Drop => {
                tracing::warn!(
                    session = t.session,
                    sid = t.sid,
                    max_block_ms = max.as_millis() as u64,
                    "slow consumer: stalled past max_block; dropping its messages until it catches up"
                );
                stats.stalls.fetch_add(1, Ordering::Relaxed);
                t.outbox.set_stalled();
                self.count_dropped(t, waiting);
            }
            Stall::Disconnect => {
                // Counted and logged once, by whichever publisher cut it.
                if t.outbox.cut() {
                    tracing::warn!(
                        session = t.session,
                        sid = t.sid,
                        max_block_ms = max.as_millis() as u64,
                        "slow consumer: stalled past max_block; disconnecting it"
                    );
                    stats.slow_consumers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

fn batch_item(batch: Batch<'_>, i: usize) -> Batch<'_> {
    batch.slice(i, i + 1)
}
