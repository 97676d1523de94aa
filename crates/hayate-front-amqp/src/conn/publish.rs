//! basic.publish: a publish and its content frames ([`Pending`], [`Body`]), made a message
//! with its key ([`Conn::prepare`]; the keys a connection published to last,
//! [`PublishKeys`]) and published ([`Conn::publish`]; mandatory returns, what confirms and
//! transactions wait for).

use std::sync::atomic::Ordering;

use bytes::{Bytes, BytesMut};
use hayate_amqp::{ContentHeader, Frame, Method, ReplyCode, ShortStr};
use hayate_broker::{Batch, Session};
use hayate_core::Key;
use hayate_core::sync::lock;

use super::channel::Channel;
use super::confirm::{Durable, count_publish};
use super::error::{AmqpError, End, err};
use super::frames::{Later, Rest};
use super::tx::{TxOp, tx_room};
use super::{Conn, REPLY_SUFFIX};
use crate::Exchange;
use crate::delivery::{encode_content, message_of};
use crate::names::{Kind, REPLY_TO_QUEUE};

/// What a content frame left to do.
pub(super) enum Content {
    /// Nothing yet: more content to come (or the channel is closing).
    More,
    /// The message is whole.
    Complete,
    /// The message is refused: a soft error for the channel.
    Refused(AmqpError),
}

/// A publish waiting for its content.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) exchange: ShortStr,
    pub(super) routing_key: ShortStr,
    pub(super) mandatory: bool,
    /// Boxed as the frame brought it: moved from frame to publish without copying its
    /// properties.
    pub(super) header: Option<Box<ContentHeader>>,
    pub(super) body: Body,
}

/// A publish checked and made a message ([`Conn::prepare`]).
struct Prepared {
    /// The exchange's type.
    kind: Kind,
    msg: hayate_core::Message,
    /// Whether its key is valid: if not, it is routed nowhere and `msg`'s key only carries
    /// the content (for a basic.return).
    routable: bool,
}

/// A message's body as its frames bring it: the one frame's bytes as they are (no copy:
/// most bodies come in one frame), or the frames copied together.
#[derive(Debug, Default)]
pub(super) struct Body {
    one: Option<Bytes>,
    many: BytesMut,
}

/// The most a body of several frames reserves at once (a larger one grows as it arrives).
const BODY_RESERVE: usize = 16 << 20;

impl Body {
    pub(super) fn len(&self) -> usize {
        self.one.as_ref().map_or(0, Bytes::len) + self.many.len()
    }

    /// Adds a body frame's payload of a body of `total` bytes (as its header announced).
    fn push(&mut self, b: Bytes, total: usize) {
        if self.one.is_none() && self.many.is_empty() {
            self.one = Some(b);
            return;
        }
        if let Some(first) = self.one.take() {
            // The second frame: room for the whole body at once (up to `BODY_RESERVE`),
            // instead of a buffer doubling through copies of everything received so far.
            // Only what arrives is written (and charged to the memory budget).
            self.many.reserve(total.min(BODY_RESERVE));
            self.many.extend_from_slice(&first);
        }
        self.many.extend_from_slice(&b);
    }

    fn freeze(self) -> Bytes {
        match self.one {
            Some(b) => b,
            None => self.many.freeze(),
        }
    }
}

/// Publish keys a connection remembers ([`Conn::publish_key`]): one RPC server answering
/// this many callers still finds every reply-to's key.
const PUBLISH_KEYS: usize = 32;

/// The keys of a connection's last [`PUBLISH_KEYS`] distinct (exchange, routing key)
/// pairs. Each entry keeps its own copy of the two names (`names`, the exchange's first
/// `split` bytes), so no read buffer is kept alive; once full, a miss overwrites the oldest
/// entry in its buffer, so a connection that cycles through more targets than this pays a
/// copy of two short names per publish and no allocation beyond the key's own.
#[derive(Default)]
pub(super) struct PublishKeys {
    entries: Vec<KeyEntry>,
    /// The entry the next miss overwrites once full.
    next: usize,
}

struct KeyEntry {
    names: Vec<u8>,
    split: usize,
    kind: Kind,
    key: Option<Key>,
}

