//! The permission checks every front-end subscribes, publishes, joins consumers and calls
//! the stream API through.

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
