//! A member of a durable consumer: a task that claims the consumer's messages one at a time
//! and delivers them into one session's outbox as acknowledged deliveries (the outbox's
//! byte budget holds it back, so a member far behind reads no faster than its client takes).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hayate_core::Message;
use hayate_log::{Error as LogError, ReadLimit, Record};

use super::codec;
use super::consumer::{Consumer, Step};
use crate::outbox::{Offer, Outbox};
use crate::{Batch, Broker};

/// A message with this header (decimal ms since the Unix epoch) is not delivered before then.
pub const DELIVER_AT: &str = "hayate-deliver-at";
/// A message with this header (decimal ms) is not delivered before its publication plus that.
pub const DELAY: &str = "hayate-delay";
/// A message with this header (decimal ms) is not delivered once that long has passed since
/// it was published (a per-message time to live for protocols without one of their own).
pub const TTL: &str = "hayate-ttl";
/// Dead letters carry why (`max_deliver`), where from and how often they were delivered.
/// Each dead-lettering adds these five headers again (earlier ones are kept), so a dead
/// letter lists every stream it passed through: one dead-lettered out of a stream it was
/// dead-lettered out of before is dropped (a cycle), counted in the consumer's
/// `dead_letter_cycles`.
pub const DEAD_REASON: &str = "hayate-dead-reason";
/// See [`DEAD_REASON`].
pub const DEAD_STREAM: &str = "hayate-dead-stream";
/// See [`DEAD_REASON`].
pub const DEAD_CONSUMER: &str = "hayate-dead-consumer";
/// See [`DEAD_REASON`].
pub const DEAD_OFFSET: &str = "hayate-dead-offset";
/// See [`DEAD_REASON`].
pub const DEAD_DELIVERIES: &str = "hayate-dead-deliveries";

fn header_ms(m: &Message, name: &str) -> Option<i64> {
    let v = m
        .headers
        .as_ref()?
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))?
        .1
        .clone();
    std::str::from_utf8(&v).ok()?.trim().parse().ok()
}

/// When `m` (published at `ts`) may be delivered, if it names a time (ms since the epoch).
pub fn deliver_at(m: &Message, ts: i64) -> Option<i64> {
    header_ms(m, DELIVER_AT).or_else(|| header_ms(m, DELAY).map(|d| ts.saturating_add(d)))
}

/// Redelivered offsets a member gathers before it supersedes their earlier deliveries in
/// its session at once (one walk of the session's deliveries per batch).
const SUPERSEDE_BATCH: usize = 256;

/// The offset a member has claimed and not yet handed to its outbox ([`NONE`] if none): a
/// front-end that stops the member gives it back.
pub type Claimed = Arc<std::sync::atomic::AtomicU64>;
/// No offset claimed.
pub const NONE: u64 = u64::MAX;

/// A claim as [`Claimed`] holds it: the offset in the high 40 bits, the delivery number in
/// the low 24 (offsets and counts beyond are not expected of one member's claim).
fn pack(offset: u64, n: u32) -> u64 {
    (offset << 24) | u64::from(n & 0xff_ffff)
}

/// The (offset, delivery number) of a packed claim.
pub fn unpack(claim: u64) -> (u64, u32) {
    (claim >> 24, (claim & 0xff_ffff) as u32)
}

/// How a member delivers.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the member shows the offset it claimed and has not handed to the outbox yet.
    pub claimed: Claimed,
    /// Deliver on a plain (not acknowledged) subscription and count each message as
    /// acknowledged once queued for the socket (STOMP `ack:auto`): at most once from there.
    pub auto_ack: bool,
}

