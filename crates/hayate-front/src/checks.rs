//! What the front-ends share past the driver: each connection's subscription table and
//! stream-consumer memberships, and the permission checks every front-end subscribes,
//! publishes, consumes and calls the stream API through.

/// A connection's subscriptions as its protocol names them (an MQTT filter, a STOMP
/// subscription id), each with the broker subscription id it was given. Set the protocol's
/// options for a subscription before `Session::subscribe` (a delivery may arrive as soon as
/// the broker knows it), bind the name after it succeeded.
#[derive(Debug, Default)]
pub struct SubTable {
    ids: std::collections::HashMap<String, u32>,
    next: u32,
}

impl SubTable {
    /// The broker subscription id of `name`.
    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    /// Whether `name` is subscribed.
    pub fn contains(&self, name: &str) -> bool {
        self.ids.contains_key(name)
    }

    /// A broker subscription id not used yet on this connection.
    pub fn next_sid(&mut self) -> u32 {
        self.next = self.next.max(1);
        let sid = self.next;
        self.next += 1;
        sid
    }

    /// Binds `name` to `sid` (a restored subscription may bring its own id).
    pub fn bind(&mut self, name: String, sid: u32) {
        self.next = self.next.max(sid.saturating_add(1));
        self.ids.insert(name, sid);
    }

    /// Unbinds `name`; returns its broker subscription id.
    pub fn remove(&mut self, name: &str) -> Option<u32> {
        self.ids.remove(name)
    }
}

/// A connection's memberships of stream consumers, by broker subscription id: the task that
/// delivers each consumer's messages into the session's outbox, and the mapping of the
/// protocol's acknowledgements back to the consumers. Shared by every front-end that joins
/// consumers (native CONSUME, STOMP `/queue/` on a stream).
/// Most consumer memberships one connection may hold (each is a task).
pub const MAX_MEMBERSHIPS: usize = 256;

#[derive(Default)]
pub struct Memberships {
    members: std::collections::HashMap<u32, Member>,
}

struct Member {
    consumer: std::sync::Arc<hayate_broker::Consumer>,
    task: tokio::task::JoinHandle<()>,
    claimed: hayate_broker::stream::member::Claimed,
}

impl Memberships {
    /// Whether `sid` is a membership.
    pub fn contains(&self, sid: u32) -> bool {
        self.members.contains_key(&sid)
    }

    /// True when there is none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Joins `consumer` as subscription `sid` of `session`: acknowledged deliveries, or with
    /// `auto_ack` plain ones that count as acknowledged once queued for the socket.
    pub fn join(
        &mut self,
        session: &hayate_broker::Session,
        sid: u32,
        consumer: std::sync::Arc<hayate_broker::Consumer>,
        auto_ack: bool,
    ) {
        use hayate_broker::stream::member;
        let outbox = session.outbox().clone();
        if !auto_ack {
            outbox.set_acked(sid, true);
        }
        let claimed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(member::NONE));
        let task = tokio::spawn(member::run(
            consumer.clone(),
            session.broker().clone(),
            outbox,
            sid,
            member::Options {
                claimed: claimed.clone(),
                auto_ack,
            },
        ));
        self.members.insert(
            sid,
            Member {
                consumer,
                task,
                claimed,
            },
        );
    }

    /// Leaves the consumer of `sid`: its task stops (awaited: an aborted task may run on
    /// another thread until its next await), and what it held here goes back to the
    /// consumer for another member, at once.
    pub async fn leave(&mut self, session: &hayate_broker::Session, sid: u32) -> bool {
        use hayate_broker::stream::member;
        let Some(m) = self.members.remove(&sid) else {
            return false;
        };
        m.task.abort();
        let _ = m.task.await;
        let claimed = m.claimed.load(std::sync::atomic::Ordering::Acquire);
        if claimed != member::NONE {
            let (o, n) = member::unpack(claimed);
            m.consumer.give_back(o, n, std::time::Duration::ZERO);
        }
        for d in session.outbox().take_unacked(Some(sid)) {
            if let Some(o) = d.msg.attrs.stream_offset {
                m.consumer
                    .give_back(o, d.msg.attrs.deliveries, std::time::Duration::ZERO);
            }
        }
        session.outbox().set_acked(sid, false);
        // Saved now, not within 100 ms: this may be the consumer's last change for a while.
        if let Err(e) = m.consumer.persist_now() {
            tracing::warn!("saving consumer state: {e}");
        }
        true
    }

    /// Leaves every consumer (the connection ends).
    pub async fn leave_all(&mut self, session: &hayate_broker::Session) {
        let sids: Vec<u32> = self.members.keys().copied().collect();
        for sid in sids {
            self.leave(session, sid).await;
        }
    }

    /// Applies settled deliveries that belong to consumers (an ACK, or with `nack_delay` a
    /// NACK to be delivered again after that long); returns the others.
    pub fn settle(
        &self,
        settled: Vec<hayate_broker::Delivery>,
        nack_delay: Option<std::time::Duration>,
    ) -> Vec<hayate_broker::Delivery> {
        let mut rest = Vec::new();
        for d in settled {
            match (self.members.get(&d.sid), d.msg.attrs.stream_offset) {
                (Some(m), Some(o)) => match nack_delay {
                    None => m.consumer.ack(o),
                    Some(delay) => m.consumer.give_back(o, d.msg.attrs.deliveries, delay),
                },
                _ => rest.push(d),
            }
        }
        rest
    }
}

