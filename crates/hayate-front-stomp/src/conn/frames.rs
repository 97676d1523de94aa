//! The frames of a connection: the first must be CONNECT (see `handshake`); then SEND,
//! SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, the transactions (BEGIN, COMMIT, ABORT) and
//! DISCONNECT, with the destinations they name (topics, queues, temp-queues).

use bytes::Bytes;
use std::sync::Arc;

use hayate_broker::queue::{ImplicitError, Queue};
use hayate_broker::{Batch, Session, Settle};
use hayate_core::{INBOX_PREFIX, Key, KeyExpr, Message, Qos};
use hayate_stomp::{Command, Frame, Version};

use super::{Conn, Refusal, refuse};
use crate::delivery::{AckMode, Kind, Sub};
use hayate_core::sync::lock;

/// Queues one connection may declare (`/queue/<name>` sent to or subscribed), at most.
pub(crate) const MAX_DECLARED: usize = 1024;

/// Open transactions per connection, at most.
pub(crate) const MAX_TRANSACTIONS: usize = 64;

/// Bytes the open transactions of one connection may hold, at most (also within the
/// broker-wide memory budget).
pub(crate) const MAX_TX_BYTES: usize = 64 << 20;

/// What a frame buffered in a transaction holds: its body and headers, and a little for the
/// rest.
pub(crate) fn tx_cost(f: &Frame) -> usize {
    f.body.len()
        + f.headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 48)
            .sum::<usize>()
        + 64
}

/// Headers of a SEND that are the frame's, not the message's.
fn is_frame_header(name: &str) -> bool {
    matches!(
        name,
        "destination"
            | "content-length"
            | "receipt"
            | "transaction"
            | "reply-to"
            | "correlation-id"
            | "message-id"
            | "subscription"
            | "ack"
    )
}