/// Runs one member of `consumer` delivering to subscription `sid` of `outbox` until the
/// consumer is deleted or the outbox closes (the front-end also aborts it when the
/// subscription ends; what it had in flight is given back by the front-end).
pub async fn run(
    consumer: Arc<Consumer>,
    broker: Broker,
    outbox: Arc<Outbox>,
    sid: u32,
    opts: Options,
) {
    use std::sync::atomic::Ordering;
    let mut scratch = VecDeque::new();
    let mut meta = Vec::new();
    let mut ahead = ReadAhead::default();
    // The wait for new records, kept while it waits for the same offset (a new one per
    // iteration would leave a waiter behind in the log each time another branch wins).
    let mut more: Option<(u64, Pin<Box<hayate_log::Confirmed>>)> = None;
    // What this member's session may hold unacknowledged: the consumer's max_in_flight,
    // and no more than the session's window sends (beyond it, deliveries would wait unsent
    // while their ack wait runs).
    let cap = (consumer.config.max_in_flight as usize).min(broker.config().max_unacked);
    // Offsets delivered again through this member (an ack wait ran out, a NACK), with the
    // delivery now sent: the session's earlier delivery of each is superseded (retired from
    // its window) in batches, before the member looks at its cap or waits.
    let mut redone: HashMap<u64, u32> = HashMap::new();
    let mut skipped = 0u32;
    let owner = consumer.member();
    loop {
        consumer.persist_if_due();
        let changed = consumer.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if redone.len() >= SUPERSEDE_BATCH {
            outbox.supersede(sid, &redone);
            redone.clear();
        }
        // A client that does not acknowledge holds at most `cap` here: at it, the member
        // claims no new message, but still what is due again (its ack wait ran out): that
        // delivery supersedes the one this session holds, so the count stays put (while a
        // batch is gathered it may look higher: new messages wait for the batch).
        let room = opts.auto_ack || outbox.unacked() < cap;
        let step = consumer.step(owner, Instant::now(), room);
        let prepared = match step {
            Step::Stop => return,
            Step::Deliver { offset, n } => {
                prepare(&consumer, offset, n, &mut ahead).map(|m| (offset, n, m))
            }
            Step::DeadLetter { offset, n } => {
                expel(&consumer, &broker, offset, n, &mut meta, &mut ahead);
                None
            }
            Step::Wait { until, tail } => {
                if !redone.is_empty() {
                    outbox.supersede(sid, &redone);
                    redone.clear();
                    continue;
                }
                // Full: acknowledgements wake the member, but room made otherwise (another
                // subscription of the session acknowledged) is looked at every 100 ms.
                let until = if room {
                    until
                } else {
                    let soon = Instant::now() + Duration::from_millis(100);
                    Some(until.map_or(soon, |u| u.min(soon)))
                };
                let until = until.map(tokio::time::Instant::from_std);
                if let Some(t) = tail
                    && more.as_ref().is_none_or(|(at, _)| *at != t)
                {
                    more = Some((t, Box::pin(consumer.stream.log().confirmed(t))));
                }
                let wait_more = tail.is_some();
                tokio::select! {
                    () = &mut changed => {}
                    () = tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)), if until.is_some() => {}
                    r = async { more.as_mut().map(|(_, f)| f.as_mut()).expect("set above").await }, if wait_more => {
                        more = None;
                        if r.is_err() {
                            // The log failed: nothing new will come; wake for changes only.
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
                continue;
            }
        };
        let Some((offset, n, msg)) = prepared else {
            // Skipped (filtered out, expired, scheduled, dead-lettered): let others run
            // now and then, as a long run of skips never waits.
            skipped += 1;
            if skipped.is_multiple_of(64) {
                tokio::task::yield_now().await;
            }
            continue;
        };
        opts.claimed.store(pack(offset, n), Ordering::Release);
        let taken = offer(&outbox, sid, &msg).await;
        opts.claimed.store(NONE, Ordering::Release);
        if !taken {
            consumer.give_back(offset, n, Duration::ZERO);
            consumer.persist_if_due();
            return;
        }
        if opts.auto_ack {
            consumer.ack(offset);
        } else if n > 1 {
            redone.insert(offset, n);
        }
        outbox.try_flush(&mut scratch);
        // Let the consumer's other members take their turn.
        tokio::task::yield_now().await;
    }
}

/// Reads claimed offset `offset` (its message and when it was published); `None` when it
/// is not to be delivered (gone, unreadable, filtered out, expired: done now; a failed read:
/// `retry`).
fn read(
    c: &Consumer,
    offset: u64,
    ahead: &mut ReadAhead,
    retry: impl FnOnce(),
) -> Option<(Message, i64)> {
    let rec = match ahead.get(c, offset) {
        Ok(Some(r)) => r,
        Ok(None) | Err(LogError::OffsetOutOfRange { .. }) => {
            c.done(offset); // removed by retention
            return None;
        }
        Err(e) => {
            tracing::warn!(stream = %c.stream.name(), offset, "consumer read: {e}");
            retry();
            return None;
        }
    };
    let msg = match codec::decode(&rec) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(stream = %c.stream.name(), "{e}; skipped");
            c.done(offset);
            return None;
        }
    };
    if c.filter.as_ref().is_some_and(|f| !f.matches(&msg.key)) {
        c.done(offset);
        return None;
    }
    let ttl_passed = c.stream.config().default_ttl_ms.is_some_and(|ttl| {
        rec.timestamp
            .saturating_add(i64::try_from(ttl).unwrap_or(i64::MAX))
            < codec::now_ms()
    });
    let own_ttl_passed =
        header_ms(&msg, TTL).is_some_and(|ttl| rec.timestamp.saturating_add(ttl) < codec::now_ms());
    if ttl_passed || own_ttl_passed || msg.attrs.expires.is_some_and(|e| e <= Instant::now()) {
        c.done(offset);
        return None;
    }
    Some((msg, rec.timestamp))
}