/// Why a subscription was refused.
#[derive(Debug)]
pub enum SubFail {
    /// The identity's permissions (or the inbox rule) do not allow it.
    Denied(crate::auth::Denied),
    /// The broker refused it (a duplicate id).
    Broker(hayate_broker::SubscribeError),
}

impl std::fmt::Display for SubFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubFail::Denied(d) => d.fmt(f),
            SubFail::Broker(e) => e.fmt(f),
        }
    }
}

/// Subscribes `session` through `who`'s permissions: refused, or subscribed with a guard
/// that keeps from it the keys its expression covers but `who` may not read. Every
/// front-end subscribes through this.
pub fn subscribe_checked(
    session: &mut hayate_broker::Session,
    who: &crate::auth::Identity,
    sid: u32,
    expr: hayate_core::KeyExpr,
    group: Option<&str>,
    qos: hayate_core::Qos,
) -> Result<(), SubFail> {
    let guard = who
        .access
        .check_subscribe(&expr, group.is_some(), session.inbox())
        .map_err(|d| {
            tracing::info!(
                user = who.name(),
                expr = expr.as_str(),
                "subscription refused: {d}"
            );
            SubFail::Denied(d)
        })?;
    session
        .subscribe_guarded(sid, expr, group, qos, guard)
        .map_err(SubFail::Broker)
}

/// May `who` publish `msg`? Logs a refusal. Every front-end publishes through this.
pub fn check_publish(
    who: &crate::auth::Identity,
    key: &hayate_core::Key,
    with_reply: bool,
) -> Result<(), crate::auth::Denied> {
    who.access.check_publish(key, with_reply).map_err(|d| {
        tracing::info!(
            user = who.name(),
            key = key.as_str(),
            "publish refused: {d}"
        );
        d
    })
}

/// The expressions a consumer delivers from: its filter, or each expression its stream
/// captures.
fn consumer_exprs(
    stream: &hayate_broker::StreamConfig,
    filter: Option<&str>,
) -> Vec<hayate_core::KeyExpr> {
    match filter.and_then(|f| hayate_core::KeyExpr::new(f).ok()) {
        Some(f) => vec![f],
        None => capture_exprs(stream),
    }
}

/// Each expression `stream` captures.
fn capture_exprs(stream: &hayate_broker::StreamConfig) -> Vec<hayate_core::KeyExpr> {
    stream
        .capture
        .iter()
        .filter_map(|c| hayate_core::KeyExpr::new(c).ok())
        .collect()
}

/// May `who` serve every key of every expression in `exprs`? (A consumer's deliveries are
/// not filtered per member: all of it must be allowed.)
fn serve_all(
    who: &crate::auth::Identity,
    exprs: &[hayate_core::KeyExpr],
) -> Result<(), crate::auth::Denied> {
    if who.access.is_revoked() {
        return Err(crate::auth::Denied::Revoked);
    }
    let access = who.access.current();
    let rule = &access.serve;
    if rule.is_open() {
        return Ok(());
    }
    match exprs.iter().find(|e| !rule.admits_all(e)) {
        None => Ok(()),
        Some(e) => Err(crate::auth::Denied::Rule {
            what: "serve",
            on: e.as_str().to_owned(),
        }),
    }
}