impl PublishKeys {
    fn get(&self, x: &[u8], kind: Kind, rk: &[u8]) -> Option<&Option<Key>> {
        self.entries
            .iter()
            .find(|e| {
                e.kind == kind
                    && e.names.len() == x.len() + rk.len()
                    && e.names[..e.split] == *x
                    && e.names[e.split..] == *rk
            })
            .map(|e| &e.key)
    }

    fn put(&mut self, x: &[u8], kind: Kind, rk: &[u8], key: Option<Key>) {
        let e = if self.entries.len() < PUBLISH_KEYS {
            self.entries.push(KeyEntry {
                names: Vec::new(),
                split: 0,
                kind,
                key: None,
            });
            self.entries.last_mut().expect("just pushed")
        } else {
            let e = &mut self.entries[self.next];
            self.next = (self.next + 1) % PUBLISH_KEYS;
            e
        };
        e.names.clear();
        e.names.extend_from_slice(x);
        e.names.extend_from_slice(rk);
        e.split = x.len();
        e.kind = kind;
        e.key = key;
    }

    pub(super) fn clear(&mut self) {
        self.entries.clear();
        self.next = 0;
    }
}

/// A key for content that has none (an unroutable publish returned).
pub(super) fn return_key() -> Key {
    Key::new("amqp").unwrap_or_else(|_| unreachable!("a valid key"))
}