impl Conn<'_> {
    /// Handles one frame; `Ok(false)` ends the connection (DISCONNECT).
    pub(super) async fn handle(
        &mut self,
        f: Frame,
        session: &mut Session,
    ) -> Result<bool, Refusal> {
        if !self.connected {
            return match f.command {
                Command::Connect | Command::Stomp => {
                    self.connect(&f, session).await?;
                    Ok(true)
                }
                other => Err(refuse(
                    "not connected",
                    format!(
                        "the first frame must be CONNECT or STOMP, not {}",
                        other.as_str()
                    ),
                )),
            };
        }
        match f.command {
            Command::Send | Command::Ack | Command::Nack if f.get("transaction").is_some() => {
                let t = f.get("transaction").unwrap_or_default().to_string();
                if !self.tx.contains_key(&t) {
                    return Err(refuse(
                        "unknown transaction",
                        format!("no transaction {t:?} was begun"),
                    ));
                }
                // What transactions hold is bounded per connection and charged to the
                // memory budget; the body is copied, not left pinning the read buffer.
                let held = self.tx_bytes + tx_cost(&f);
                if held > MAX_TX_BYTES || !self.tx_charge.cover(held) {
                    return Err(refuse(
                        "transaction too large",
                        format!(
                            "the open transactions would hold {held} bytes (at most \
                             {MAX_TX_BYTES}, within the broker's memory budget)"
                        ),
                    ));
                }
                self.tx_bytes = held;
                let mut f = f;
                f.body = Bytes::copy_from_slice(&f.body);
                if let Some(frames) = self.tx.get_mut(&t) {
                    frames.push(f);
                }
            }
            Command::Send => {
                let wait = f.get("receipt").is_some();
                self.send(&f, session, wait).await?;
            }
            Command::Subscribe => self.subscribe(&f, session)?,
            Command::Unsubscribe => self.unsubscribe(&f, session).await?,
            Command::Ack => self.ack(&f, session, false).await?,
            Command::Nack => self.ack(&f, session, true).await?,
            Command::Begin => {
                let t = tx_name(&f)?;
                if self.tx.contains_key(&t) {
                    return Err(refuse(
                        "transaction exists",
                        format!("transaction {t:?} was already begun"),
                    ));
                }
                if self.tx.len() >= MAX_TRANSACTIONS {
                    return Err(refuse(
                        "too many transactions",
                        format!("at most {MAX_TRANSACTIONS} open transactions per connection"),
                    ));
                }
                self.tx.insert(t, Vec::new());
            }
            Command::Commit => {
                let frames = self.end_tx(&f)?;
                // A receipt for the COMMIT comes once every SEND in it is stored.
                let wait = f.get("receipt").is_some();
                for f in frames {
                    match f.command {
                        Command::Send => self.send(&f, session, wait).await?,
                        Command::Ack => self.ack(&f, session, false).await?,
                        Command::Nack => self.ack(&f, session, true).await?,
                        _ => {}
                    }
                }
            }
            Command::Abort => {
                self.end_tx(&f)?;
            }
            Command::Disconnect => return Ok(false),
            Command::Connect | Command::Stomp => {
                return Err(refuse("already connected", "a second CONNECT"));
            }
            other => {
                return Err(refuse(
                    "unexpected frame",
                    format!("a client may not send {}", other.as_str()),
                ));
            }
        }
        Ok(true)
    }

    /// The key a SEND destination names.
    fn send_key(&mut self, dest: &str, session: &mut Session) -> Result<Key, Refusal> {
        let key = |k: &str| {
            Key::new(k).map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))
        };
        if let Some(k) = dest.strip_prefix("/topic/") {
            key(k)
        } else if let Some(q) = dest.strip_prefix("/queue/") {
            key(q)
        } else if let Some(t) = dest.strip_prefix("/temp-queue/") {
            self.temp_key(t, session)
        } else {
            Err(refuse(
                "unknown destination",
                format!(
                    "{dest:?}: destinations are /topic/<key>, /queue/<name> or /temp-queue/<name>"
                ),
            ))
        }
    }

    /// A transaction's frames are no longer held (committed or aborted).
    /// Ends the transaction a COMMIT or ABORT names: its frames, taken out and no longer
    /// counted against the connection's transaction bytes.
    fn end_tx(&mut self, f: &Frame) -> Result<Vec<Frame>, Refusal> {
        let t = tx_name(f)?;
        let Some(frames) = self.tx.remove(&t) else {
            return Err(refuse(
                "unknown transaction",
                format!("no transaction {t:?} was begun"),
            ));
        };
        self.release_tx(&frames);
        Ok(frames)
    }

    /// Records subscription `sid` in the delivery state, which MESSAGE frames are encoded
    /// from.
    fn track_sub(&self, sid: u32, id: &str, dest: &str, ack: AckMode, kind: Kind) {
        lock(&self.out).subs.insert(
            sid,
            Sub {
                id: id.to_string(),
                destination: dest.to_string(),
                ack,
                kind,
            },
        );
    }

    fn release_tx(&mut self, frames: &[Frame]) {
        let n: usize = frames.iter().map(tx_cost).sum();
        self.tx_bytes = self.tx_bytes.saturating_sub(n);
        self.tx_charge.shrink(self.tx_bytes);
    }

    /// Refused unless this user may serve all of queue `q` (`expr`): what a queue's member
    /// does, durable or not. A guard (which every configured user's subscription gets, so a
    /// later reload can narrow it) is no refusal: the rules as they are now must admit all of
    /// the queue's key, as for an AMQP consumer. The subscription then keeps the guard.
    fn may_serve(&self, q: &str, expr: &KeyExpr, session: &Session) -> Result<(), Refusal> {
        let access = &self.identity.access;
        let allowed = match access.check_subscribe(expr, true, session.inbox()) {
            Ok(None) => true,
            Ok(Some(_)) => access.may_read_all(expr, true),
            Err(_) => false,
        };
        match allowed {
            true => Ok(()),
            false => {
                let d = hayate_front::auth::Denied::Rule {
                    what: "serve",
                    on: q.to_owned(),
                };
                tracing::info!(user = self.identity.name(), "subscription refused: {d}");
                Err(refuse("access refused", d.to_string()))
            }
        }
    }

    /// Queue `name` of the broker (`""` namespace: AMQP vhost `/`'s and the native
    /// protocol's too), made implicitly at its first use (messages wait for a consumer);
    /// at most [`MAX_DECLARED`] names per connection. Inbox keys are no queues (`None`);
    /// another connection's exclusive (AMQP) queue is refused to a consumer, `None` to a
    /// publisher (its message still reaches the queue through its key).
    fn declare(
        &mut self,
        name: &str,
        consume: bool,
        session: &mut Session,
    ) -> Result<Option<Arc<Queue>>, Refusal> {
        if name.starts_with(INBOX_PREFIX) {
            return Ok(None);
        }
        if !self.declared.contains(name) && self.declared.len() >= MAX_DECLARED {
            return Err(refuse(
                "too many queues",
                format!("at most {MAX_DECLARED} queues declared per connection"),
            ));
        }
        let key = Key::new(name)
            .map_err(|e| refuse("invalid destination", format!("/queue/{name}: {e}")))?;
        let q = match session.broker().queue_implicit(&key) {
            Ok((q, _)) => q,
            Err(ImplicitError::Exclusive) if !consume => return Ok(None),
            Err(e @ ImplicitError::TooMany(_)) => {
                return Err(refuse("too many queues", format!("/queue/{name}: {e}")));
            }
            Err(e) => return Err(refuse("queue refused", format!("/queue/{name}: {e}"))),
        };
        self.declared.insert(name.to_string());
        Ok(Some(q))
    }

    /// The key of this connection's temp-queue `name`, subscribing the temp-queues first.
    fn temp_key(&mut self, name: &str, session: &mut Session) -> Result<Key, Refusal> {
        let prefix = lock(&self.out).temp_prefix.clone();
        let k = Key::new(&format!("{prefix}{name}"))
            .map_err(|e| refuse("invalid destination", format!("/temp-queue/{name}: {e}")))?;
        if self.temp_sid.is_none() {
            let sid = self.subs.next_sid();
            lock(&self.out).subs.insert(
                sid,
                Sub {
                    id: String::new(),
                    destination: String::new(),
                    ack: AckMode::Auto,
                    kind: Kind::Temp,
                },
            );
            let expr = KeyExpr::new(&format!("{prefix}**"))
                .map_err(|e| refuse("internal error", e.to_string()))?;
            session
                .subscribe(sid, expr, None, Qos::default())
                .map_err(|e| refuse("internal error", e.to_string()))?;
            self.temp_sid = Some(sid);
        }
        Ok(k)
    }

    /// Publishes a SEND. With `wait` (the frame, or the COMMIT that carries it, asked for a
    /// receipt), returns only once the streams capturing the destination keep the message
    /// durably, so the RECEIPT confirms it; a storage failure is an ERROR (no receipt).
    async fn send(&mut self, f: &Frame, session: &mut Session, wait: bool) -> Result<(), Refusal> {
        let dest = f
            .get("destination")
            .ok_or_else(|| refuse("missing destination", "SEND needs a destination header"))?;
        let key = self.send_key(dest, session)?;
        hayate_front::check_publish(&self.identity, &key, f.get("reply-to").is_some())
            .map_err(|d| refuse("access refused", d.to_string()))?;
        // A queue is made (messages wait for a consumer) only by a publish allowed to reach
        // it; one whose key a stream captures is that stream's (durable), with no queue in
        // memory. The message enters it through its binding to its key.
        if let Some(q) = dest.strip_prefix("/queue/")
            && durable_stream(session, &key).is_none()
        {
            self.declare(q, false, session)?;
        }
        let mut msg = Message::new(key, f.body.clone());
        if let Some(r) = f.get("reply-to") {
            msg.reply_to = Some(if let Some(t) = r.strip_prefix("/temp-queue/") {
                self.temp_key(t, session)?
            } else if let Some(k) = r
                .strip_prefix("/queue/")
                .or_else(|| r.strip_prefix("/topic/"))
            {
                Key::new(k).map_err(|e| refuse("invalid reply-to", format!("{r:?}: {e}")))?
            } else {
                return Err(refuse(
                    "invalid reply-to",
                    format!("{r:?}: use /temp-queue/<name>, /queue/<name> or /topic/<key>"),
                ));
            });
        }
        if let Some(c) = f.get("correlation-id") {
            msg.correlation_id = Some(crate::delivery::correlation_bytes(c));
        }
        let mut headers: Vec<(String, Bytes)> = Vec::new();
        for (k, v) in &f.headers {
            // The first of repeated headers wins (STOMP 1.2).
            if !is_frame_header(k) && !headers.iter().any(|(n, _)| n == k) {
                headers.push((k.clone(), Bytes::copy_from_slice(v.as_bytes())));
            }
        }
        if !headers.is_empty() {
            msg.headers = Some(headers);
        }
        let (_, stored) = session.publish_stored(Batch::One(&msg)).await;
        if wait && !stored.is_empty() {
            let r = match stored.ready() {
                Some(r) => r,
                None => stored.confirmed().await,
            };
            r.map_err(|why| refuse("message not stored", why))?;
        }
        Ok(())
    }

    fn subscribe(&mut self, f: &Frame, session: &mut Session) -> Result<(), Refusal> {
        let dest = f.get("destination").ok_or_else(|| {
            refuse(
                "missing destination",
                "SUBSCRIBE needs a destination header",
            )
        })?;
        let id = match f.get("id") {
            Some(id) => id.to_string(),
            None if self.version == Version::V1_0 => dest.to_string(),
            None => return Err(refuse("missing id", "SUBSCRIBE needs an id header")),
        };
        if self.subs.contains(&id) {
            return Err(refuse(
                "duplicate subscription",
                format!("subscription id {id:?} is in use"),
            ));
        }
        let ack = match f.get("ack").unwrap_or("auto") {
            "auto" => AckMode::Auto,
            "client" => AckMode::Client,
            "client-individual" => AckMode::ClientIndividual,
            a => {
                return Err(refuse(
                    "invalid ack mode",
                    format!("ack {a:?}: use auto, client or client-individual"),
                ));
            }
        };
        let (expr, kind, group) = if let Some(e) = dest.strip_prefix("/topic/") {
            let expr = KeyExpr::new(e)
                .map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
            (expr, Kind::Topic, None)
        } else if let Some(q) = dest.strip_prefix("/queue/") {
            let k =
                Key::new(q).map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
            if let Some(stream) = durable_stream(session, &k) {
                return self.subscribe_durable(&stream, q, id, dest, ack, session);
            }
            let expr = KeyExpr::new(q)
                .map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
            // The member of a queue serves its key: checked before the queue is made.
            self.may_serve(q, &expr, session)?;
            if let Some(queue) = self.declare(q, true, session)? {
                return self.subscribe_queue(f, queue, id, dest, ack, session);
            }
            // A reply inbox (`/queue/_inbox/...`): a subscription, never a queue.
            (
                expr.clone(),
                Kind::Queue {
                    name: q.to_string(),
                    expr,
                },
                Some(q.to_string()),
            )
        } else if let Some(t) = dest.strip_prefix("/temp-queue/") {
            self.temp_key(t, session)?;
            let max = session.broker().config().max_subscriptions;
            let mut out = lock(&self.out);
            if max > 0 && out.temp_ids.len() >= max && !out.temp_ids.contains_key(t) {
                return Err(refuse(
                    "too many subscriptions",
                    format!("at most {max} temp-queue subscriptions (limits.max_subscriptions)"),
                ));
            }
            out.temp_ids.insert(t.to_string(), id.clone());
            drop(out);
            if let Some(sid) = self.temp_sid {
                self.subs.bind(id, sid);
            }
            return Ok(());
        } else {
            return Err(refuse(
                "unknown destination",
                format!(
                    "{dest:?}: destinations are /topic/<expr>, /queue/<name> or /temp-queue/<name>"
                ),
            ));
        };
        let sid = self.subs.next_sid();
        // Options first: the queue's waiting messages are delivered by `subscribe`.
        self.track_sub(sid, &id, dest, ack, kind);
        let qos = if ack == AckMode::Auto {
            Qos::default()
        } else {
            Qos::ACKED
        };
        if let Err(e) = hayate_front::subscribe_checked(
            session,
            &self.identity,
            sid,
            expr,
            group.as_deref(),
            qos,
        ) {
            lock(&self.out).subs.remove(&sid);
            return Err(match e {
                hayate_front::SubFail::Denied(d) => refuse("access refused", d.to_string()),
                hayate_front::SubFail::Broker(e) => refuse("subscribe failed", e.to_string()),
            });
        }
        self.subs.bind(id, sid);
        Ok(())
    }

    /// SUBSCRIBE to `/queue/<q>` in memory: a consumer of the broker's queue `q` (`ack:auto`:
    /// settled as written; otherwise at most `prefetch-count` unacknowledged, by default
    /// and at most `limits.max_unacked`).
    fn subscribe_queue(
        &mut self,
        f: &Frame,
        queue: Arc<Queue>,
        id: String,
        dest: &str,
        ack: AckMode,
        session: &mut Session,
    ) -> Result<(), Refusal> {
        let max = session.broker().config().max_subscriptions;
        if max > 0 && self.members.len() >= max {
            return Err(refuse(
                "too many subscriptions",
                format!("at most {max} queue subscriptions (limits.max_subscriptions)"),
            ));
        }
        let prefetch = prefetch(f, session.broker().config().max_unacked)?;
        let sid = self.subs.next_sid();
        let q = queue.name().to_string();
        let expr = KeyExpr::new(&q)
            .map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
        self.track_sub(sid, &id, dest, ack, Kind::Queue { name: q, expr });
        if !self
            .members
            .join_queue(session, sid, queue, ack == AckMode::Auto, prefetch)
        {
            lock(&self.out).subs.remove(&sid);
            return Err(refuse(
                "subscribe failed",
                format!("{dest:?}: the queue is gone or has an exclusive consumer"),
            ));
        }
        session.mark_own_output();
        self.subs.bind(id, sid);
        Ok(())
    }

    /// SUBSCRIBE to `/queue/<q>` whose key stream `stream` captures: joins the stream's
    /// consumer for the queue (`stomp-<q>`, created on first use: from the first record, the
    /// queue's key as filter), so every member of the queue, on any connection, shares it and
    /// its messages survive restarts until acknowledged.
    fn subscribe_durable(
        &mut self,
        stream: &hayate_broker::Stream,
        q: &str,
        id: String,
        dest: &str,
        ack: AckMode,
        session: &mut Session,
    ) -> Result<(), Refusal> {
        if self.members.len() >= hayate_front::MAX_MEMBERSHIPS {
            return Err(refuse(
                "too many durable queue subscriptions",
                format!("at most {} per connection", hayate_front::MAX_MEMBERSHIPS),
            ));
        }
        // A durable queue member serves the queue's key: the same permission as an
        // in-memory queue's.
        let qexpr =
            KeyExpr::new(q).map_err(|e| refuse("invalid destination", format!("{dest:?}: {e}")))?;
        self.may_serve(q, &qexpr, session)?;
        // One made beforehand (through the API, with its own settings) is used as it is.
        let name = queue_consumer_name(q);
        let consumer = match stream.consumer(&name) {
            Some(c) => c,
            None => {
                let mut cfg = hayate_broker::ConsumerConfig::new(stream.name(), &name);
                cfg.filter = Some(q.to_owned());
                // Unowned (a shared queue), but counted against its maker's
                // `limits.max_consumers_per_user`, as one made through the API: otherwise
                // SUBSCRIBEs to distinct queue names fill a stream's consumers.
                cfg.creator = self.identity.user.as_deref().map(str::to_owned);
                session
                    .broker()
                    .create_consumer(cfg)
                    .map_err(|e| refuse("subscribe failed", e.to_string()))?
                    .0
            }
        };
        hayate_front::check_consume(&self.identity, stream, &consumer)
            .map_err(|d| refuse("access refused", d.to_string()))?;
        let sid = self.subs.next_sid();
        let kind = Kind::Queue {
            name: q.to_string(),
            expr: qexpr,
        };
        self.track_sub(sid, &id, dest, ack, kind);
        self.members
            .join(session, sid, consumer, ack == AckMode::Auto);
        self.subs.bind(id, sid);
        Ok(())
    }

    async fn unsubscribe(&mut self, f: &Frame, session: &mut Session) -> Result<(), Refusal> {
        let id = f
            .get("id")
            .or_else(|| {
                f.get("destination")
                    .filter(|_| self.version == Version::V1_0)
            })
            .ok_or_else(|| refuse("missing id", "UNSUBSCRIBE needs an id header"))?;
        let Some(sid) = self.subs.remove(id) else {
            return Err(refuse(
                "unknown subscription",
                format!("no subscription {id:?}"),
            ));
        };
        if Some(sid) == self.temp_sid {
            lock(&self.out).temp_ids.retain(|_, v| v != id);
            return Ok(());
        }
        if self.members.contains(sid) {
            self.members.leave(session, sid).await;
            lock(&self.out).subs.remove(&sid);
            return Ok(());
        }
        // Unacknowledged messages go to other consumers of the queue first (they need the
        // subscription's group).
        session.release_unacked(Some(sid)).await;
        session.unsubscribe(sid);
        lock(&self.out).subs.remove(&sid);
        Ok(())
    }

    async fn ack(&mut self, f: &Frame, session: &mut Session, nack: bool) -> Result<(), Refusal> {
        let name = if self.version == Version::V1_2 {
            "id"
        } else {
            "message-id"
        };
        let id = f.get(name).ok_or_else(|| {
            refuse(
                "missing id",
                format!(
                    "{} needs an {name} header",
                    if nack { "NACK" } else { "ACK" }
                ),
            )
        })?;
        if id.starts_with('a') && id[1..].parse::<u64>().is_ok() {
            return Ok(()); // a message of an `auto` subscription: nothing to settle
        }
        let Ok(n) = id.parse::<u64>() else {
            return Err(refuse(
                "unknown message",
                format!("{name} {id:?} was not delivered here"),
            ));
        };
        // `client` mode settles every earlier message of the subscription too.
        let Some(sid) = session.outbox().delivery_sid(n) else {
            return Ok(()); // already settled (a cumulative ACK covered it)
        };
        let how = match lock(&self.out).subs.get(&sid).map(|s| s.ack) {
            Some(AckMode::Client) => Settle::ThroughSubscription,
            _ => Settle::One,
        };
        // A NACK takes them all back before the window is filled again (`give_back_all`
        // fills it): given back in their original order, ahead of what waits.
        let settled = if nack {
            session.outbox().settle_back(n, how)
        } else {
            session.outbox().settle(n, how)
        };
        session.mark_own_output();
        // A durable queue's messages are settled with its consumer (a NACK: delivered again).
        let settled = self
            .members
            .settle(settled, nack.then_some(std::time::Duration::ZERO));
        if nack {
            session.give_back_all(settled, true).await;
        }
        Ok(())
    }
}