/// May `who` publish (without a reply-to) on every key of every expression in `exprs`?
fn publish_all(
    who: &crate::auth::Identity,
    exprs: &[hayate_core::KeyExpr],
) -> Result<(), crate::auth::Denied> {
    if who.access.is_revoked() {
        return Err(crate::auth::Denied::Revoked);
    }
    match exprs.iter().find(|e| !who.access.may_publish_all(e)) {
        None => Ok(()),
        Some(e) => Err(crate::auth::Denied::Rule {
            what: "publish",
            on: e.as_str().to_owned(),
        }),
    }
}

/// Is `who` the owner of `stream` (an owned stream, and its user)?
fn owns(who: &crate::auth::Identity, stream: &hayate_broker::StreamConfig) -> bool {
    stream.owner.is_some() && stream.owner.as_deref() == who.user.as_deref()
}

/// May `who` see `stream` through the API (`info`, `ls`, a consumer's `info` and `ls`): its
/// owner, or a user allowed to publish on, or to read, every key it captures. Others
/// cannot count what it holds.
fn may_see(who: &crate::auth::Identity, stream: &hayate_broker::StreamConfig) -> bool {
    owns(who, stream)
        || capture_exprs(stream)
            .iter()
            .all(|e| who.access.may_publish_all(e) || who.access.may_read_all(e, false))
}

/// May `who` serve everything a consumer with `filter` on `stream` delivers? (A consumer's
/// deliveries are not filtered per member: all of it must be allowed.)
fn check_serve_all(
    who: &crate::auth::Identity,
    stream: &hayate_broker::StreamConfig,
    filter: Option<&str>,
) -> Result<(), crate::auth::Denied> {
    serve_all(who, &consumer_exprs(stream, filter)).inspect_err(|d| {
        tracing::info!(
            user = who.name(),
            stream = stream.name.as_str(),
            "consume refused: {d}"
        );
    })
}

/// May `who` join `consumer` (a work queue: serving)? It must be the consumer's owner if
/// it has one, and be allowed to serve the consumer's filter, or each expression its
/// stream captures.
pub fn check_consume(
    who: &crate::auth::Identity,
    stream: &hayate_broker::Stream,
    consumer: &hayate_broker::Consumer,
) -> Result<(), crate::auth::Denied> {
    let cfg = consumer.config();
    if let Some(owner) = &cfg.owner
        && who.user.as_deref() != Some(owner.as_str())
    {
        return Err(crate::auth::Denied::Owner {
            what: format!("consumer {}/{}", cfg.stream, cfg.name),
            owner: owner.clone(),
        });
    }
    check_serve_all(who, stream.config(), cfg.filter.as_deref())
}

/// May `who` make the stream API request published on `key` (after `$hayate/api/`) with
/// `body`? Checked against `who`'s permissions (the broker checks owners and limits
/// itself; docs/security.md, *The stream API*):
///
/// - `stream/add`: `publish` on every key the stream would capture (a user cannot make a
///   stream keep, count and purge other users' messages, nor slow their publishing with
///   an `always` stream on `**`);
/// - `stream/rm`, `stream/purge` of a stream without an owner: `publish` on all it
///   captures;
/// - `stream/info`, `consumer/info`, `consumer/ls`: the stream must be one `who` may see
///   (its owner, or allowed to publish on or read all it captures);
/// - `consumer/add`: `serve` on what the consumer delivers (its filter, or all the stream
///   captures); on a stream `who` does not own, `serve` on all the stream captures
///   whatever the filter (or a user could fill another's stream with consumers, and hold
///   back its work-queue retention); a dead-letter stream must be `who`'s own, or one
///   without an owner on all of whose keys `who` may publish;
/// - `consumer/rm`: `serve` on what the consumer delivers.
///
/// A body that does not parse, or a stream that does not exist, is left to the API to
/// answer.
pub fn check_stream_api(
    who: &crate::auth::Identity,
    broker: &hayate_broker::Broker,
    key: &str,
    body: &[u8],
) -> Result<(), crate::auth::Denied> {
    use hayate_broker::stream::api::{CONSUMER_API, NameRequest, STREAM_API};
    let r = if let Some(op) = key.strip_prefix(CONSUMER_API) {
        check_consumer_op(who, broker, op, body)
    } else if let Some(op) = key.strip_prefix(STREAM_API) {
        let named = || {
            serde_json::from_slice::<NameRequest>(body)
                .ok()
                .and_then(|n| broker.stream(&n.name))
        };
        match op {
            "add" => match serde_json::from_slice::<hayate_broker::StreamConfig>(body) {
                Ok(c) => publish_all(who, &capture_exprs(&c)),
                Err(_) => Ok(()),
            },
            "rm" | "purge" => match named() {
                // An owned stream: the broker lets only its owner.
                Some(s) if s.config().owner.is_none() => {
                    publish_all(who, &capture_exprs(s.config()))
                }
                _ => Ok(()),
            },
            "info" => match named() {
                Some(s) => visible(who, s.config()),
                None => Ok(()),
            },
            _ => Ok(()),
        }
    } else {
        Ok(())
    };
    r.inspect_err(|d| {
        tracing::info!(
            user = who.name(),
            api = key,
            "stream API request refused: {d}"
        );
    })
}