impl Conn<'_> {
    /// A content header: `Content::Complete` when it ends the message (an empty body).
    pub(super) fn content_header(
        &mut self,
        ch: u16,
        h: Box<ContentHeader>,
    ) -> Result<Content, End> {
        let max = self.amqp.cfg.max_message_size;
        let Some(c) = self.content_chan(ch)? else {
            return Ok(Content::More);
        };
        let Some(p) = c.pending.as_mut().filter(|p| p.header.is_none()) else {
            return Err(End::Hard(err(
                ReplyCode::UnexpectedFrame,
                "content header without a basic.publish before it",
            )));
        };
        if h.body_size > max {
            c.pending = None;
            let e = err(
                ReplyCode::PreconditionFailed,
                format!(
                    "message size {} is larger than configured max size {max}",
                    h.body_size
                ),
            );
            return Ok(Content::Refused(e.at_publish()));
        }
        let done = h.body_size == 0;
        p.header = Some(h);
        Ok(if done {
            Content::Complete
        } else {
            Content::More
        })
    }

    /// The channel a content frame is for: `None` while it is closing (the frame is
    /// ignored).
    fn content_chan(&mut self, ch: u16) -> Result<Option<&mut Channel>, End> {
        let Some(c) = self.channels.get_mut(&ch) else {
            return Err(End::Hard(err(
                ReplyCode::ChannelError,
                "expected 'channel.open'",
            )));
        };
        Ok((!c.closing).then_some(c))
    }

    /// A content body frame: `Content::Complete` when it ends the message.
    pub(super) fn content_body(&mut self, ch: u16, b: Bytes) -> Result<Content, End> {
        let Some(c) = self.content_chan(ch)? else {
            return Ok(Content::More);
        };
        let Some((p, size)) = c
            .pending
            .as_mut()
            .and_then(|p| p.header.as_ref().map(|h| h.body_size).map(|s| (p, s)))
        else {
            return Err(End::Hard(err(
                ReplyCode::UnexpectedFrame,
                "content body without a content header before it",
            )));
        };
        if p.body.len() as u64 + b.len() as u64 > size {
            return Err(End::Hard(err(
                ReplyCode::FrameError,
                format!("content body exceeds the {size} bytes its header announced"),
            )));
        }
        let n = b.len();
        p.body.push(b, usize::try_from(size).unwrap_or(usize::MAX));
        let full = p.body.len() as u64 == size;
        // Content held (this body, other channels', open transactions'): charged to the
        // memory budget, which may refuse it.
        self.held += n;
        if !self.input.cover(self.held) {
            return Err(End::Hard(err(
                ReplyCode::ResourceError,
                "the broker's memory budget has no room for this message",
            )));
        }
        Ok(if full {
            Content::Complete
        } else {
            Content::More
        })
    }

    /// What follows a content frame: nothing yet, the message published (or left to
    /// [`Conn::later`]: [`Conn::complete_now`]), or the channel closed.
    pub(super) fn content_done(
        &mut self,
        ch: u16,
        c: Content,
        session: &mut Session,
    ) -> Result<Option<Later>, End> {
        match c {
            Content::More => Ok(None),
            Content::Complete => self.complete_now(ch, session),
            Content::Refused(e) => {
                self.soft_close(ch, e, session);
                Ok(None)
            }
        }
    }

    /// A message whole on channel `ch`: published now when nothing waits for its route
    /// (no confirm mode, no transaction, not mandatory) and every subscriber takes it at
    /// once; otherwise left to [`Conn::later`] ([`Later::Complete`], or [`Later::Rest`] for
    /// the deliveries that found a full outbox or a queue group).
    fn complete_now(&mut self, ch: u16, session: &mut Session) -> Result<Option<Later>, End> {
        let Some(c) = self.channels.get_mut(&ch) else {
            return Ok(None);
        };
        if c.pending.is_none() {
            return Ok(None);
        }
        let waits = c.tx.is_some() || c.confirms.is_some();
        let Some(p) = c.pending.take_if(|p| !p.mandatory && !waits) else {
            return Ok(Some(Later::Complete(ch)));
        };
        let held = p.body.len();
        let Pending {
            exchange,
            routing_key,
            header,
            body,
            ..
        } = p;
        let r = self.prepare(&exchange, &routing_key, header, body, session);
        let msg = match r {
            Ok(Prepared { msg, routable, .. }) => routable.then_some(msg),
            Err(e) => {
                self.release_held(held);
                return self.publish_failed(ch, e, session).map(|()| None);
            }
        };
        let rest = msg.and_then(|msg| match session.publish_now(Batch::One(&msg)) {
            Ok(_) => None,
            Err(rest) => Some(Rest { rest, msg, held }),
        });
        match rest {
            Some(r) => Ok(Some(Later::Rest(Box::new(r)))),
            None => {
                self.release_held(held);
                Ok(None)
            }
        }
    }

    /// A publish refused: a hard error closes the connection, a soft one the channel.
    fn publish_failed(&mut self, ch: u16, e: AmqpError, session: &mut Session) -> Result<(), End> {
        if e.code.is_hard() {
            return Err(End::Hard(e));
        }
        self.soft_close(ch, e.at_publish(), session);
        Ok(())
    }

    /// Content no longer held (published, discarded).
    pub(super) fn release_held(&mut self, bytes: usize) {
        self.held = self.held.saturating_sub(bytes);
        self.input.shrink(self.held);
    }

    /// A publish with all its content: published now, or held by the transaction.
    pub(super) async fn complete(&mut self, ch: u16, session: &mut Session) -> Result<(), End> {
        let Some(c) = self.channels.get_mut(&ch) else {
            return Ok(());
        };
        let Some(p) = c.pending.take() else {
            return Ok(());
        };
        if let Some(tx) = &mut c.tx {
            if let Err(e) = tx_room(tx) {
                let n = p.body.len();
                self.release_held(n);
                self.soft_close(ch, e.at_publish(), session);
                return Ok(());
            }
            tx.push(TxOp::Publish(Box::new(p)));
            return Ok(());
        }
        let n = p.body.len();
        let r = self.publish(ch, p, session).await.map(drop);
        self.release_held(n);
        match r {
            Ok(()) => Ok(()),
            Err(e) => self.publish_failed(ch, e, session),
        }
    }

    /// Publishes one message: to the key of its exchange and routing key, where every
    /// binding and subscriber that covers it takes it. In confirm mode its confirm is
    /// counted (and sent once what stored it made it durable); in a transaction, what to
    /// wait for before commit-ok is returned.
    /// The checks of a publish to `exchange` with `routing_key` (the exchange exists and is
    /// not internal, direct reply-to is consumed, the user may publish to the key) and its
    /// message.
    fn prepare(
        &mut self,
        exchange: &ShortStr,
        routing_key: &ShortStr,
        header: Option<Box<ContentHeader>>,
        body: Body,
        session: &Session,
    ) -> Result<Prepared, AmqpError> {
        let name = || exchange.as_str().unwrap_or("");
        let Some(x) = self.exchange(exchange) else {
            return Err(err(
                ReplyCode::NotFound,
                format!(
                    "no exchange '{x}' in vhost '{vh}'",
                    x = name(),
                    vh = self.vhost.name
                ),
            ));
        };
        if x.internal {
            return Err(err(
                ReplyCode::AccessRefused,
                format!(
                    "cannot publish to internal exchange '{x}' in vhost '{vh}'",
                    x = name(),
                    vh = self.vhost.name
                ),
            ));
        }
        let header = header.unwrap_or_default();
        let props = &header.properties;
        let key = self.publish_key(exchange, x.kind, routing_key);
        let reply_to = match props
            .reply_to
            .as_ref()
            .filter(|r| r.as_str().is_some_and(|s| !s.is_empty()))
        {
            None => None,
            Some(r) if r.as_bytes() == REPLY_TO_QUEUE.as_bytes() => {
                if !self.own_reply_consumer() {
                    return Err(err(
                        ReplyCode::PreconditionFailed,
                        "fast reply consumer does not exist",
                    ));
                }
                if self.reply_key.is_none() {
                    self.reply_key = Key::new(&format!("{}/{REPLY_SUFFIX}", session.inbox())).ok();
                }
                self.reply_key.clone()
            }
            // A queue name of this vhost, or an inbox (of no vhost).
            Some(r) => self.publish_key(&ShortStr::default(), Kind::Direct, r),
        };
        let body = body.freeze();
        let (key, routable) = match key {
            Some(key) => {
                hayate_front::check_publish(&self.identity, &key, reply_to.is_some())
                    .map_err(|d| err(ReplyCode::AccessRefused, d.to_string()))?;
                (key, true)
            }
            // Not a valid key: routed nowhere. The key below only carries the content.
            None => (return_key(), false),
        };
        Ok(Prepared {
            kind: x.kind,
            msg: message_of(key, props, reply_to, body),
            routable,
        })
    }

    pub(super) async fn publish(
        &mut self,
        ch: u16,
        p: Pending,
        session: &mut Session,
    ) -> Result<Vec<Durable>, AmqpError> {
        let Pending {
            exchange,
            routing_key,
            mandatory,
            header,
            body,
        } = p;
        let Prepared {
            kind,
            msg,
            routable,
        } = self.prepare(&exchange, &routing_key, header, body, session)?;
        let mut routed = 0;
        let mut refused = false;
        let mut waits: Vec<Durable> = Vec::new();
        let (confirms, in_tx) = self
            .channels
            .get(&ch)
            .map_or((None, false), |c| (c.confirms.clone(), c.tx.is_some()));
        if routable {
            // Queues decide what they take as the broker offers it (a headers binding's
            // arguments, a route's hops, a key of another vhost under a `/` wildcard): a
            // mandatory publish is routed if a queue took it or something else was
            // delivered it (through a headers exchange, only a queue counts).
            if confirms.is_some() || in_tx || mandatory {
                let (n, r, streams) = session.publish_routed(Batch::One(&msg)).await;
                routed = if kind == Kind::Headers { r.queued } else { n };
                refused = r.refused;
                let stored = r.stored.into_iter().filter_map(|(s, o)| {
                    let s: std::sync::Arc<dyn std::any::Any + Send + Sync> = s;
                    Some((s.downcast::<hayate_broker::queue::store::Store>().ok()?, o))
                });
                // Durable queues' records and streams' appends, until durable.
                for (store, o) in stored {
                    if !store.is_durable(o) {
                        waits.push(Durable::Record(store, o));
                    }
                }
                match streams.ready() {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(conn = self.id, "amqp: publish not stored: {e}");
                        refused = true;
                    }
                    None => waits.push(Durable::Streams(streams)),
                }
            } else {
                routed = session.publish(Batch::One(&msg)).await;
            }
        }
        let returned = msg;
        if mandatory && routed == 0 {
            let frame_max = self.frame_max.load(Ordering::Relaxed);
            let m = Method::BasicReturn {
                reply_code: ReplyCode::NoRoute.code(),
                reply_text: ShortStr::lit("NO_ROUTE"),
                exchange,
                routing_key,
            };
            session.outbox().push_reply_unbudgeted(|o| {
                Frame::Method(ch, m).encode(o.tail());
                encode_content(ch, &returned, &self.vhost.prefix, frame_max, o);
            });
            session.mark_own_output();
        }
        let Some(cf) = confirms else {
            return Ok(waits);
        };
        count_publish(cf, refused, waits, session.outbox(), ch);
        Ok(Vec::new())
    }

    /// Exchange `name`, from the one-entry cache while no exchange was declared or deleted
    /// since it was read (a publisher sending to one exchange takes no registry lock).
    fn exchange(&mut self, name: &ShortStr) -> Option<Exchange> {
        let now = self.vhost.exchanges_changed.load(Ordering::Acquire);
        if let Some((at, n, x)) = &self.last_exchange
            && *at == now
            && n == name
        {
            return Some(x.clone());
        }
        let x = lock(&self.vhost.registry)
            .exchanges
            .get(name.as_str().unwrap_or(""))
            .cloned()?;
        self.last_exchange = Some((now, name.clone(), x.clone()));
        Some(x)
    }

    /// [`VHost::publish_key`] of exchange `x` (of type `kind`) and routing key `rk`,
    /// remembered for the connection's last [`PUBLISH_KEYS`] distinct ones ([`PublishKeys`]):
    /// a publisher sends to few keys (an RPC server answers each caller's reply-to), and
    /// computing one (escaping, checks, an allocation) costs more than comparing a few short
    /// names. A routing key no key can hold (not UTF-8, a control character) gives none:
    /// the vhost's `publish_key` says how (unroutable, or the `%!` stand-in of a fanout or
    /// headers exchange), as RabbitMQ takes any bytes there; a reply-to that cannot be a
    /// key is left out. No key the validator refuses is ever made (`Key` has no unchecked
    /// constructor).
    fn publish_key(&mut self, x: &ShortStr, kind: Kind, rk: &ShortStr) -> Option<Key> {
        let (xb, rb) = (x.as_bytes(), rk.as_bytes());
        if let Some(key) = self.publish_keys.get(xb, kind, rb) {
            return key.clone();
        }
        // A routing key that is not UTF-8 is one no key can hold (as a control character),
        // not the empty routing key.
        let key =
            self.vhost
                .publish_key(x.as_str().unwrap_or(""), kind, rk.as_str().unwrap_or("\0"));
        self.publish_keys.put(xb, kind, rb, key.clone());
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Option<Key> {
        Key::new(s).ok()
    }

    /// Hits by both names and the type; the split between the names counts; once full, a
    /// miss replaces the oldest entry and the rest stay.
    #[test]
    fn publish_keys_remember_the_last_distinct_targets() {
        let mut k = PublishKeys::default();
        k.put(b"ab", Kind::Direct, b"c", key("one"));
        assert_eq!(k.get(b"ab", Kind::Direct, b"c"), Some(&key("one")));
        assert_eq!(k.get(b"a", Kind::Direct, b"bc"), None);
        assert_eq!(k.get(b"ab", Kind::Topic, b"c"), None);
        for i in 1..PUBLISH_KEYS {
            k.put(
                b"",
                Kind::Direct,
                format!("q{i}").as_bytes(),
                key(&format!("q{i}")),
            );
        }
        assert_eq!(k.entries.len(), PUBLISH_KEYS);
        // Full: the next miss takes the oldest slot ("ab"/"c"), the others stay.
        k.put(b"", Kind::Direct, b"new", None);
        assert_eq!(k.entries.len(), PUBLISH_KEYS);
        assert_eq!(k.get(b"ab", Kind::Direct, b"c"), None);
        assert_eq!(k.get(b"", Kind::Direct, b"new"), Some(&None));
        assert_eq!(k.get(b"", Kind::Direct, b"q1"), Some(&key("q1")));
        k.clear();
        assert_eq!(k.get(b"", Kind::Direct, b"q1"), None);
    }
}