/// A queue SUBSCRIBE's `prefetch-count`: most unacknowledged deliveries, at most `most`
/// (`limits.max_unacked`), which is also what it is without the header or with 0.
fn prefetch(f: &Frame, most: usize) -> Result<usize, Refusal> {
    let most = most.max(1);
    let Some(p) = f.get("prefetch-count") else {
        return Ok(most);
    };
    match p.trim().parse::<usize>() {
        Ok(0) => Ok(most),
        Ok(n) => Ok(n.min(most)),
        Err(_) => Err(refuse(
            "invalid prefetch-count",
            format!("prefetch-count {p:?}: a number of messages"),
        )),
    }
}

fn tx_name(f: &Frame) -> Result<String, Refusal> {
    f.get("transaction").map(str::to_string).ok_or_else(|| {
        refuse(
            "missing transaction",
            format!("{} needs a transaction header", f.command.as_str()),
        )
    })
}

/// The stream whose capture makes `/queue/<key>` durable (the first by name), if any.
fn durable_stream(session: &Session, key: &Key) -> Option<std::sync::Arc<hayate_broker::Stream>> {
    if key.as_str().starts_with(INBOX_PREFIX) {
        return None;
    }
    session
        .broker()
        .streams()
        .into_iter()
        .find(|s| s.captures(key))
}

/// The consumer name of durable queue `q`: `stomp-` and the name with characters a consumer
/// name may not hold replaced, cut to fit, and a hash of the whole name when anything was
/// replaced or cut (so two queues never share a consumer).
fn queue_consumer_name(q: &str) -> String {
    let clean: String = q
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean == q && q.len() <= 58 {
        return format!("{}{q}", crate::QUEUE_CONSUMER_PREFIX);
    }
    // Stable across runs: the name is stored with the consumer.
    let h = hayate_front::stable_hash(q);
    let cut: String = clean.chars().take(40).collect();
    format!("{}{cut}-{:016x}", crate::QUEUE_CONSUMER_PREFIX, h)
}