/// Refuses `who` a stream it may not see ([`may_see`]).
fn visible(
    who: &crate::auth::Identity,
    stream: &hayate_broker::StreamConfig,
) -> Result<(), crate::auth::Denied> {
    if may_see(who, stream) {
        return Ok(());
    }
    Err(crate::auth::Denied::Rule {
        what: "publish or subscribe",
        on: stream.capture.join(", "),
    })
}

fn check_consumer_op(
    who: &crate::auth::Identity,
    broker: &hayate_broker::Broker,
    op: &str,
    body: &[u8],
) -> Result<(), crate::auth::Denied> {
    use hayate_broker::stream::api::{ConsumerRequest, NameRequest};
    match op {
        "add" => {
            let Ok(c) = serde_json::from_slice::<hayate_broker::ConsumerConfig>(body) else {
                return Ok(()); // the API answers a bad body itself
            };
            let Some(s) = broker.stream(&c.stream) else {
                return Ok(()); // the API says there is no such stream
            };
            check_serve_all(who, s.config(), c.filter.as_deref())?;
            if !owns(who, s.config()) {
                serve_all(who, &capture_exprs(s.config()))?;
            }
            if let Some(t) = c.dead_letter.as_deref().and_then(|d| broker.stream(d)) {
                let t = t.config();
                match &t.owner {
                    Some(o) if who.user.as_deref() != Some(o.as_str()) => {
                        return Err(crate::auth::Denied::Owner {
                            what: format!("dead-letter stream {}", t.name),
                            owner: o.clone(),
                        });
                    }
                    Some(_) => {}
                    None => publish_all(who, &capture_exprs(t))?,
                }
            }
            Ok(())
        }
        "rm" => match serde_json::from_slice::<ConsumerRequest>(body) {
            Ok(r) => match broker.stream(&r.stream) {
                Some(s) => {
                    let filter = s.consumer(&r.name).and_then(|c| c.config().filter.clone());
                    check_serve_all(who, s.config(), filter.as_deref())
                }
                None => Ok(()),
            },
            Err(_) => Ok(()),
        },
        "info" => match serde_json::from_slice::<ConsumerRequest>(body) {
            Ok(r) => match broker.stream(&r.stream) {
                Some(s) => visible(who, s.config()),
                None => Ok(()),
            },
            Err(_) => Ok(()),
        },
        "ls" => match serde_json::from_slice::<NameRequest>(body) {
            Ok(r) => match broker.stream(&r.name) {
                Some(s) => visible(who, s.config()),
                None => Ok(()),
            },
            Err(_) => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Keeps from a stream API reply what `who` may not see: `stream/ls` lists only the
/// streams it may see ([`may_see`]).
pub fn filter_stream_api_reply(
    who: &crate::auth::Identity,
    key: &str,
    reply: &mut hayate_broker::stream::api::ApiReply,
) {
    if key.strip_prefix(hayate_broker::stream::api::STREAM_API) == Some("ls")
        && let Some(list) = &mut reply.streams
    {
        list.retain(|i| may_see(who, &i.config));
    }
}

/// FNV-1a of `s`: a hash that is the same in every run and build, for names kept on disk
/// (a STOMP durable queue's consumer, an AMQP vhost's directory) that had to be cut.
pub fn stable_hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