/// Reads and checks claimed offset `offset`; `None` when it is not to be delivered now
/// (gone, filtered out, expired, scheduled for later), the consumer updated.
fn prepare(c: &Consumer, offset: u64, n: u32, ahead: &mut ReadAhead) -> Option<Message> {
    let retry = || c.give_back(offset, n, Duration::from_secs(1));
    let (mut msg, ts) = read(c, offset, ahead, retry)?;
    if n == 1
        && let Some(at) = deliver_at(&msg, ts)
    {
        let wait = at.saturating_sub(codec::now_ms());
        if wait > 0 {
            c.defer(
                offset,
                Instant::now() + Duration::from_millis(wait.unsigned_abs()),
            );
            return None;
        }
    }
    msg.attrs.stream_offset = Some(offset);
    msg.attrs.deliveries = n;
    msg.attrs.redelivered = n > 1;
    Some(msg)
}

/// Dead-letters offset `offset`, delivered `n` times (`max_deliver`), unless it is gone,
/// filtered out or expired (done then); one not kept by the dead-letter stream is not
/// dropped either: tried again later.
fn expel(
    c: &Consumer,
    broker: &Broker,
    offset: u64,
    n: u32,
    meta: &mut Vec<u8>,
    ahead: &mut ReadAhead,
) {
    let retry = || c.dead_letter_later(offset, n, Duration::from_secs(1));
    let Some((msg, _)) = read(c, offset, ahead, retry) else {
        return;
    };
    if dead_letter(c, broker, &msg, offset, n, meta) {
        c.done(offset);
    } else {
        c.dead_letter_later(offset, n, Duration::from_secs(5));
    }
}

/// Keeps a dead letter; false when it could not be kept (to be tried again).
fn dead_letter(
    c: &Consumer,
    broker: &Broker,
    msg: &Message,
    offset: u64,
    n: u32,
    meta: &mut Vec<u8>,
) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    let dropped = || {
        c.dead.dropped.fetch_add(1, Relaxed);
        true
    };
    let Some(dl) = c.config.dead_letter.as_deref() else {
        tracing::info!(stream = %c.stream.name(), consumer = %c.config.name, offset, "dropped after {n} deliveries");
        return dropped();
    };
    // Dead-lettered out of this stream before: a cycle (this consumer's dead letters come
    // back to its stream, directly or through others). Dropped, not sent round for ever:
    // each stream is passed through at most once, so a chain of dead letters is no longer
    // than the number of streams.
    if was_dead_lettered_from(msg, c.stream.name()) {
        c.dead.cycles.fetch_add(1, Relaxed);
        tracing::info!(stream = %c.stream.name(), consumer = %c.config.name, offset, dead_letter = dl,
            "dead letter dropped: it was dead-lettered out of this stream before (a cycle)");
        return true;
    }
    let Some(target) = broker.stream(dl) else {
        tracing::warn!(stream = %c.stream.name(), consumer = %c.config.name, dead_letter = dl, "no such dead-letter stream; dropped");
        return dropped();
    };
    // The stream of that name may have been deleted and made again by another user since
    // the consumer was created: a user's dead letters go only into that user's streams or
    // unowned ones (a consumer saved before creators were recorded: its owner's).
    if let (Some(u), Some(o)) = (c.config.made_by(), &target.config().owner)
        && u != o
    {
        tracing::warn!(stream = %c.stream.name(), consumer = %c.config.name, dead_letter = dl, owner = %o,
            "the dead-letter stream belongs to another user now; dropped");
        return dropped();
    }
    let mut m = msg.clone();
    let h = m.headers.get_or_insert_with(Vec::new);
    h.push((DEAD_REASON.into(), Bytes::from_static(b"max_deliver")));
    h.push((DEAD_STREAM.into(), Bytes::from(c.stream.name().to_owned())));
    h.push((DEAD_CONSUMER.into(), Bytes::from(c.config.name.clone())));
    h.push((DEAD_OFFSET.into(), Bytes::from(offset.to_string())));
    h.push((DEAD_DELIVERIES.into(), Bytes::from(n.to_string())));
    match target.append(Batch::One(&m), meta) {
        Ok(_) => {
            c.dead.moved.fetch_add(1, Relaxed);
            true
        }
        Err(e) => {
            tracing::warn!(
                dead_letter = dl,
                "dead letter not kept, tried again later: {e}"
            );
            false
        }
    }
}

/// Whether `m` carries a [`DEAD_STREAM`] header naming `stream` (each dead-lettering adds
/// one, so a dead letter lists every stream it was dead-lettered out of).
fn was_dead_lettered_from(m: &Message, stream: &str) -> bool {
    m.headers
        .iter()
        .flatten()
        .any(|(k, v)| k.eq_ignore_ascii_case(DEAD_STREAM) && v.as_ref() == stream.as_bytes())
}

/// Records read ahead of the member's claims: a member mostly claims consecutive offsets, so
/// one read of up to [`READ_AHEAD_BYTES`] serves many of them (a record claimed by another
/// member in between is skipped). At most that much plus one record is held per member.
#[derive(Default)]
struct ReadAhead {
    records: VecDeque<Record>,
}

/// How much a member reads ahead at once.
const READ_AHEAD_BYTES: usize = 1 << 20;

impl ReadAhead {
    fn get(&mut self, c: &Consumer, offset: u64) -> Result<Option<Record>, LogError> {
        while self.records.front().is_some_and(|r| r.offset < offset) {
            self.records.pop_front();
        }
        if self.records.front().is_none_or(|r| r.offset != offset) {
            self.records.clear();
            let limit = ReadLimit {
                max_bytes: READ_AHEAD_BYTES,
                max_records: 512,
                confirmed_only: false,
            };
            self.records = c.stream.log().read(offset, limit)?.records.into();
        }
        Ok(self.records.pop_front().filter(|r| r.offset == offset))
    }
}

/// Offers `msg` to `sid`, waiting for room; false when the outbox is closed.
async fn offer(outbox: &Outbox, sid: u32, msg: &Message) -> bool {
    loop {
        let space = outbox.wait_space();
        tokio::pin!(space);
        space.as_mut().enable();
        // `own`: only the bytes queued for the socket count against the budget, not the
        // deliveries held for acknowledgement. Those are bounded by the consumer's
        // max_in_flight, and counting them would deadlock a client that acknowledges in
        // batches larger than the budget holds (it waits for more messages before acking,
        // the member waits for acks before sending).
        match outbox.offer(sid, 0, Batch::One(msg), true) {
            Offer::Took(1) => return true,
            Offer::Took(_) => space.await,
            Offer::Closed => return false,
        }
    }
}
